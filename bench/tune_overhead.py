"""What the study layer costs: a trial under Ray Tune against a plain run, and the Parquet path.

1. Tune overhead. One fixed parity config (n_elems 15, max_steps 20, batch 128, hidden 64, CPU,
   one torch thread, ``--iterations`` iterations, an evaluation every ``--eval-interval``) runs
   directly (``ponder.trainer.Trainer`` in a fresh worker process, as Ray runs a trial in a fresh
   worker process) and as a one-trial study through the real path: `study.spec.spec.parse_spec` of a
   spec whose space is one value, then `study.run.runner.run_study` into a temporary storage root,
   its throughput read back from the study's Parquet. Two figures, each a median over runs that
   alternate (direct, tune, direct, ...):

   - training only: iterations / the Trainer's own ``time_s`` (training wall time without the
     evaluations), the same definition on both sides;
   - end to end: iterations / the trial's wall time, Tune's ``time_total_s`` (the trials
     Parquet's ``wall_time_s``) against the direct run's wall time from building the Trainer to
     its last evaluation; this one includes Tune's checkpoint + report at every evaluation.
     Both include building the Trainer in a fresh process, which here is mostly torch.optim's
     first-use import of torch._dynamo (1-2.5 s, the "build" figure of a direct run).

   Ray is started (``ray.init``, timed and printed apart) just before each Tune run and shut
   down after it, so that no idle Ray processes share the machine with a direct run.

2. Parquet export. A synthetic study of ``--trials`` trials x ``--reports`` reports as
   `study.records.parquet.TrialRecord`s, with the metric names a real parity run reports (one real
   metrics dict, perturbed), Tune's own result keys, mixed statuses and a few restarted trials;
   timed through `trials_table` + `history_table` + `write_parquet` of both. A second, MNIST-like
   study (rotated evaluation sets) is written beside it for part 3. Apart from the target: the
   `parse_result_lines` of every trial's ``result.json`` that `study.run.export.write_tables` does
   before it builds the tables.

3. Cross-study query. ``pd.read_parquet("<root>/trials")`` and a typical query over both
   studies (best trial per study, mean halting step by lambda_p bucket per study); then, as an
   extra figure, the history dataset read and joined to the trials on (study, trial_id).

The details print as they come; the last lines are a summary, one figure a line with its target.

    .venv/bin/python bench/tune_overhead.py [--iterations 2000] [--eval-interval 250] [--rounds 2]
        [--trials 200] [--reports 100] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

SHAPES = {"n_elems": 15, "max_steps": 20, "batch_size": 128, "n_hidden": 64}
LAMBDA_P = 0.2
OBJECTIVE = "test/halted_accuracy"
RATIO_TARGET = 0.9
EXPORT_TARGET_S = 3.0
QUERY_TARGET_S = 0.3

SPEC_TEMPLATE = """\
description = "bench/tune_overhead.py: one fixed parity trial"
task = "parity"

[config]
n_elems = {n_elems}
max_steps = {max_steps}
batch_size = {batch_size}
n_hidden = {n_hidden}
iterations = {iterations}
eval_interval = {eval_interval}
device = "cpu"

[space.lambda_p]
values = [{lambda_p}]

[search]
sampler = "random"
seed = 0
num_samples = 1
max_concurrent = 1

[scheduler]
metric = "{objective}"
mode = "max"
grace_period = {iterations}

[resources]
cpu = 1
gpu = 0

[run]
storage = {storage}
max_failures = 0
"""


# -- worker processes -------------------------------------------------------------------------------
def direct_worker(config: dict[str, Any]) -> dict[str, Any]:
    """One plain Trainer run of ``config`` in this process, one torch thread, as a trial would run."""
    import torch

    from ponder.config import config_from_dict
    from ponder.trainer import Trainer

    torch.set_num_threads(1)
    start = time.perf_counter()
    trainer = Trainer(config_from_dict(config))
    built = time.perf_counter()
    reports = [{k: m[k] for k in ("iteration", "time_s", "iterations_per_s")} for m in trainer.run()]
    end = time.perf_counter()
    return {"reports": reports, "build_s": built - start, "wall_s": end - start}


def metrics_worker() -> dict[str, Any]:
    """A real metrics dict of a tiny parity run (in a worker: a Trainer changes malloc settings)."""
    from ponder import ParityConfig, Trainer

    config = ParityConfig(n_elems=4, max_steps=3, n_hidden=8, batch_size=8, eval_samples=32, device="cpu")
    trainer = Trainer(config)
    trainer.train_step()
    return trainer.metrics()


def run_worker(*args: str) -> Any:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # what Ray sets for a 1-CPU trial
    cmd = [sys.executable, __file__, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


# -- 1. Tune overhead -------------------------------------------------------------------------------
def summarise(iterations: int, reports: list[dict[str, Any]], wall_s: float) -> dict[str, float]:
    """Training-only and end-to-end iterations/s of one run, from its per-evaluation reports."""
    return {
        "iterations": iterations,
        "train_ips": iterations / reports[-1]["time_s"],
        "interval_ips": statistics.median(r["iterations_per_s"] for r in reports),
        "best_interval_ips": max(r["iterations_per_s"] for r in reports),
        "e2e_ips": iterations / wall_s,
        "wall_s": wall_s,
    }


def direct_run(config: dict[str, Any]) -> dict[str, float]:
    out = run_worker("--worker", "direct", "--config", json.dumps(config))
    row = summarise(out["reports"][-1]["iteration"], out["reports"], out["wall_s"])
    row["build_s"] = out["build_s"]
    return row


def tune_run(spec_text: str, name: str) -> dict[str, float]:
    """One one-trial study through `run_study`; Ray started (timed) before it and shut down after."""
    import optuna
    import ray

    from study.run.runner import run_study
    from study.spec.spec import parse_spec
    from study.storage.storage import read_study_table

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line per run
    spec = parse_spec(spec_text, name)
    start = time.perf_counter()
    # the arguments of study.run.runner._init_ray, so that run_study finds Ray up and uses it as is
    ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    ray_init_s = time.perf_counter() - start
    try:
        start = time.perf_counter()
        outcome = run_study(spec, verbose=0)
        driver_s = time.perf_counter() - start
    finally:
        ray.shutdown()
    if outcome.statuses != {"completed": 1}:
        raise RuntimeError(f"the bench trial did not complete: {outcome.statuses}")
    trials = read_study_table(outcome.paths, "trials").to_pandas()
    history = read_study_table(outcome.paths, "history").to_pandas().sort_values("report")
    trial = trials.iloc[0]
    row = summarise(int(trial["iteration"]), history.to_dict("records"), float(trial["wall_time_s"]))
    row["ray_init_s"] = ray_init_s
    row["driver_s"] = driver_s
    return row


def tune_overhead(args: argparse.Namespace, root: Path) -> list[str]:
    from study.spec.spec import parse_spec

    def spec_text(storage: str) -> str:
        return SPEC_TEMPLATE.format(
            **SHAPES,
            iterations=args.iterations,
            eval_interval=args.eval_interval,
            lambda_p=LAMBDA_P,
            objective=OBJECTIVE,
            storage=json.dumps(storage),
        )

    storage = str(root / "tune-storage")
    config = parse_spec(spec_text(storage), "probe").config_for({"lambda_p": LAMBDA_P}).to_dict()
    print(
        f"config: {SHAPES}, iterations {args.iterations}, eval_interval {args.eval_interval}, CPU, 1 thread"
    )
    print("load average (1, 5, 15 min) before: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    runs: dict[str, list[dict[str, float]]] = {"direct": [], "tune": []}
    for r in range(args.rounds):
        order = ["direct", "tune"] if r < args.rounds - 1 else ["direct", "tune", "direct"]
        for which in order:
            if which == "direct":
                row = direct_run(config)
                extra = f"build {row['build_s']:.2f} s"
            else:
                row = tune_run(spec_text(storage), f"overhead-{r}")
                extra = f"ray.init {row['ray_init_s']:.2f} s, run_study {row['driver_s']:.2f} s"
            runs[which].append(row)
            print(
                f"  {which:6s} training {row['train_ips']:6.1f} it/s (interval median "
                f"{row['interval_ips']:6.1f}), end to end {row['e2e_ips']:6.1f} it/s, "
                f"wall {row['wall_s']:6.2f} s, {extra}"
            )

    print("load average (1, 5, 15 min) after:  " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))

    def median(which: str, key: str) -> float:
        return statistics.median(row[key] for row in runs[which])

    train_ratio = median("tune", "train_ips") / median("direct", "train_ips")
    e2e_ratio = median("tune", "e2e_ips") / median("direct", "e2e_ips")
    n_direct, n_tune = len(runs["direct"]), len(runs["tune"])
    print(f"medians of {n_direct} direct and {n_tune} Tune runs:")
    print(
        f"  training only (iterations / Trainer time_s, no evaluation): direct "
        f"{median('direct', 'train_ips'):.1f} it/s, tune {median('tune', 'train_ips'):.1f} it/s"
    )
    print(
        f"  end to end (iterations / trial wall time: build + train + evaluate, and under Tune "
        f"checkpoint + report): direct {median('direct', 'e2e_ips'):.1f} it/s "
        f"({median('direct', 'wall_s'):.2f} s), tune {median('tune', 'e2e_ips'):.1f} it/s "
        f"(time_total_s {median('tune', 'wall_s'):.2f} s)"
    )
    print(
        f"  fastest evaluation interval (the least disturbed by other load on the machine): direct "
        f"{median('direct', 'best_interval_ips'):.1f} it/s, tune {median('tune', 'best_interval_ips'):.1f} "
        f"it/s, ratio {median('tune', 'best_interval_ips') / median('direct', 'best_interval_ips'):.2f}"
    )
    print(
        f"  outside the trial: ray.init {median('tune', 'ray_init_s'):.2f} s; run_study in all "
        f"(Tuner, worker start, trial, export) {median('tune', 'driver_s'):.2f} s"
    )
    return [
        f"tune/direct iterations_per_s ratio {train_ratio:.2f} (target >= {RATIO_TARGET}) "
        "[training only, Trainer time_s]",
        f"tune/direct end-to-end iterations_per_s ratio {e2e_ratio:.2f} (target >= {RATIO_TARGET}) "
        "[time_total_s vs direct wall, incl. evaluation + Tune checkpoint/report]",
        f"ray.init: {median('tune', 'ray_init_s'):.2f} s (not part of the trial's throughput)",
    ]


# -- 2. Parquet export ------------------------------------------------------------------------------
STATUS_MIX = (
    ["completed"] * 12 + ["early_stopped"] * 4 + ["diverged"] * 2 + ["errored"] + ["running"]
)  # of 20


def synthetic_study(task: str, n_trials: int, n_reports: int, base: dict[str, Any], seed: int) -> list[Any]:
    """``n_trials`` TrialRecords of ``n_reports`` reports each (a restarted trial repeats a few)."""
    from ponder.tasks import eval_set_names, get_task
    from ponder.trainer import SET_LIST_METRICS, SET_METRICS, TRAIN_METRICS
    from study.records.parquet import TrialRecord

    rng = np.random.default_rng(seed)
    eval_interval = 250
    # the metric names a real run reports; a task's other sets get the test set's values
    set_base = np.array([float(base[f"test/{m}"]) for m in SET_METRICS])
    train_keys = [f"train/{m}" for m in TRAIN_METRICS]
    train_base = np.array([abs(float(base[k])) for k in train_keys])
    missing = [
        k for k in base if k.startswith("test/") and k.partition("/")[2] not in SET_METRICS + SET_LIST_METRICS
    ]
    if missing:
        raise RuntimeError(f"a parity run reports metrics this bench does not make up: {missing}")
    records = []
    for i in range(n_trials):
        searched = {
            "lambda_p": float(rng.uniform(0.05, 0.9)),
            "beta": float(10 ** rng.uniform(-4, -1)),
            "max_steps": int(rng.integers(2, 21)),
        }
        fixed = {"iterations": n_reports * eval_interval, "eval_interval": eval_interval, "device": "cpu"}
        config_obj = get_task(task).config(**fixed, **searched)
        config = {k: list(v) if isinstance(v, tuple) else v for k, v in config_obj.to_dict().items()}
        sets = eval_set_names(config_obj)
        set_keys = [[f"{s}/{m}" for m in SET_METRICS + SET_LIST_METRICS] for s in sets]
        n_steps = searched["max_steps"]
        status = STATUS_MIX[i % len(STATUS_MIX)]
        trial_id = f"{seed * 40503 % 0xFFFFF:05x}_{i:05d}"  # Tune's form: experiment tag, index
        # the random draws of all the trial's reports at once: (report, set, metric or step)
        scalars = rng.uniform(0.8, 1.2, (n_reports, len(sets), len(SET_METRICS))) * set_base
        scalars[:, :, 0] = np.minimum(scalars[:, :, 0], 1.0)  # halted_accuracy
        per_step = rng.uniform(0.4, 1.0, (n_reports, len(sets), n_steps)).tolist()
        halting = rng.dirichlet(np.ones(n_steps), (n_reports, len(sets))).tolist()
        train = (rng.uniform(0.5, 1.5, (n_reports, len(TRAIN_METRICS))) * train_base).tolist()
        speeds = (base["iterations_per_s"] * rng.uniform(0.8, 1.2, n_reports)).tolist()
        scalar_rows = scalars.tolist()
        history = []
        t_train = t_total = 0.0
        for k in range(1, n_reports + 1):
            last = k == n_reports
            outcome = {"completed": "completed", "diverged": "diverged"}.get(status, "running")
            r: dict[str, Any] = {
                "iteration": k * eval_interval,
                "outcome": outcome if last else "running",
                "nan_events": 101 if last and status == "diverged" else 0,
            }
            if not (last and status == "diverged"):  # tune_metrics leaves non-finite numbers out
                r.update(zip(train_keys, train[k - 1], strict=True))
            t_this = eval_interval / speeds[k - 1]
            t_train += t_this
            t_total += t_this + 0.3  # + evaluation, checkpoint and report
            r["time_s"] = t_train
            r["iterations_per_s"] = speeds[k - 1]
            for j, keys in enumerate(set_keys):
                r.update(zip(keys[: len(SET_METRICS)], scalar_rows[k - 1][j], strict=True))
                r[keys[len(SET_METRICS)]] = per_step[k - 1][j]
                r[keys[len(SET_METRICS) + 1]] = halting[k - 1][j]
            r.update(  # the keys train_trial adds, and Tune's own
                {
                    "node_ip": "10.0.0.2",
                    "device": "cpu",
                    "gpu_ids": "",
                    "timestamp": 1_700_000_000 + int(t_total),
                    "checkpoint_dir_name": f"checkpoint_{k - 1:06d}",
                    "should_checkpoint": True,
                    "done": last and status in ("completed", "diverged"),
                    "training_iteration": k,
                    "trial_id": trial_id,
                    "date": "2025-01-01_12-00-00",
                    "time_this_iter_s": t_this + 0.3,
                    "time_total_s": t_total,
                    "pid": 4242,
                    "hostname": "bench",
                    "time_since_restore": t_total,
                    "iterations_since_restore": k,
                    "config": config,
                }
            )
            history.append(r)
        if task == "parity" and not set(base) <= set(history[0]):
            raise RuntimeError(f"synthetic reports lack {sorted(set(base) - set(history[0]))}")
        retries = 0
        if i % 17 == 5:  # restarted from a checkpoint: the last three reports come twice
            history = history[: n_reports // 2] + history[n_reports // 2 - 3 :]
            retries = 1
        records.append(
            TrialRecord(
                trial_id=trial_id,
                tune_status={"errored": "ERROR", "running": "RUNNING"}.get(status, "TERMINATED"),
                config=config,
                history=history,
                stopped_early=status == "early_stopped",
                ended=status not in ("running", "errored"),
                error="RuntimeError: CUDA error: out of memory" if status == "errored" else None,
                checkpoint_path=f"/results/tune/{task}/trial_{trial_id}/checkpoint_{n_reports - 1:06d}",
                retries=retries,
            )
        )
    return records


def export(records: list[Any], root: str, name: str) -> dict[str, float]:
    """Time the two tables and the two writes, as `study.run.export.write_tables` does them."""
    from study.records.parquet import history_table, trials_table
    from study.storage.storage import StudyPaths, write_parquet

    paths = StudyPaths(root, name)
    t0 = time.perf_counter()
    trials = trials_table(records, OBJECTIVE, "max")
    t1 = time.perf_counter()
    history = history_table(records)
    t2 = time.perf_counter()
    write_parquet(paths.trials_parquet, trials)
    write_parquet(paths.history_parquet, history)
    t3 = time.perf_counter()
    return {"trials_table": t1 - t0, "history_table": t2 - t1, "write": t3 - t2, "total": t3 - t0}


def timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def parquet_export(args: argparse.Namespace, root: str) -> list[str]:
    from study.records.parquet import parse_result_lines

    base = run_worker("--worker", "metrics")
    start = time.perf_counter()
    parity = synthetic_study("parity", args.trials, args.reports, base, seed=1)
    n_mnist = max(1, args.trials // 4)
    mnist = synthetic_study("mnist", n_mnist, args.reports, base, seed=2)
    print(f"built {len(parity) + len(mnist)} synthetic TrialRecords in {time.perf_counter() - start:.1f} s")
    runs = [export(parity, root, "parity-synthetic") for _ in range(args.repeats)]
    for k, run in enumerate(runs, start=1):
        parts = ", ".join(f"{key} {value:.2f} s" for key, value in run.items() if key != "total")
        print(f"  export {args.trials}x{args.reports} #{k}: {run['total']:.2f} s ({parts})")
    mnist_runs = [export(mnist, root, "mnist-synthetic") for _ in range(args.repeats)]
    total = statistics.median(run["total"] for run in runs)
    # write_tables first reads every trial's result.json back (study.run.export._history): not in the
    # target, but paid at every refresh of a live study's Parquet
    texts = ["\n".join(json.dumps(r) for r in rec.history) + "\n" for rec in parity]
    parse_times, _ = timed(lambda: [parse_result_lines(t) for t in texts], args.repeats)
    parse_s = statistics.median(parse_times)
    mb = sum(len(t) for t in texts) / 1e6
    print(f"  parse_result_lines of the {len(texts)} result.json texts ({mb:.0f} MB): {parse_s:.2f} s")
    mnist_total = statistics.median(run["total"] for run in mnist_runs)
    for name in ("parity-synthetic", "mnist-synthetic"):
        files = sorted(Path(root).glob(f"*/study={name}/*.parquet"))
        print(f"  {name}: " + ", ".join(f"{f.name} {f.stat().st_size / 1e6:.1f} MB" for f in files))
    return [
        f"parquet export {args.trials}x{args.reports}: {total:.2f} s (target <= {EXPORT_TARGET_S:g} s) "
        f"[median of {args.repeats}]",
        f"parquet export {n_mnist}x{args.reports} (mnist-like, rotated sets): {mnist_total:.2f} s",
        f"result.json parsing {args.trials}x{args.reports} (write_tables' read before the export): "
        f"{parse_s:.2f} s",
    ]


# -- 3. cross-study query ---------------------------------------------------------------------------
LAMBDA_BINS = [0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0]


def query(root: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series]:
    """The trials of every study, the best trial per study, mean halting step by lambda_p bucket."""
    df = pd.read_parquet(os.path.join(root, "trials"))
    ranked = df.dropna(subset=[OBJECTIVE]).sort_values(OBJECTIVE, ascending=False)
    best = ranked.drop_duplicates("study")[["study", "trial_id", "lambda_p", "beta", "max_steps", OBJECTIVE]]
    bucket = pd.cut(df["lambda_p"], LAMBDA_BINS)
    steps = df.groupby(["study", bucket], observed=True)["test/mean_halting_step"].mean()
    return df, best, steps


def history_join(root: str) -> pd.DataFrame:
    """Every report with its trial's status and searched fields."""
    trials = pd.read_parquet(
        os.path.join(root, "trials"), columns=["study", "trial_id", "status", "lambda_p", "beta", "max_steps"]
    )
    history = pd.read_parquet(os.path.join(root, "history"))
    return history.merge(trials, on=["study", "trial_id"], how="left", validate="many_to_one")


def cross_study(args: argparse.Namespace, root: str) -> list[str]:
    repeats = max(args.repeats, 3)
    query_times, (df, best, steps) = timed(lambda: query(root), repeats)
    join_times, joined = timed(lambda: history_join(root), repeats)
    print(f"  trials of all studies: {len(df)} rows x {df.shape[1]} columns")
    for row in best.itertuples(index=False):
        print(f"  best of {row[0]}: trial {row[1]}, lambda_p {row[2]:.3f}, {OBJECTIVE} {row[5]:.3f}")
    print(f"  mean test/mean_halting_step by lambda_p bucket: {len(steps)} (study, bucket) cells")
    print(f"  history joined to trials: {len(joined)} rows x {joined.shape[1]} columns")
    print("  query times: " + ", ".join(f"{t:.3f}" for t in query_times) + " s")
    print("  join times:  " + ", ".join(f"{t:.3f}" for t in join_times) + " s")
    q, j = statistics.median(query_times), statistics.median(join_times)
    return [
        f"cross-study query: {q:.3f} s (target <= {QUERY_TARGET_S:g} s) "
        f"[read trials dataset + best per study + pd.cut groupby; median of {repeats}, first "
        f"{query_times[0]:.3f} s]",
        f"history read + join to trials on (study, trial_id): {j:.3f} s [median of {repeats}, "
        f"first {join_times[0]:.3f} s]",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=2000, help="training iterations of the trial")
    parser.add_argument("--eval-interval", type=int, default=250, help="iterations between evaluations")
    parser.add_argument("--rounds", type=int, default=2, help="Tune runs (direct runs: one more)")
    parser.add_argument("--trials", type=int, default=200, help="trials of the synthetic parity study")
    parser.add_argument("--reports", type=int, default=100, help="reports per synthetic trial")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of the export and query")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke check")
    parser.add_argument("--worker", choices=["direct", "metrics"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "direct":
        print(json.dumps(direct_worker(json.loads(args.config))))
        return
    if args.worker == "metrics":
        print(json.dumps(metrics_worker()))
        return
    if args.quick:
        args.iterations, args.eval_interval, args.rounds = 200, 50, 1
        args.trials, args.reports, args.repeats = 20, 10, 1

    start = time.perf_counter()
    results: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tune_overhead.") as tmp:
        print("1. Tune overhead: one trial under Ray Tune against the same config run directly")
        results += tune_overhead(args, Path(tmp))
        root = os.path.join(tmp, "results")
        print(f"2. Parquet export: synthetic studies as TrialRecords -> {root}")
        results += parquet_export(args, root)
        print("3. cross-study pandas query over both studies")
        results += cross_study(args, root)
    print(f"--- summary (bench wall time {time.perf_counter() - start:.0f} s)")
    for line in results:
        print(line)


if __name__ == "__main__":
    main()
