"""Fused MNIST members against their plain runs at a long budget: the same outcomes over seeds?

A fused member equals its plain run per iteration to rounding, and two float orders drift apart
over a long run as a plain run does from itself with its weights moved by one ulp (docs/fused.md,
"Fused MNIST"). What a study needs is that fused and plain runs of one configuration end the same
way over seeds. For each configuration of ``--configs`` (the rotation spec's setup: trained at
22.5 degrees, batch 128, hidden 64, dropout 0.2) and each of ``--seeds`` seeds, a plain `Trainer`
and a member of one fused group (all configurations' seeds together, eager, 1 thread) train
``--iterations``; then the final halted accuracy at 22.5 and 90 degrees of both, per
configuration: the seeds' mean and standard deviation, fused and plain, and whether the means
differ by less than 2 standard errors of their difference (Welch). Last line ``outcomes
<configurations alike>/<configurations> (<sets>)``.

``--drift`` shows the drift itself: the training loss's relative difference at a few iterations,
each configuration's member (one group, seed 0) against its plain run, and its plain run against
itself with its first convolution's weights moved one ulp up; last line ``drift at <iteration>:
member <largest> ulp <largest>``.

    .venv/bin/python bench/fused_mnist_outcomes.py [--seeds 4] [--iterations 1000]
    .venv/bin/python bench/fused_mnist_outcomes.py --drift [--iterations 200]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from ponder.config import MnistConfig
from ponder.fused.trainer import FusedTrainer
from ponder.trainer import Trainer

CONFIGS = {  # lambda_p, beta, max_steps: the reference setting and the rotation spec's centre
    "reference": (0.2, 0.01, 20),
    "centre": (0.475, 0.00316, 7),
}
SETS = ("rot22.5", "rot90")


def config(name: str, seed: int, iterations: int) -> MnistConfig:
    lambda_p, beta, max_steps = CONFIGS[name]
    return MnistConfig(
        lambda_p=lambda_p,
        beta=beta,
        max_steps=max_steps,
        seed=seed,
        iterations=iterations,
        eval_interval=iterations,
        train_rotation=22.5,
        eval_rotations=(22.5, 90.0),
        device="cpu",
    )


def plain_outcome(cfg: MnistConfig) -> dict[str, float]:
    last = list(Trainer(cfg).run())[-1]
    return {s: float(last[f"{s}/halted_accuracy"]) for s in SETS}


def fused_outcomes(configs: list[MnistConfig]) -> list[dict[str, float]]:
    group = FusedTrainer(len(configs), "cpu", compile=False)
    slots = [group.join(c) for c in configs]
    last: dict[int, dict[str, object]] = {}
    while group.running:
        last.update(group.step())
    return [{s: float(last[slot][f"{s}/halted_accuracy"]) for s in SETS} for slot in slots]  # type: ignore[arg-type]


def losses(trainer: Trainer, iterations: int) -> list[float]:
    return [trainer.train_step().loss for _ in range(iterations)]


def drift(names: list[str], iterations: int) -> None:
    """The drift (module docstring) at iterations 10, 50, 100, ... up to ``iterations``."""
    configs = [config(n, 0, iterations) for n in names]
    group = FusedTrainer(len(configs), "cpu", compile=False)
    slots = [group.join(c) for c in configs]
    fused: dict[int, list[float]] = {s: [] for s in slots}
    while group.running:
        group.step()
        for slot, result in group.last_results.items():
            fused[slot].append(result.loss)
    at = [i for i in (10, 50, 100, 200, 500, 1000, 2000) if i <= iterations]

    def rel(a: list[float], b: list[float]) -> list[float]:
        return [abs(a[i - 1] - b[i - 1]) / abs(b[i - 1]) for i in at]

    print(f"the training loss's relative difference at iterations {', '.join(map(str, at))}")
    largest = {"member": 0.0, "ulp": 0.0}
    for name, slot, cfg in zip(names, slots, configs, strict=True):
        plain = losses(Trainer(cfg), iterations)
        moved = Trainer(cfg)
        with torch.no_grad():  # one ulp up, every weight of the first convolution
            weight = moved.model.step.cnn[0].weight
            weight.copy_(torch.nextafter(weight, torch.full_like(weight, math.inf)))
        for what, run in (("member", fused[slot]), ("ulp", losses(moved, iterations))):
            row = rel(run, plain)
            largest[what] = max(largest[what], row[-1])
            print(f"{what:6} {name:10} " + " ".join(f"{d:8.1e}" for d in row))
    print(f"drift at {at[-1]}: member {largest['member']:.1e} ulp {largest['ulp']:.1e}")


def alike(a: list[float], b: list[float]) -> tuple[bool, float]:
    """Whether two samples' means differ by less than 2 standard errors of the difference (Welch)."""
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    gap = abs(statistics.mean(a) - statistics.mean(b))
    return gap <= 2 * se or gap == 0.0, se


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"of {', '.join(CONFIGS)}")
    parser.add_argument("--drift", action="store_true", help="the losses' drift, member and one ulp")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.configs.split(",")
    if args.drift:
        drift(names, args.iterations)
        return
    runs = [(n, s) for n in names for s in range(args.seeds)]
    start = time.perf_counter()
    fused = dict(zip(runs, fused_outcomes([config(n, s, args.iterations) for n, s in runs]), strict=True))
    fused_s = time.perf_counter() - start
    plain = {(n, s): plain_outcome(config(n, s, args.iterations)) for n, s in runs}
    plain_s = time.perf_counter() - start - fused_s
    print(f"{args.seeds} seeds x {args.iterations} iterations; fused {fused_s:.0f} s, plain {plain_s:.0f} s")
    print(f"{'config':10} {'set':8} {'fused mean (sd)':>16} {'plain mean (sd)':>16} {'2 se':>7} alike")
    same = 0
    for name in names:
        config_alike = True
        for s in SETS:
            f = [fused[name, seed][s] for seed in range(args.seeds)]
            p = [plain[name, seed][s] for seed in range(args.seeds)]
            ok, se = alike(f, p)
            config_alike &= ok
            fm, fsd, pm, psd = (
                statistics.mean(f),
                statistics.stdev(f),
                statistics.mean(p),
                statistics.stdev(p),
            )
            print(f"{name:10} {s:8} {fm:9.4f} ({fsd:.4f}) {pm:9.4f} ({psd:.4f}) {2 * se:7.4f} {ok}")
        same += config_alike
    print(f"outcomes {same}/{len(names)} ({', '.join(SETS)})")


if __name__ == "__main__":
    main()
