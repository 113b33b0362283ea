"""Time fused training (`ponder.fused_trainer.FusedTrainer`) against a plain `Trainer`, per member-iteration.

Parity at ParityConfig's defaults (n_elems 15, max_steps 20, batch 128, hidden 64), CPU, eager.
The plain side is one `Trainer` making training iterations; the fused side is K members (each its
own seed, lambda_p, beta and lr, as a study's trials are) making one fused iteration each. Both
time training iterations only: evaluation, done every eval_interval iterations, is the plain code
on either side. The plain baseline and every K are measured in the same process, in alternating
rounds, so a busy moment of the machine hits all alike; each row is its fastest round (the one a
busy machine disturbed least: other processes only ever add time).

Prints ms per iteration (all K members), ms per member-iteration, member-iterations per second, and
the ratio against the plain Trainer (member-iterations per second fused / plain); last line
``ratio <best> at K=<k>``. ``--compile`` runs the fused step through ``torch.compile`` (its first
iteration, the compile, is not timed; on a CPU a cold compile takes a minute or more per K).

    .venv/bin/python bench/fused_speed.py [--threads 2] [--iters 20] [--rounds 5] [--ks 1,2,4,8,16]
        [--compile]
"""

from __future__ import annotations

import argparse
import time

import torch

from ponder.config import ParityConfig
from ponder.fused_trainer import FusedTrainer
from ponder.trainer import Trainer


def member_config(k: int, device: str = "cpu") -> ParityConfig:
    """Member k: the default shapes, its own seed and hyperparameters (they cost the same)."""
    return ParityConfig(
        seed=k, lambda_p=0.1 + 0.05 * (k % 8), beta=0.01 * (1 + k % 3), lr=3e-3 * (1 + k % 2), device=device
    )


def time_plain(trainer: Trainer, iters: int) -> float:
    """Seconds per `Trainer.train_step`."""
    start = time.perf_counter()
    for _ in range(iters):
        trainer.train_step()
    return (time.perf_counter() - start) / iters


def time_fused(fused: FusedTrainer, iters: int) -> float:
    """Seconds per `FusedTrainer.train_step` (one iteration of every member)."""
    start = time.perf_counter()
    for _ in range(iters):
        fused.train_step()
    return (time.perf_counter() - start) / iters


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per round (default 20)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--ks", default="1,2,4,8,16", help="members per fused group (default 1,2,4,8,16)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the fused step")
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda (the plain Trainer then compiles, as it does there)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")]

    plain = Trainer(member_config(0, args.device))
    groups = {}
    for k in ks:
        fused = FusedTrainer(k, args.device, compile=args.compile)
        for i in range(k):
            fused.join(member_config(i, args.device))
        groups[k] = fused
    # warm-up: Adam's first step, allocator pools, the compile when asked
    time_plain(plain, 3)
    for fused in groups.values():
        time_fused(fused, 3)
    plain_s: list[float] = []
    fused_s: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(args.rounds):
        plain_s.append(time_plain(plain, args.iters))
        for k, fused in groups.items():
            fused_s[k].append(time_fused(fused, args.iters))

    mode = "compiled" if args.compile else "eager"
    shape = f"{args.threads} threads, {args.iters} iterations x {args.rounds} rounds"
    print(f"parity, ParityConfig defaults, {args.device}, {shape}")
    print(f"{'':20} {'ms/iter':>9} {'ms/member-it':>13} {'member-it/s':>12} {'ratio':>7}")
    base = min(plain_s)
    print(f"{'plain Trainer':20} {base * 1e3:9.2f} {base * 1e3:13.2f} {1 / base:12.1f} {1.0:7.2f}")
    best = (0.0, 0)
    for k in ks:
        dt = min(fused_s[k])
        ratio = (k / dt) / (1 / base)
        best = max(best, (ratio, k))
        label = f"fused K={k} {mode}"
        print(f"{label:20} {dt * 1e3:9.2f} {dt * 1e3 / k:13.2f} {k / dt:12.1f} {ratio:7.2f}")
    print(f"ratio {best[0]:.2f} at K={best[1]}")


if __name__ == "__main__":
    main()
