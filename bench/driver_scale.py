"""What the driver costs per trial as a study grows: start, reports and end of each trial.

A study of N trials runs through the real driver code, in this process, with synthetic trials in
place of Ray actors: Tune's `TuneController` (its trial bookkeeping, its saves of the experiment
state, the loggers a study keeps: each trial's ``result.json``), the study's searcher
(`study.search.search.make_searcher`: Optuna in its journal, in Tune's `ConcurrencyLimiter` and
`SearchGenerator`), its scheduler (`study.search.search.make_scheduler`: `PersistentASHA`, end records,
the started records) and its callbacks (`study.run.runner.study_callbacks`: the Parquet on its
budget). Each trial is created by the searcher (``next_trial``), chosen by the scheduler, reported to
through ``TuneController._process_trial_result`` (scheduler, searcher, callbacks, as a real report
is) and stopped through ``TuneController.stop_trial`` (a trial reaching its budget or stopped by
ASHA); ``--concurrent`` trials are live at once, one report each per step of the loop, which ends
as Tune's does (its periodic save, the callbacks' step end). The reports are
`bench/tune_overhead.py`'s synthetic parity records (the metric names a real run reports). What is
timed is the driver's time in those calls, nothing a trial's worker would do; every trial is timed.

For each N (``--sizes``, default 100 1000 10000) it prints the driver's cost per trial, split into
start / reports / end / step (Tune's periodic save and the callbacks' step end, shared among the
live trials), averaged over the last ``--window`` trials of the study (default: the last tenth, 50
at least; a size whose window is under `MIN_TIMED` trials runs as many studies as make that many,
their windows pooled; the step over the study's second half, which holds several of Tune's periodic
saves, each longer as the study grows and rarer in step), and the study's total driver time; the
syncs to the disk a trial (``os.fsync`` calls: the end records, the journal, the Parquet) and the
journal's appends; the study's end as the driver makes it (Tune's final save, the Parquet written
whole, Optuna's orphans, the summary);
and Optuna's own cost at that N, in the same run: the same sampler with the study's trials
copied into an in-memory study, then ``--own`` trials of ask (the space's three parameters), the
same reports and a tell, timed; ``minus Optuna`` is the driver's cost less Optuna's own; and,
where TPE asked in its processes (`study.search.asker`), the mean CPU of each process's last
asks (a window's worth) and how many processes drew.
``--s3`` puts the study on moto's S3 server (its requests counted); ``--tensorboard`` turns the
spec's ``[run] tensorboard`` on. Then the Parquet recipes of docs/parquet.md (pandas)
over the studies, timed. The last line: ``growth <cost per trial at the largest N / at the smallest>``.

    .venv/bin/python bench/driver_scale.py [--sizes 100 1000 10000] [--sampler tpe] [--s3] [--quick]

About 25 minutes at the default sizes on the 2-core machine (the 10,000-trial study is most of
it); ``--quick`` (20 and 60 trials) a minute. `bench/driver_cost.py` measures real trials through
``ponder-study run`` against plain Tune and plain Optuna.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

SPEC = """\
description = "bench/driver_scale.py: synthetic trials through the real driver"
task = "parity"

[config]
n_elems = 8
iterations = {iterations}
eval_interval = 250

[space.lambda_p]
low = 0.05
high = 0.9

[space.beta]
low = 1e-4
high = 0.1
log = true

[space.max_steps]
low = 4
high = 20

[search]
sampler = "{sampler}"
seed = 0
num_samples = {n}
max_concurrent = {concurrent}

[scheduler]
metric = "test/halted_accuracy"
mode = "max"
grace_period = 750
reduction_factor = 3
brackets = 1

[resources]
cpu = 1
gpu = 0

[run]
storage = {storage}
max_failures = 0
tensorboard = {tensorboard}
"""

PHASES = ("start", "reports", "end", "step")
DROP = {"config", "trial_id", "should_checkpoint", "checkpoint_dir_name", "done"}


def _reports(base: dict[str, Any], n_trials: int, n_reports: int) -> list[list[dict[str, Any]]]:
    """Each trial's results as Tune would get them (synthetic parity records)."""
    import tune_overhead

    records = tune_overhead.synthetic_study("parity", n_trials, n_reports, base, seed=3)
    return [[{k: v for k, v in r.items() if k not in DROP} for r in rec.reports] for rec in records]


def trainable(config: dict[str, Any]) -> None:  # registered with Tune; never runs here
    raise RuntimeError("bench/driver_scale.py drives trials itself")


class _Syncs:
    """Counts the driver's ``os.fsync`` calls (every sync of the study's files goes through it)."""

    def __init__(self) -> None:
        self.count = 0
        self._fsync = os.fsync

    def __enter__(self) -> _Syncs:
        def counted(fd: int) -> None:
            self.count += 1
            self._fsync(fd)

        os.fsync = counted
        return self

    def __exit__(self, *exc: object) -> None:
        os.fsync = self._fsync


MIN_TIMED = 200
"""The fewest trials a figure averages: a size whose window is smaller runs that many studies
(N = 100, a window of 50: four studies), so that one of Tune's periodic saves or one full
garbage collection falling in a window or not moves the figure less."""


def measure(
    n: int, storage: str, args: argparse.Namespace, reports: list[list[dict[str, Any]]]
) -> dict[str, Any]:
    """The driver's cost a trial at ``n``: the windows of as many studies of ``n`` trials as
    `MIN_TIMED` needs, pooled; the first study's other figures."""
    window = args.window or max(50, n // 10)
    runs = [run_study(n, storage, args, reports, r) for r in range(max(1, -(-MIN_TIMED // window)))]
    row = dict(runs[0])
    timed = sum(r["window"] for r in runs)
    row["per_trial"] = {p: sum(r["per_trial"][p] * r["window"] for r in runs) / timed for p in PHASES}
    row["cost"] = sum(row["per_trial"].values())
    row["window"], row["studies"] = timed, len(runs)
    return row


def run_study(
    n: int, storage: str, args: argparse.Namespace, reports: list[list[dict[str, Any]]], repeat: int = 0
) -> dict[str, Any]:
    """One study of ``n`` synthetic trials (the ``repeat``-th of that size, from 0); the driver's
    time per phase, per trial."""
    import contextlib

    from study.storage.storage import sole_writer

    with sole_writer(), contextlib.ExitStack() as stack:  # as study.run.runner._fit, under its lease
        return _run_study(n, storage, args, reports, repeat, stack)


def _run_study(
    n: int,
    storage: str,
    args: argparse.Namespace,
    reports: list[list[dict[str, Any]]],
    repeat: int,
    stack: Any,
) -> dict[str, Any]:
    from ray.tune import Experiment
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial
    from ray.tune.progress_reporter import TrialProgressCallback
    from ray.tune.search import SearchGenerator
    from ray.tune.utils.callback import _create_default_callbacks

    from study.reports.summary import summary
    from study.run.export import finished_parquet
    from study.run.runner import _space, fail_orphaned_optuna_trials, study_callbacks
    from study.run.slim_trials import kept_statistics
    from study.search import ray_private
    from study.search.asker import ProcessAsker
    from study.search.journal import flush_journals
    from study.search.search import make_scheduler, make_searcher
    from study.spec.spec import parse_spec
    from study.storage.storage import StudyPaths, share_filesystems_when_copied, write_bytes

    share_filesystems_when_copied()  # as study.run.runner._prepare_driver does before Tune starts
    ray_private.remember_registered()
    ray_private.tune_json_in_c()
    ray_private.incremental_uploads()
    name = f"scale-{n}" if repeat == 0 else f"scale-{n}-{repeat}"
    text = SPEC.format(
        iterations=250 * args.reports,
        sampler=args.sampler,
        n=n,
        concurrent=args.concurrent,
        storage=f'"{storage}"',
        tensorboard=str(args.tensorboard).lower(),
    )
    spec = parse_spec(text, name)
    # Tune's running statistics of the objectives only, as study.run.runner._fit has them kept
    stack.enter_context(ray_private.running_statistics_of(kept_statistics(spec.front_objectives)))
    paths = StudyPaths(storage, name)
    write_bytes(paths.spec, text.encode())
    searcher = make_searcher(spec, paths)
    drawn: list[float] = []  # the CPU of each draw TPE made in its processes (study.search.asker)
    askers: list[int] = []  # the processes it drew in, a 1 for each
    close = ProcessAsker.close
    stack.callback(setattr, ProcessAsker, "close", close)

    def closed(asker: ProcessAsker) -> None:
        drawn.extend(asker.drawn_cpu[-(args.window or max(50, n // 10)) :])  # its last, near N
        askers.append(1)
        close(asker)

    ProcessAsker.close = closed  # type: ignore[method-assign]
    search_alg = SearchGenerator(searcher)
    search_alg.set_search_properties(spec.metric, spec.mode, _space(spec))
    experiment = Experiment(
        name=name, run=trainable, config=_space(spec), num_samples=n, storage_path=paths.tune_root
    )
    search_alg.add_configurations([experiment])
    scheduler = make_scheduler(spec, paths)
    scheduler.set_search_properties(spec.metric, spec.mode)
    callbacks = [  # the study's and the loggers it keeps (result.json), not Tune's terminal output
        c
        for c in _create_default_callbacks(study_callbacks(spec, paths), metric=spec.metric)
        if not isinstance(c, TrialProgressCallback)
    ]
    controller = TuneController(
        search_alg=search_alg,
        scheduler=scheduler,
        storage=experiment.storage,
        callbacks=callbacks,
        metric=spec.metric,
        checkpoint_period="auto",
    )
    if args.server is not None:
        args.server.take()  # from zero: this study's requests only
    spent: dict[str, list[float]] = {p: [0.0] * n for p in PHASES}
    index: dict[str, int] = {}
    live: list[Trial] = []
    progress: dict[str, int] = {}
    started = 0
    wall = time.perf_counter()
    syncs = _Syncs()
    with syncs:
        while started < n or live:
            while started < n and len(live) < args.concurrent:
                t0 = time.perf_counter()
                trial = search_alg.next_trial()
                if trial is None:
                    raise RuntimeError("the searcher gave no trial")
                controller.add_trial(trial)
                chosen = scheduler.choose_trial_to_run(controller._wrapped())
                if chosen is not trial:
                    raise RuntimeError(f"the scheduler chose {chosen}, not the new {trial}")
                trial.init_local_path()
                controller._callbacks.on_trial_start(
                    iteration=controller._iteration, trials=controller._trials, trial=trial
                )
                controller._set_trial_status(trial, Trial.RUNNING)
                controller._mark_trial_to_checkpoint(trial)
                index[trial.trial_id] = started
                spent["start"][started] += time.perf_counter() - t0
                progress[trial.trial_id] = 0
                live.append(trial)
                started += 1
            for trial in list(live):
                i = index[trial.trial_id]
                k = progress[trial.trial_id]
                result = dict(reports[i][k])
                last = k == len(reports[i]) - 1
                result["done"] = last
                t0 = time.perf_counter()
                controller._iteration += 1
                controller._process_trial_result(trial, result)
                decision = controller._queued_trial_decisions.pop(trial.trial_id, None)
                stop = decision == "STOP" or last
                if stop:
                    controller.stop_trial(trial)
                spent["end" if stop else "reports"][i] += time.perf_counter() - t0
                progress[trial.trial_id] = k + 1
                if stop:
                    live.remove(trial)
            t0 = time.perf_counter()
            controller.checkpoint()  # Tune's periodic save, once per step of its loop (self-throttled)
            controller._callbacks.on_step_end(iteration=controller._iteration, trials=controller._trials)
            step = time.perf_counter() - t0
            for trial in live or controller.get_trials()[-1:]:
                spent["step"][index[trial.trial_id]] += step / max(1, len(live))
        wall = time.perf_counter() - wall
        in_run = syncs.count
        requests = _requests(args.server.take(), n) if args.server is not None else None
        # the study's end as study.run.runner._fit makes it: Tune's final save, the callbacks' end
        # of the experiment (the Parquet written whole), Optuna's orphans, the summary printed
        end: dict[str, float] = {}
        t0 = time.perf_counter()
        controller.checkpoint(force=True, wait=True)
        end["tune"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        controller._callbacks.on_experiment_end(trials=controller.get_trials())
        if finished_parquet(paths) is None:
            raise RuntimeError("the Parquet callback did not write the study whole")
        flush_journals(commit=True)
        end["parquet"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        fail_orphaned_optuna_trials(spec, paths)
        end["optuna"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        summary(paths, spec.metric, spec.mode)
        end["summary"] = time.perf_counter() - t0
    window = range(max(0, n - (args.window or max(50, n // 10))), n)
    per_trial = {p: statistics.fmean(spent[p][i] for i in window) for p in PHASES}
    # Tune's periodic save of the experiment grows with the study and waits 19 times its length
    # (at most 5 % of the time): at 10,000 trials one save of seconds falls in the last tenth or
    # not, so the step is averaged over the study's second half, which holds several
    per_trial["step"] = statistics.fmean(spent["step"][i] for i in range(min(n // 2, window.start), n))
    statuses: dict[str, int] = {}
    for t in controller.get_trials():
        statuses[t.status] = statuses.get(t.status, 0) + 1
    journal = searcher.searcher._storage._backend  # the study's StudyJournal
    return {
        "n": n,
        "per_trial": per_trial,
        "cost": sum(per_trial.values()),
        "window": len(window),
        "total": sum(sum(spent[p]) for p in PHASES),
        "end": end,
        "wall": wall,
        "statuses": statuses,
        "syncs": in_run / n,
        "appends": journal.appends / n,
        "own": optuna_own(paths, spec, args) if args.own and repeat == 0 else None,
        "drawn": statistics.fmean(drawn) if drawn else None,
        "askers": len(askers),
        "requests": requests,
        "paths": paths,
    }


def optuna_own(paths: Any, spec: Any, args: argparse.Namespace) -> float:
    """Optuna's own cost a trial at this N: the same sampler over the study's trials, copied into
    an in-memory study, then ``args.own`` trials of ask, the same reports and a tell, timed."""
    import optuna

    from study.search.journal import optuna_storage
    from study.search.search import SamplerRecipe

    done = optuna.load_study(study_name=paths.name, storage=optuna_storage(paths))
    trials = done.get_trials(deepcopy=False)
    study = optuna.create_study(
        direction=spec.mode + "imize", sampler=SamplerRecipe.of(spec).build(asked=len(trials))
    )
    study.add_trials(trials)
    space = trials[0].distributions
    t0 = time.perf_counter()
    for k in range(args.own):
        trial = study.ask(fixed_distributions=space)
        for r in range(args.reports):
            trial.report(0.5 + 0.01 * r, 250 * (r + 1))
        study.tell(trial, 0.5 + 0.001 * k)
    return (time.perf_counter() - t0) / args.own


def recipes(root: str) -> tuple[float, float]:
    """The Parquet recipes (docs/parquet.md, where the README links) run over ``root`` as
    ``results/``: (first, median of 3) seconds."""
    readme = (REPO / "docs" / "parquet.md").read_text()
    block = readme.split("<!-- recipes -->", 1)[1].split("<!-- /recipes -->", 1)[0]
    code = re.findall(r"```python\n(.*?)```", block, flags=re.S)[0]
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="driver_scale_recipes.") as tmp:
        os.symlink(root, os.path.join(tmp, "results"), target_is_directory=True)
        os.chdir(tmp)
        try:
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                exec(compile(code, "docs/parquet.md", "exec"), {})
                times.append(time.perf_counter() - t0)
        finally:
            os.chdir(here)
    return times[0], statistics.median(times)


def _moto(root: str) -> tuple[Any, str]:
    """moto's S3 server in a process of its own (in this one, its threads' work would take the
    driver's GIL and show as driver time a real object store does not cost), counting every
    request it answers (`bench/resume_reads.py`'s server)."""
    import pyarrow.fs as pafs
    from resume_reads import CountingS3

    server = CountingS3()
    os.environ.update(
        AWS_ENDPOINT_URL=server.endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        PONDER_STUDY_CACHE=os.path.join(root, "cache"),
    )
    pafs.S3FileSystem(endpoint_override=server.endpoint, allow_bucket_creation=True).create_dir("bench")
    return server, "s3://bench/studies"


def _requests(counts: Any, n: int) -> str:
    """The S3 requests of a study's run, a trial: writes (PUT, POST, DELETE) by where they went
    (the study's records, Tune's folder, the Parquet), then reads (GET, HEAD, LIST)."""
    writes: dict[str, int] = {}
    reads = 0
    for (method, key), k in counts.items():
        if method in ("PUT", "POST", "DELETE"):
            part = key.split("/")[2] if key.count("/") >= 2 else key
            where = {"studies": "records", "tune": "Tune", "trials": "Parquet", "history": "Parquet"}
            writes[where.get(part, part)] = writes.get(where.get(part, part), 0) + k
        else:
            reads += k
    parts = ", ".join(f"{w} {k / n:.1f}" for w, k in sorted(writes.items()))
    return f"S3 writes {sum(writes.values()) / n:.1f} a trial ({parts}), reads {reads / n:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", help="study sizes N (default 100 1000 10000)")
    parser.add_argument("--reports", type=int, default=12, help="reports per trial (parity.toml: 12)")
    parser.add_argument("--concurrent", type=int, default=4, help="trials live at once")
    parser.add_argument("--window", type=int, help="last trials whose cost is averaged (default N/10, >= 50)")
    parser.add_argument(
        "--sampler", default="random", help="the spec's sampler (TPE's own cost grows with N)"
    )
    parser.add_argument("--own", type=int, default=100, help="trials timed for Optuna's own cost (0: none)")
    parser.add_argument("--s3", action="store_true", help="store the studies on moto's S3 server")
    parser.add_argument(
        "--tensorboard", action="store_true", help="the spec's [run] tensorboard on: its cost a trial"
    )
    parser.add_argument("--no-recipes", action="store_true", help="skip the Parquet recipes' timing")
    parser.add_argument("--keep", action="store_true", help="keep the studies' directory (printed)")
    parser.add_argument("--quick", action="store_true", help="sizes 20 60, a smoke check")
    args = parser.parse_args()
    args.sizes = args.sizes or [100, 1000, 10000]
    if args.quick:
        args.sizes, args.window = [20, 60], 10

    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", str(args.concurrent))
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    import optuna
    import ray
    import tune_overhead

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    tmp = tempfile.mkdtemp(prefix="driver_scale.")
    server, storage = _moto(tmp) if args.s3 else (None, os.path.join(tmp, "results"))
    args.server = server
    base = tune_overhead.run_worker("--worker", "metrics")
    reports = _reports(base, max(args.sizes), args.reports)
    ray.init(
        address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
    )
    where = "S3 (moto server)" if args.s3 else "a local directory"
    print(
        f"driver cost per trial, {args.reports} reports a trial, {args.concurrent} live at once, "
        f"sampler {args.sampler}, on {where}, TensorBoard {'on' if args.tensorboard else 'off'}; "
        "every trial timed, averaged over the study's last trials"
    )
    rows = []
    try:
        for n in args.sizes:
            row = measure(n, storage, args, reports)
            rows.append(row)
            parts = ", ".join(f"{p} {row['per_trial'][p] * 1e3:.1f} ms" for p in PHASES)
            own = ""
            if row["own"] is not None:
                own = (
                    f"; Optuna's own {row['own'] * 1e3:.1f} ms a trial at this N, "
                    f"the driver minus Optuna {(row['cost'] - row['own']) * 1e3:.1f} ms"
                )
            if row["drawn"] is not None:
                own += (
                    f"; TPE's ask {row['drawn'] * 1e3:.1f} ms of CPU, in {row['askers']} "
                    f"process{'es' if row['askers'] > 1 else ''}"
                )
            end = ", ".join(f"{k} {v:.2f} s" for k, v in row["end"].items())
            end = f"{sum(row['end'].values()):.1f} s ({end})"
            print(
                f"N={n}: {row['cost'] * 1e3:.1f} ms per trial over the last {row['window']}"
                + (f" of {row['studies']} studies" if row["studies"] > 1 else "")
                + f" ({parts}){own}; "
                f"{row['syncs']:.2f} fsyncs and {row['appends']:.2f} journal appends a trial; "
                f"total driver time {row['total']:.1f} s; study end {end}; "
                f"bench wall {row['wall']:.0f} s; {row['statuses']}"
                + (f"; {row['requests']}" if row["requests"] else "")
            )
        if not args.s3 and not args.no_recipes:
            first, median = recipes(storage)
            print(
                "Parquet recipes (docs/parquet.md, pandas) over results/ "
                f"({sum(args.sizes)} trials, {len(args.sizes)} studies): "
                f"first {first:.3f} s, median of 3 {median:.3f} s (target <= 1 s)"
            )
    finally:
        ray.shutdown()
        if server is not None:
            server.stop()
        if args.keep:
            print(f"the studies are in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)  # 10,000 trials' directories: hundreds of MB
    print(f"growth {rows[-1]['cost'] / rows[0]['cost']:.2f}")


if __name__ == "__main__":
    main()
