"""Training iterations a study needs to match the reference lambda_p grid: grid, random, Optuna + ASHA.

Three real studies run through the project's own path, `study.run.runner.run_study`, one after the
other on one local Ray instance (``address="local"``), all on the same task config and the same
per-trial budget B (``--iterations``):

- task: parity with ``--n-elems`` (8, as the shipped ``parity`` spec: at 3,000 iterations with an
  evaluation every 250 its good settings end at 0.99+ test halted accuracy on a CPU), batch 128,
  hidden 64, ``device = "cpu"``, model seed 0; one CPU a trial, ``max_concurrent = 2`` in every
  study, ``max_failures = 0``. The spec is the shipped ``parity`` spec (`study.spec.spec.load_spec`),
  its TOML edited and parsed again (`study.spec.spec.parse_spec` of `study.spec.spec.to_toml`);
1. **grid**: the reference grid, ``lambda_p`` in [0.1, 0.3, 0.5, 0.7, 0.9] (``sampler = "grid"``),
   ``beta = 0.01`` and ``max_steps = 20`` fixed as in the reference grid, ASHA's ``grace_period`` = B so
   that nothing stops early: 5 trials of B iterations;
2. **random**: ``sampler = "random"`` (Optuna's) over ``lambda_p`` in [0.05, 0.9], ``beta`` in
   [1e-4, 0.1] on a log scale, ``max_steps`` in [4, 20] (the ``parity`` spec's space),
   ``--trials`` trials, ``grace_period`` = B: no early stopping;
3. **optuna+asha**: ``sampler = "tpe"`` over the same space, the same ``--trials`` trials, ASHA
   with a grace period of B/4 on the evaluation grid and reduction factor 3 (the ``parity``
   spec's settings; ``--grace-period``, ``--reduction-factor``).

Every sampler is seeded with ``--seed`` (``[search] seed``). The studies go to one storage root,
``--storage`` (default: a temporary directory, removed at the end).

Definitions, from each study's history Parquet (the folder ``<storage>/history/study=<name>/``,
one row per trial per report):

- **target**: the grid's best halted accuracy, the largest ``test/halted_accuracy`` over all the
  grid's reports; a report reaches it when its accuracy >= target - tolerance (``--tolerance``,
  default 0; the table also gives tolerance 0.005).
- **iterations to target** (the walk): the study's reports in the order they were made
  (``timestamp``, which is whole seconds, then ``time_total_s``); after each report, the
  iterations consumed so far = the sum over the study's trials of the latest ``iteration`` each
  had reported by then. Trials run two at a time, so every trial's progress counts, trials ASHA
  stopped later included. The figure is that sum at the first report that reaches the target.
  A strategy that never reaches it is "not reached", with its best accuracy and its total.
- **total iterations**: the sum over trials of each trial's last reported ``iteration``; for the
  grid 5 x B when every trial completed.
- For the grid both figures are kept: its walk (its own iterations until its best was first
  reported, in its run order) and its total (a grid is only known to be done when all of it
  ran). Every ratio is against the grid measured in the same run: "x grid walk" divides by the
  grid's walk at the same tolerance, "x grid total" by the grid's total.
- **the target**: "Optuna + ASHA needs at most 30 % of the grid's iterations" (what a search
  should save to be worth it over the grid), judged on
  the grid's total (what running the grid costs) at ``--tolerance``; the ratio against the grid's
  walk is printed beside it.

TPE proposes its first trials at random (`study.search.search.tpe_startup_trials`: a quarter of the
study, 2 to 10; Optuna's own default, 10, made an 8-trial study random search), from the same
seeded generator as the random sampler: those first points are the random study's, and TPE
models the rest.

The whole bench: B = 2,000 with an evaluation every 250, 8 trials a searched study, 37,500
training iterations: about 7 minutes on 2 idle CPU cores (90 iterations/s), 15 on cores shared
with other work (40 iterations/s). B = 3,000 and 10 trials (the ``parity`` spec's sizing, about
60,000 iterations) take about 40 minutes at 25 iterations/s::

    .venv/bin/python bench/study_efficiency.py [--iterations 2000] [--eval-interval 250] [--trials 8]
        [--seed 0] [--n-elems 8] [--grace-period 500] [--reduction-factor 3] [--tolerance 0.0]
        [--out efficiency.json] [--storage DIR]

A check that it works (B = 1,000 with an evaluation every 125, 4 trials; 2.5 minutes on idle
cores, 9 on busy ones; at B = 1,000 parity 8 is only starting to be learnt,
accuracies ~0.7, so its figures check the script, not the strategies)::

    .venv/bin/python bench/study_efficiency.py --quick
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from study.spec.spec import StudySpec, load_spec, parse_spec, to_toml
from study.storage.storage import read_study_table

BASE_SPEC = "parity"
METRIC = "test/halted_accuracy"
GRID_LAMBDA_P = [0.1, 0.3, 0.5, 0.7, 0.9]  # the reference grid
GRID_FIXED = {"beta": 0.01, "max_steps": 20}  # fixed in the reference grid
SPACE: dict[str, dict[str, Any]] = {  # the random and Optuna + ASHA space (the parity spec's)
    "lambda_p": {"low": 0.05, "high": 0.9},
    "beta": {"low": 1e-4, "high": 0.1, "log": True},
    "max_steps": {"low": 4, "high": 20},
}
PARAMS = ("lambda_p", "beta", "max_steps")
MAX_CONCURRENT = 2
TARGET_RATIO = 0.30  # the target: Optuna + ASHA needs at most 30 % of the grid's iterations
EXTRA_TOLERANCE = 0.005
STRATEGIES = ("grid", "random", "optuna+asha")
LABELS = {"grid": "grid (lambda_p)", "random": "random", "optuna+asha": "Optuna + ASHA"}


# -- the three specs ----------------------------------------------------------------------------
def study_name(strategy: str, args: argparse.Namespace) -> str:
    tag = {"grid": "grid", "random": "random", "optuna+asha": "asha"}[strategy]
    return f"efficiency-{tag}-b{args.iterations}-s{args.seed}"


def strategy_spec(strategy: str, args: argparse.Namespace, storage: str) -> StudySpec:
    """The ``parity`` spec made into one strategy's study under ``storage``."""
    doc = tomllib.loads(load_spec(BASE_SPEC).source)
    config = {
        **doc.get("config", {}),
        "n_elems": args.n_elems,
        "iterations": args.iterations,
        "eval_interval": args.eval_interval,
        "device": "cpu",
    }
    search: dict[str, Any] = {"seed": args.seed, "max_concurrent": MAX_CONCURRENT}
    scheduler: dict[str, Any] = {"metric": METRIC, "mode": "max", "reduction_factor": args.reduction_factor}
    if strategy == "grid":
        config.update(GRID_FIXED)
        space: dict[str, Any] = {"lambda_p": {"values": GRID_LAMBDA_P}}
        search["sampler"] = "grid"  # num_samples: the grid's size
        scheduler["grace_period"] = args.iterations  # = the budget: ASHA stops nothing
    else:
        space = {name: dict(dim) for name, dim in SPACE.items()}
        search.update(sampler="random" if strategy == "random" else "tpe", num_samples=args.trials)
        scheduler["grace_period"] = args.iterations if strategy == "random" else args.grace_period
    doc.update(
        description=f"bench/study_efficiency.py: {LABELS[strategy]}, {args.iterations} iterations a trial",
        config=config,
        space=space,
        search=search,
        scheduler=scheduler,
        resources={"cpu": 1, "gpu": 0},
        run={"storage": storage, "max_failures": 0},
    )
    return parse_spec(to_toml(doc), study_name(strategy, args))


# -- the figures --------------------------------------------------------------------------------
@dataclass
class Reached:
    """Where a study's walk first reached the target, or its best when it did not."""

    tolerance: float
    threshold: float
    reached: bool
    iterations: int | None
    """Iterations consumed over all trials at the first report that reached the target."""
    trial_id: str | None
    trial_iteration: int | None
    accuracy: float | None


def ordered(history: pd.DataFrame) -> pd.DataFrame:
    """The study's reports in the order they were made: ``timestamp`` (whole seconds), then
    ``time_total_s``."""
    return history.sort_values(["timestamp", "time_total_s"], kind="stable").reset_index(drop=True)


def walk(history: pd.DataFrame, target: float, tolerance: float) -> Reached:
    """Iterations consumed over all trials when the first report with accuracy >= target - tolerance
    was made (see the module docstring)."""
    threshold = target - tolerance
    reports = ordered(history)
    latest: dict[str, int] = {}
    columns = (reports["trial_id"], reports["iteration"], reports[METRIC])
    for trial_id, iteration, accuracy in zip(*columns, strict=True):
        trial = str(trial_id)
        latest[trial] = max(latest.get(trial, 0), int(iteration))
        if not pd.isna(accuracy) and accuracy >= threshold - 1e-12:  # a null (NaN) accuracy never counts
            return Reached(
                tolerance, threshold, True, sum(latest.values()), trial, int(iteration), float(accuracy)
            )
    return Reached(tolerance, threshold, False, None, None, None, None)


def study_figures(
    strategy: str, history: pd.DataFrame, trials: pd.DataFrame, wall_s: float
) -> dict[str, Any]:
    """What does not depend on the target: trials, statuses, total iterations, best accuracy."""
    last = history.groupby("trial_id")["iteration"].max()
    accuracy = history[METRIC].dropna()
    best_row = history.loc[accuracy.idxmax()] if len(accuracy) else None
    params = trials.set_index("trial_id")[list(PARAMS)]
    return {
        "strategy": strategy,
        "study": None,
        "trials": len(trials),
        "statuses": {str(k): int(v) for k, v in trials["status"].value_counts().items()},
        "reports": len(history),
        "total_iterations": int(last.sum()),
        "best_accuracy": float(accuracy.max()) if len(accuracy) else None,
        "best_trial": None if best_row is None else str(best_row["trial_id"]),
        "best_iteration": None if best_row is None else int(best_row["iteration"]),
        "wall_s": wall_s,
        "params": {
            str(t): {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for t, row in params.iterrows()
        },
    }


def run_strategy(
    strategy: str, args: argparse.Namespace, storage: str
) -> tuple[dict[str, Any], pd.DataFrame]:
    from study.run.runner import run_study

    spec = strategy_spec(strategy, args, storage)
    print(
        f"  {LABELS[strategy]}: study {spec.name!r}, {spec.search.num_samples} trials, sampler "
        f"{spec.search.sampler}, grace period {spec.scheduler.grace_period if spec.scheduler else '-'} ...",
        flush=True,
    )
    start = time.perf_counter()
    outcome = run_study(spec, address="local", verbose=0)  # Ray starts with the first study
    wall_s = time.perf_counter() - start
    history = read_study_table(outcome.paths, "history").to_pandas()
    trials = read_study_table(outcome.paths, "trials").to_pandas()
    if not outcome.finished:
        raise RuntimeError(f"{strategy}: the study did not finish: {outcome.statuses}")
    row = study_figures(strategy, history, trials, wall_s)
    row["study"] = spec.name
    print(
        f"    {row['trials']} trials {row['statuses']}, {row['total_iterations']:,} iterations, "
        f"best {METRIC} {_acc(row['best_accuracy'])}, {wall_s:.0f} s",
        flush=True,
    )
    return row, history


# -- output -------------------------------------------------------------------------------------
def _acc(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3f}"


def _ratio(num: int | None, den: int | None) -> float | None:
    return None if num is None or not den else num / den


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _params(row: dict[str, Any], trial: str | None) -> str:
    p = row["params"].get(trial or "", {})
    if not p:
        return ""
    return f"lambda_p {p['lambda_p']:.3g}, beta {p['beta']:.2g}, max_steps {int(p['max_steps'])}"


def print_summary(rows: list[dict[str, Any]]) -> None:
    head = f"{'strategy':<16} {'trials':>6} {'total it':>9} {'best acc':>8} {'wall s':>7}  statuses"
    print(head)
    print("-" * len(head))
    for r in rows:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
        print(
            f"{LABELS[r['strategy']]:<16} {r['trials']:>6} {r['total_iterations']:>9,} "
            f"{_acc(r['best_accuracy']):>8} {r['wall_s']:>7.0f}  {statuses}"
        )


def print_walks(rows: list[dict[str, Any]], tolerance: float, target: float) -> None:
    key = f"{tolerance:g}"
    grid = rows[0]
    print(
        f"\ntolerance {tolerance:g}: iterations over all trials until a report had {METRIC} >= "
        f"{target - tolerance:.4g} (the grid's best {target:.3f} - {tolerance:g})"
    )
    head = f"{'strategy':<16} {'to target':>11} {'x grid walk':>11} {'x grid total':>12}  reached by"
    print(head)
    print("-" * len(head))
    lines: list[tuple[str, dict[str, Any]]] = [("grid (walk)", grid)]
    lines += [("grid (total)", grid)] + [(LABELS[r["strategy"]], r) for r in rows[1:]]
    for label, r in lines:
        w = r["walks"][key]
        if label == "grid (total)":
            figure = r["total_iterations"]
            text, by = f"{figure:,}", "every grid point to its budget"
        elif not w["reached"]:
            figure = None
            text = "not reached"
            by = f"best {_acc(r['best_accuracy'])} in {r['total_iterations']:,} iterations"
        else:
            figure = w["iterations"]
            text = f"{figure:,}"
            by = (
                f"trial {w['trial_id']} at its iteration {w['trial_iteration']:,} ({_acc(w['accuracy'])}; "
                f"{_params(r, w['trial_id'])})"
            )
        x_walk = _fmt_ratio(_ratio(figure, grid["walks"][key]["iterations"]))
        x_total = _fmt_ratio(_ratio(figure, grid["total_iterations"]))
        print(f"{label:<16} {text:>11} {x_walk:>11} {x_total:>12}  {by}")


def verdict(rows: list[dict[str, Any]], tolerance: float, target: float) -> str:
    grid, asha = rows[0], rows[-1]
    key = f"{tolerance:g}"
    total = grid["total_iterations"]
    w = asha["walks"][key]
    goal = (
        f"target \"Optuna + ASHA <= {TARGET_RATIO:.0%} of the grid's iterations\" (the grid's total, "
        f"{total:,}; tolerance {tolerance:g})"
    )
    if not w["reached"]:
        return (
            f"{goal}: MISSED: Optuna + ASHA never reached the grid's best {target:.3f} - {tolerance:g} "
            f"(its best {_acc(asha['best_accuracy'])} in {asha['total_iterations']:,} iterations)"
        )
    ratio = w["iterations"] / total
    walk_ratio = _ratio(w["iterations"], grid["walks"][key]["iterations"])
    status = "MET" if ratio <= TARGET_RATIO else "MISSED"
    return (
        f"{goal}: {status}: {w['iterations']:,} iterations = {ratio:.0%} of the grid's total "
        f"({_fmt_ratio(walk_ratio)}x the grid's walk, {grid['walks'][key]['iterations']:,})"
    )


# -- main ---------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, help="B, training iterations a trial (2000; quick 1000)")
    parser.add_argument("--eval-interval", type=int, help="iterations between reports (250; quick 125)")
    parser.add_argument(
        "--trials", type=int, help="trials of the random and Optuna + ASHA studies (8; quick 4)"
    )
    parser.add_argument("--grace-period", type=int, help="ASHA's grace period (B/4 on the evaluation grid)")
    parser.add_argument("--reduction-factor", type=float, default=3.0, help="ASHA's reduction factor (3)")
    parser.add_argument("--n-elems", type=int, default=8, help="parity vector length (8)")
    parser.add_argument("--seed", type=int, default=0, help="the samplers' seed, [search] seed (0)")
    parser.add_argument("--tolerance", type=float, default=0.0, help="reach the grid's best minus this (0)")
    parser.add_argument("--quick", action="store_true", help="B = 1000, 4 trials: a ~3 minute check")
    parser.add_argument("--storage", help="keep the studies under this root (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    if args.iterations is None:
        args.iterations = 1000 if args.quick else 2000
    if args.eval_interval is None:
        args.eval_interval = 125 if args.quick else 250
    if args.trials is None:
        args.trials = 4 if args.quick else 8
    if args.grace_period is None:  # a quarter of the budget, on the evaluation grid
        args.grace_period = max(
            args.eval_interval, args.iterations // 4 // args.eval_interval * args.eval_interval
        )
    if args.tolerance < 0:
        parser.error(f"--tolerance must be >= 0, got {args.tolerance}")

    import optuna

    from study.run.runner import StudyError
    from study.search.search import tpe_startup_trials
    from study.spec.spec import SpecError
    from study.storage.storage import StudyPaths

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" per study
    tolerances = list(dict.fromkeys([args.tolerance, EXTRA_TOLERANCE]))
    print(
        f"parity n_elems {args.n_elems}, B = {args.iterations:,} iterations a trial (a report every "
        f"{args.eval_interval}), {MAX_CONCURRENT} trials at once, one CPU each; grid: lambda_p "
        f"{GRID_LAMBDA_P}, beta {GRID_FIXED['beta']}, max_steps {GRID_FIXED['max_steps']}; random and "
        f"Optuna + ASHA: {args.trials} trials each; ASHA grace period {args.grace_period}, reduction "
        f"factor {args.reduction_factor:g}; seed {args.seed}",
        flush=True,
    )
    startup = tpe_startup_trials(args.trials)
    print(
        f"note: TPE's first {startup} of {args.trials} trials are random, drawn as the random sampler "
        "draws them; it models the rest"
    )
    rows: list[dict[str, Any]] = []
    histories: list[pd.DataFrame] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="study_efficiency.") as tmp:
        storage = args.storage or tmp
        try:
            for strategy in STRATEGIES:  # refuse before anything runs
                strategy_spec(strategy, args, storage)
                if StudyPaths(storage, study_name(strategy, args)).exists():
                    raise StudyError(
                        f"a study named {study_name(strategy, args)!r} already exists under {storage}; "
                        "pass another --storage (or --seed)"
                    )
            for strategy in STRATEGIES:
                row, history = run_strategy(strategy, args, storage)
                rows.append(row)
                histories.append(history)
        except (SpecError, StudyError) as exc:
            print(f"study_efficiency.py: error: {exc}", file=sys.stderr)
            sys.exit(2)
    elapsed = time.perf_counter() - start
    target = rows[0]["best_accuracy"]
    if target is None:
        print("study_efficiency.py: error: the grid reported no finite accuracy: no target", file=sys.stderr)
        sys.exit(1)
    for row, history in zip(rows, histories, strict=True):
        row["walks"] = {f"{t:g}": asdict(walk(history, target, t)) for t in tolerances}

    print(f"--- 3 studies in {elapsed:.0f} s")
    print_summary(rows)
    print(
        "\niterations to target: the study's reports in the order they were made (timestamp, then "
        "time_total_s);\nafter each, the sum over its trials of the latest iteration each had reported "
        "(trials ASHA stopped included);\nthe figure is that sum at the first report with accuracy >= "
        "target - tolerance, where the target is\nthe grid's best test/halted_accuracy. grid (walk): the "
        "grid's own walk; grid (total): every grid point\nto its budget (a grid is only known to be done "
        "when all of it ran). x grid walk / x grid total:\nratio to those two figures of the grid run "
        "here, at the same tolerance."
    )
    for t in tolerances:
        print_walks(rows, t, target)
    line = verdict(rows, args.tolerance, target)
    print()
    print(line)
    if args.out:
        report = {
            "bench": "bench/study_efficiency.py",
            "base_spec": BASE_SPEC,
            "metric": METRIC,
            "n_elems": args.n_elems,
            "iterations": args.iterations,
            "eval_interval": args.eval_interval,
            "trials": args.trials,
            "grid_lambda_p": GRID_LAMBDA_P,
            "grid_fixed": GRID_FIXED,
            "space": SPACE,
            "grace_period": args.grace_period,
            "reduction_factor": args.reduction_factor,
            "max_concurrent": MAX_CONCURRENT,
            "seed": args.seed,
            "tolerance": args.tolerance,
            "tolerances": tolerances,
            "target_accuracy": target,
            "target_ratio": TARGET_RATIO,
            "grid_total_iterations": rows[0]["total_iterations"],
            "elapsed_s": elapsed,
            "storage": args.storage,
            "strategies": rows,
            "verdict": line,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"figures written to {args.out}")


if __name__ == "__main__":
    main()
