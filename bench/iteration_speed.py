"""Time one parity training iteration: this library against the seeds' formulation.

Both run in this process, interleaved, on the issue's shapes: n_elems 15, max_steps 20,
batch 128, hidden 64, CPU, 2 threads. The baseline (`bench/seeds_baseline.py`) builds
samples one at a time through a DataLoader, computes p as a product, loops over steps in
the reconstruction loss and takes ``KLDivLoss(p.log(), p_g)``. Prints both medians and, as
its last line, ``speedup <baseline median / ours>``.

    .venv/bin/python bench/iteration_speed.py [--iterations 300] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from seeds_baseline import SeedsTrainer

from ponder import ParityConfig, Trainer

SHAPES = {"n_elems": 15, "max_steps": 20, "batch_size": 128, "n_hidden": 64}


def timed(step: Callable[[], object], n: int) -> list[float]:
    """Seconds per call, ``n`` calls."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=300, help="timed iterations of each, in rounds")
    parser.add_argument("--warmup", type=int, default=30, help="untimed iterations of each first")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    ours = Trainer(ParityConfig(**SHAPES, lr=3e-4, device="cpu"))
    seeds = SeedsTrainer(**SHAPES, lambda_p=0.2, beta=0.01, lr=3e-4)
    timed(ours.train_step, args.warmup)
    timed(seeds.step, args.warmup)

    # interleave rounds so that a busy moment of the machine hits both alike
    rounds = 10
    ours_t: list[float] = []
    seeds_t: list[float] = []
    for _ in range(rounds):
        ours_t += timed(ours.train_step, args.iterations // rounds)
        seeds_t += timed(seeds.step, args.iterations // rounds)

    ours_ms = statistics.median(ours_t) * 1e3
    seeds_ms = statistics.median(seeds_t) * 1e3
    print(f"shapes: {SHAPES}, CPU, {torch.get_num_threads()} threads, {len(ours_t)} iterations each")
    print(f"seeds' formulation  median {seeds_ms:7.2f} ms/iteration")
    print(f"ponder              median {ours_ms:7.2f} ms/iteration")
    print(f"speedup {seeds_ms / ours_ms:.2f}")


if __name__ == "__main__":
    main()
