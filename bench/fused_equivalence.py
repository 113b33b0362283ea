"""Fused and plain runs of the same configurations over seeds, to a long budget: one distribution?

A fused member computes its plain run's numbers per iteration to rounding, but rounding grows
through training as any two float orders do (docs/fused.md), so past the first thousands of
iterations a fused run and its plain run are two draws, not one number. What a study needs is
that they are draws of one distribution. This trains each configuration at ``--seeds`` seeds
three ways, each run to ``--iterations``:

- ``plain counter``: a plain `Trainer` on the counter data stream (the default);
- ``fused``: every run of every configuration as members of one `FusedTrainer` group;
- ``plain generator``: a plain `Trainer` on the generator stream (runs made before counter
  streams, which docs/RESULTS.md's figures come from).

and compares, per configuration and final metric, fused and generator against plain counter: the
means, the seed spread, and a two-sided permutation test of the difference of means (exact over
every split of the 2 x seeds runs). Also printed: how far a fused run's final ``train/loss`` is
from its own plain run's (same seed), which says the two did drift apart. Last line
``same distribution: fused <a>/<n>, generator <b>/<n> (p >= 0.05)``, counting (configuration,
metric) pairs whose permutation p-value is at least 0.05.

    .venv/bin/python bench/fused_equivalence.py [--seeds 6] [--iterations 3000] [--workers 2]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import time
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import torch

from ponder.config import ParityConfig
from ponder.fused.trainer import FusedTrainer
from ponder.trainer import Trainer

METRICS = (
    "test/halted_accuracy",
    "test/best_step_accuracy",
    "hard/halted_accuracy",
    "test/mean_halting_step",
)
"""The final metrics compared: halted accuracy, the best single step's accuracy (halted accuracy
alone can hide a network that answers through where it halts), and the mean halting step."""

CONFIGS = {
    "lp0.2 b0.01 N10": {"lambda_p": 0.2, "beta": 0.01, "max_steps": 10},
    "lp0.5 b0.001 N6": {"lambda_p": 0.5, "beta": 0.001, "max_steps": 6},
    "lp0.1 b0.05 N15": {"lambda_p": 0.1, "beta": 0.05, "max_steps": 15},
}
"""Three corners of the default study's space (8-element parity)."""

Final = dict[str, float]


def config_of(name: str, seed: int, iterations: int, stream: str = "counter") -> ParityConfig:
    """The default study's task (8-element parity) at one configuration and seed."""
    return ParityConfig(
        **CONFIGS[name],  # type: ignore[arg-type]
        n_elems=8,
        seed=seed,
        iterations=iterations,
        eval_interval=iterations,
        device="cpu",
        data_stream=stream,  # type: ignore[arg-type]
    )


def final(metrics: dict[str, Any]) -> Final:
    return {k: float(metrics[k]) for k in (*METRICS, "train/loss")}


def plain_run(name: str, seed: int, iterations: int, stream: str) -> Final:
    """A plain run's final metrics (one torch thread)."""
    torch.set_num_threads(1)
    return final(list(Trainer(config_of(name, seed, iterations, stream)).run())[-1])


def fused_runs(seeds: int, iterations: int) -> dict[tuple[str, int], Final]:
    """Every (configuration, seed) as a member of one fused group: each member's final metrics."""
    torch.set_num_threads(1)
    runs = list(itertools.product(CONFIGS, range(seeds)))
    group = FusedTrainer(len(runs), "cpu", compile=False)
    slots = {group.join(config_of(name, seed, iterations)): (name, seed) for name, seed in runs}
    out: dict[tuple[str, int], Final] = {}
    while group.running:
        for slot, metrics in group.step().items():
            if metrics["outcome"] != "running":
                out[slots[slot]] = final(metrics)
    return out


def permutation_p(a: list[float], b: list[float], draws: int = 20_000) -> float:
    """Two-sided p-value of the difference of means of ``a`` and ``b`` under exchangeability: exact
    over every split of the pooled values where there are at most ``draws`` of them, else drawn."""
    pooled, n = a + b, len(a)
    observed = abs(statistics.fmean(a) - statistics.fmean(b))
    splits: Any = itertools.combinations(range(len(pooled)), n)
    if math.comb(len(pooled), n) > draws:
        rng = random.Random(0)
        splits = (rng.sample(range(len(pooled)), n) for _ in range(draws))
    hits = total = 0
    total_sum = sum(pooled)
    for split in splits:
        first = sum(pooled[i] for i in split)
        diff = abs(first / n - (total_sum - first) / (len(pooled) - n))
        hits += diff >= observed - 1e-12
        total += 1
    return hits / total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=6, help="seeds a configuration (default 6)")
    parser.add_argument("--iterations", type=int, default=3000, help="each run's budget (default 3000)")
    parser.add_argument("--workers", type=int, default=2, help="processes, one torch thread each (default 2)")
    args = parser.parse_args()
    start = time.monotonic()
    plain: dict[tuple[str, str, int], Future[Final]] = {}
    with ProcessPoolExecutor(args.workers) as pool:
        fused_future = pool.submit(fused_runs, args.seeds, args.iterations)  # the longest: first
        for stream, name, seed in itertools.product(("counter", "generator"), CONFIGS, range(args.seeds)):
            plain[(stream, name, seed)] = pool.submit(plain_run, name, seed, args.iterations, stream)
        fused = fused_future.result()
        done = {key: f.result() for key, f in plain.items()}
    print(
        f"8-element parity, {len(CONFIGS)} configurations x {args.seeds} seeds, {args.iterations:,} "
        f"iterations each, CPU, 1 thread a process ({time.monotonic() - start:.0f} s)"
    )
    head = f"{'configuration':18} {'metric':25} {'plain counter':>16}"
    print(f"{head} {'fused':>16} {'p':>6} {'generator':>16} {'p':>6}")
    same_fused = same_generator = pairs = 0
    drift: list[float] = []
    for name in CONFIGS:
        base = [done[("counter", name, s)] for s in range(args.seeds)]
        arms = {"fused": [fused[(name, s)] for s in range(args.seeds)],
                "generator": [done[("generator", name, s)] for s in range(args.seeds)]}  # fmt: skip
        pairs_of_runs = zip(arms["fused"], base, strict=True)
        drift += [abs(f["train/loss"] - b["train/loss"]) / abs(b["train/loss"]) for f, b in pairs_of_runs]
        for metric in METRICS:
            values = [r[metric] for r in base]
            cells, ps = [], []
            for arm in ("fused", "generator"):
                other = [r[metric] for r in arms[arm]]
                p = permutation_p(values, other)
                ps.append(p)
                cells.append(f"{statistics.fmean(other):8.3f} +-{statistics.stdev(other):5.3f} {p:6.2f}")
            same_fused += ps[0] >= 0.05
            same_generator += ps[1] >= 0.05
            pairs += 1
            base_cell = f"{statistics.fmean(values):8.3f} +-{statistics.stdev(values):5.3f}"
            print(f"{name:18} {metric:25} {base_cell:>16} {cells[0]:>23} {cells[1]:>23}")
    print(
        f"fused against its own plain run (same seed), final train/loss: relative difference median "
        f"{statistics.median(drift):.2g}, largest {max(drift):.2g}"
    )
    print(f"same distribution: fused {same_fused}/{pairs}, generator {same_generator}/{pairs} (p >= 0.05)")


if __name__ == "__main__":
    main()
