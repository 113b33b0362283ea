"""Time one parity training iteration: this library against the seeds' formulation.

Shapes from the issue: n_elems 15, max_steps 20, batch 128, hidden 64, CPU, 2 threads. The
baseline (`bench/seeds_baseline.py`) builds samples one at a time through a DataLoader,
computes p as a product, loops over steps in the reconstruction loss and takes
``KLDivLoss(p.log(), p_g)``.

Each side runs in its own fresh worker process, as each would run for real (ponder's trainer
changes process-wide malloc settings, see `ponder/cpu.py`, which the seeds' code would not
have), and the workers alternate for several rounds so that a busy moment of the machine hits
both alike. Prints both medians and, as its last line, ``speedup <baseline / ours>``.

    .venv/bin/python bench/iteration_speed.py [--iterations 1000] [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SHAPES = {"n_elems": 15, "max_steps": 20, "batch_size": 128, "n_hidden": 64}


def worker(which: str, iterations: int, warmup: int, threads: int) -> dict[str, list[float] | float]:
    """Seconds per training iteration of one side, and page faults per iteration, in this process."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if which == "seeds":
        sys.path.insert(0, str(HERE))
        from seeds_baseline import SeedsTrainer

        step = SeedsTrainer(**SHAPES, lambda_p=0.2, beta=0.01, lr=3e-4).step
    else:
        from ponder import ParityConfig, Trainer

        step = Trainer(ParityConfig(**SHAPES, lr=3e-4, device="cpu")).train_step  # type: ignore[assignment]
    for _ in range(warmup):
        step()
    times = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(iterations):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"times": times, "faults": faults / iterations}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=1000, help="timed iterations of each side in all")
    parser.add_argument("--rounds", type=int, default=5, help="alternating worker processes per side")
    parser.add_argument("--warmup", type=int, default=30, help="untimed iterations per worker")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--worker", choices=["ours", "seeds"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.iterations, args.warmup, args.threads)))
        return

    per_round = max(1, args.iterations // args.rounds)
    times: dict[str, list[float]] = {"seeds": [], "ours": []}
    faults: dict[str, list[float]] = {"seeds": [], "ours": []}
    for r in range(args.rounds):
        for which in times:
            cmd = [sys.executable, __file__, "--worker", which, "--iterations", str(per_round)]
            cmd += ["--warmup", str(args.warmup), "--threads", str(args.threads)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            result = json.loads(out)
            times[which] += result["times"]
            faults[which].append(result["faults"])
            median = statistics.median(result["times"]) * 1e3
            print(f"round {r + 1}/{args.rounds} {which:5s} median {median:6.2f} ms", end="")
            print(f", {result['faults']:.0f} page faults/iteration")

    seeds_ms = statistics.median(times["seeds"]) * 1e3
    ours_ms = statistics.median(times["ours"]) * 1e3
    print(f"shapes: {SHAPES}, CPU, {args.threads} threads, {len(times['ours'])} iterations each")
    for name, which, ms in (("seeds' formulation", "seeds", seeds_ms), ("ponder", "ours", ours_ms)):
        page_faults = statistics.mean(faults[which])
        print(f"{name:<19} median {ms:7.2f} ms/iteration, {page_faults:6.0f} page faults/iteration")
    print(f"speedup {seeds_ms / ours_ms:.2f}")


if __name__ == "__main__":
    main()
