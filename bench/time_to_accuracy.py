"""Wall time until the default parity config reaches a halted accuracy (default 0.99).

Trains ``ParityConfig()`` (n_elems 15, max_steps 20, batch 128, hidden 64) on the CPU and
evaluates on the fixed 1,000-sample ``test`` set every ``--eval-interval`` iterations, until
the target or the time budget. With ``--baseline`` it then trains the seeds' formulation
(`bench/seeds_baseline.py`, lr 3e-4 as in the seeds) for the same wall time and evaluates it
on the same set, so both figures come from one run on one machine.

    .venv/bin/python bench/time_to_accuracy.py [--target 0.99] [--budget 300] [--baseline]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from seeds_baseline import SeedsTrainer

from ponder import ParityConfig, Trainer
from ponder.data.parity import parity_eval_sets


def seeds_halted_accuracy(trainer: SeedsTrainer, x: torch.Tensor, y: torch.Tensor) -> float:
    """The seeds' evaluation: the prediction at the Bernoulli-sampled halting step."""
    model = trainer.model.eval()
    with torch.no_grad():
        y_pred, _, halting_step = model(x)
    model.train()
    halted = y_pred.gather(0, (halting_step - 1).clamp(min=0)[None])[0]
    return float(((halted > 0).float() == y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", type=float, default=0.99, help="halted accuracy on the test set")
    parser.add_argument("--budget", type=float, default=300.0, help="wall seconds at most")
    parser.add_argument("--eval-interval", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--baseline", action="store_true", help="also train the seeds' formulation as long")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = ParityConfig(seed=args.seed, iterations=10**9, eval_interval=args.eval_interval, device="cpu")
    trainer = Trainer(config)
    start = time.perf_counter()
    reached = None
    for m in trainer.run():
        wall = time.perf_counter() - start
        acc = m["test/halted_accuracy"]
        print(f"iter {m['iteration']:>6}  wall {wall:6.1f} s  test halted acc {acc:.3f}", flush=True)
        if acc >= args.target:
            reached = (m["iteration"], wall, m["time_s"])
            break
        if wall > args.budget:
            break
    ours_wall = time.perf_counter() - start
    print(f"config: {config.to_dict()}")
    if reached:
        it, wall, train_s = reached
        print(f"ponder: halted accuracy >= {args.target} at iteration {it}, {wall:.1f} s wall", end="")
        print(f" ({train_s:.1f} s training)")
    else:
        print(f"ponder: did not reach {args.target} within {args.budget:.0f} s")

    if args.baseline:
        test = parity_eval_sets(15, (1, 15), 1000, seed=args.seed)["test"]
        torch.manual_seed(args.seed)
        seeds = SeedsTrainer(15, 64, 20, 128, lambda_p=0.2, beta=0.01, lr=3e-4)
        start, iterations, best = time.perf_counter(), 0, 0.0
        while time.perf_counter() - start < ours_wall:
            seeds.step()
            iterations += 1
            if iterations % args.eval_interval == 0:
                best = max(best, seeds_halted_accuracy(seeds, test.x, test.y))
        final = seeds_halted_accuracy(seeds, test.x, test.y)
        print(
            f"seeds' formulation, same {ours_wall:.1f} s: {iterations} iterations, "
            f"halted accuracy {final:.3f} (best {max(best, final):.3f})"
        )


if __name__ == "__main__":
    main()
