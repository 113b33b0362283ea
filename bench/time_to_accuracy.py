"""Wall time until the default parity config reaches a halted accuracy (default 0.99).

Trains ``ParityConfig()`` (n_elems 15, max_steps 20, batch 128, hidden 64) on the CPU (or
``--device cuda``, where the default config compiles its step: the compile is in the wall time)
and evaluates on the fixed 1,000-sample ``test`` set every ``--eval-interval`` iterations, until
the target or the time budget, once per seed of ``--seeds``. With ``--baseline`` it then trains
the reference formulation (`bench/reference_baseline.py`, lr 3e-4 as in the reference code) for the same wall
time and evaluates it on the same set, so both figures come from one run on one machine.

The last line is ``median <seconds>`` over the seeds (``inf`` when one missed the target).

    .venv/bin/python bench/time_to_accuracy.py [--target 0.99] [--budget 300] [--seeds 0,1,2]
        [--device cuda] [--baseline]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference_baseline import ReferenceTrainer

from ponder import ParityConfig, Trainer
from ponder.data.parity import parity_eval_sets


def reference_halted_accuracy(trainer: ReferenceTrainer, x: torch.Tensor, y: torch.Tensor) -> float:
    """The reference evaluation: the prediction at the Bernoulli-sampled halting step."""
    model = trainer.model.eval()
    with torch.no_grad():
        y_pred, _, halting_step = model(x)
    model.train()
    halted = y_pred.gather(0, (halting_step - 1).clamp(min=0)[None])[0]
    return float(((halted > 0).float() == y).float().mean())


def time_to_target(seed: int, args: argparse.Namespace) -> tuple[float | None, float]:
    """Train one seed to the target: (wall seconds when reached or None, wall seconds spent)."""
    config = ParityConfig(seed=seed, iterations=10**9, eval_interval=args.eval_interval, device=args.device)
    trainer = Trainer(config)
    start = time.perf_counter()
    reached = None
    for m in trainer.run():
        wall = time.perf_counter() - start
        acc = m["test/halted_accuracy"]
        print(f"seed {seed}  iter {m['iteration']:>6}  wall {wall:6.1f} s  test halted acc {acc:.3f}")
        if acc >= args.target:
            reached = (m["iteration"], wall, m["time_s"])
            break
        if wall > args.budget:
            break
    spent = time.perf_counter() - start
    print(f"config: {config.to_dict()}")
    if reached:
        it, wall, train_s = reached
        print(f"ponder, seed {seed}: halted accuracy >= {args.target} at iteration {it}, ", end="")
        print(f"{wall:.1f} s wall ({train_s:.1f} s training)", flush=True)
        return wall, spent
    print(f"ponder, seed {seed}: did not reach {args.target} within {args.budget:.0f} s", flush=True)
    return None, spent


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", type=float, default=0.99, help="halted accuracy on the test set")
    parser.add_argument("--budget", type=float, default=300.0, help="wall seconds at most, per seed")
    parser.add_argument("--eval-interval", type=int, default=250)
    parser.add_argument("--seeds", default="0", help="comma-separated config seeds, one run each")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda")
    parser.add_argument("--baseline", action="store_true", help="also train the reference one as long")
    args = parser.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: give integers separated by commas, e.g. 0,1,2")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    torch.set_num_threads(args.threads)

    walls = []
    for seed in seeds:
        reached, spent = time_to_target(seed, args)
        walls.append(reached if reached is not None else float("inf"))
        if args.baseline:
            baseline(seed, spent, args)
    each = ", ".join(f"seed {s} {w:.1f}" for s, w in zip(seeds, walls, strict=True))
    print(f"seconds to {args.target}: {each}")
    print(f"median {statistics.median(walls):.1f}")


def baseline(seed: int, seconds: float, args: argparse.Namespace) -> None:
    """The reference formulation trained for ``seconds`` on the same test set."""
    test = parity_eval_sets(15, (1, 15), 1000, seed=seed)["test"]
    torch.manual_seed(seed)
    reference = ReferenceTrainer(15, 64, 20, 128, lambda_p=0.2, beta=0.01, lr=3e-4, device=args.device)
    x, y = test.x.to(args.device), test.y.to(args.device)
    start, iterations, best = time.perf_counter(), 0, 0.0
    while time.perf_counter() - start < seconds:
        reference.step()
        iterations += 1
        if iterations % args.eval_interval == 0:
            best = max(best, reference_halted_accuracy(reference, x, y))
    final = reference_halted_accuracy(reference, x, y)
    print(
        f"reference formulation, seed {seed}, same {seconds:.1f} s: {iterations} iterations, "
        f"halted accuracy {final:.3f} (best {max(best, final):.3f})"
    )


if __name__ == "__main__":
    main()
