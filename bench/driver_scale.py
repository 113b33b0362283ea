"""What the driver costs per trial as a study grows: start, reports and end of each trial.

A study of N trials runs through the real driver code, in this process, with synthetic trials in
place of Ray actors: Tune's `TuneController` (its trial bookkeeping, its saves of the experiment
state, its default loggers that write each trial's ``result.json``), the study's searcher
(`study.search.search.make_searcher`: Optuna in its journal, in Tune's `ConcurrencyLimiter` and
`SearchGenerator`), its scheduler (`study.search.search.make_scheduler`: `PersistentASHA`, end records,
the state save before a new trial starts) and its `study.run.export.ParquetCallback`. Each trial is
created by the searcher (``next_trial``), chosen by the scheduler, reported to through
``TuneController._process_trial_result`` (scheduler, searcher, callbacks, as a real report is)
and stopped through ``TuneController.stop_trial`` (a trial reaching its budget or stopped by
ASHA); ``--concurrent`` trials are live at once, one report each per step. The reports are
`bench/tune_overhead.py`'s synthetic parity records (the metric names a real run reports).
What is timed is the driver's time in those calls, nothing a trial's worker would do.

For each N (``--sizes``, default 100 500 2000) it prints the driver's cost per trial, split into
start / reports / end / Tune's periodic save, measured over the last ``--window`` trials of the
study (its cost per trial at that size), and the study's total driver time when every trial was
timed. ``--fast-prefix`` runs the first N - window trials without the Parquet refresh and the
forced state save (then writes the Parquet once, and the callback reads it back as a driver does
once, at its first trial end: timed apart): the two costs that would grow with the study, left
out of the prefix, the only way to reach N = 2000 in a bench's time. ``--s3`` puts the study on
moto's S3 server. Then the Parquet recipes of docs/parquet.md (pandas) over the 2,000-trial
study, timed. The last line: ``growth <cost per trial at the largest N / cost per trial at the smallest>``.

With ``--real`` it runs real trials instead: the shipped ``parity-smoke`` study (tiny parity
trials, TPE, ASHA) with ``--num-samples N`` for each N (default 20 100 500), the real command
(``ponder-study run``, progress table on) joined to one local Ray instance that the bench starts,
and it times the driver process's CPU (user + system: everything the driver does, the imports
included, none of the trials' work, which runs in Ray's workers). It prints each study's driver
CPU per trial and the marginal cost per trial between successive sizes; the last line is
``growth <marginal at the last step / marginal at the first>``.

    .venv/bin/python bench/driver_scale.py [--sizes 100 500 2000] [--s3] [--fast-prefix] [--quick]
    .venv/bin/python bench/driver_scale.py --real [--sizes 20 100 500]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
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
"""

PHASES = ("start", "reports", "end", "tune_save")
DROP = {"config", "trial_id", "should_checkpoint", "checkpoint_dir_name", "done"}


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def _without_refresh() -> Iterator[None]:
    """The Parquet refresh at a trial's end and the forced state save before a trial starts,
    both off (the prefix of ``--fast-prefix``)."""
    from ray.tune.execution.tune_controller import TuneController

    from study.run.export import ParquetCallback

    write, save = ParquetCallback._write, TuneController.checkpoint

    def checkpoint(self: Any, force: bool = False, wait: bool = False) -> None:
        if not force:
            save(self, force=force, wait=wait)

    ParquetCallback._write = _noop  # type: ignore[method-assign]
    TuneController.checkpoint = checkpoint  # type: ignore[method-assign]
    try:
        yield
    finally:
        ParquetCallback._write = write  # type: ignore[method-assign]
        TuneController.checkpoint = save  # type: ignore[method-assign]


def _reports(base: dict[str, Any], n_trials: int, n_reports: int) -> list[list[dict[str, Any]]]:
    """Each trial's results as Tune would get them (synthetic parity records)."""
    import tune_overhead

    records = tune_overhead.synthetic_study("parity", n_trials, n_reports, base, seed=3)
    return [[{k: v for k, v in r.items() if k not in DROP} for r in rec.reports] for rec in records]


def trainable(config: dict[str, Any]) -> None:  # registered with Tune; never runs here
    raise RuntimeError("bench/driver_scale.py drives trials itself")


def run_study(
    n: int, storage: str, args: argparse.Namespace, reports: list[list[dict[str, Any]]]
) -> dict[str, Any]:
    """One study of ``n`` synthetic trials; the driver's time per phase, per trial."""
    from ray.tune import Experiment
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial
    from ray.tune.progress_reporter import TrialProgressCallback
    from ray.tune.search import SearchGenerator
    from ray.tune.utils.callback import _create_default_callbacks

    from study.run.export import LiveParquet, ParquetCallback
    from study.run.runner import _space, study_callbacks
    from study.search.search import make_scheduler, make_searcher
    from study.spec.spec import parse_spec
    from study.storage.storage import StudyPaths, share_filesystems_when_copied, write_bytes

    share_filesystems_when_copied()  # as study.run.runner._fit does before Tune starts
    name = f"scale-{n}"
    iterations = 250 * args.reports
    text = SPEC.format(
        iterations=iterations,
        sampler=args.sampler,
        n=n,
        concurrent=args.concurrent,
        storage=f'"{storage}"',
    )
    spec = parse_spec(text, name)
    paths = StudyPaths(storage, name)
    write_bytes(paths.spec, text.encode())
    searcher = make_searcher(spec, paths)
    search_alg = SearchGenerator(searcher)
    search_alg.set_search_properties(spec.metric, spec.mode, _space(spec))
    experiment = Experiment(
        name=name, run=trainable, config=_space(spec), num_samples=n, storage_path=paths.tune_root
    )
    search_alg.add_configurations([experiment])
    scheduler = make_scheduler(spec, paths)
    scheduler.set_search_properties(spec.metric, spec.mode)
    ours = study_callbacks(spec, paths)
    parquet = next(c for c in ours if isinstance(c, ParquetCallback))
    callbacks = [  # Tune's loggers (result.json, progress.csv, TensorBoard), not its terminal output
        c
        for c in _create_default_callbacks(ours, metric=spec.metric)
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
    measured_from = max(0, n - args.window) if args.fast_prefix else 0
    loaded = 0.0
    spent: dict[str, list[float]] = {p: [0.0] * n for p in PHASES}
    index: dict[str, int] = {}
    live: list[Trial] = []
    progress: dict[str, int] = {}
    started = 0
    wall = time.perf_counter()
    prefix = _without_refresh() if measured_from else contextlib.nullcontext()
    prefix.__enter__()
    in_prefix = bool(measured_from)
    while started < n or live:
        while started < n and len(live) < args.concurrent:
            if in_prefix and started >= measured_from:
                prefix.__exit__(None, None, None)
                in_prefix = False
                from study.run.export import write_tables  # the Parquet as the prefix left it

                write_tables(paths, spec, controller.get_trials())
                # the callback's read of the study's Parquet, once per driver at its first trial end
                # (a study of 0 trials in a run from the start): after the prefix, the first trial
                # end of the window would pay it for a study of N trials; timed apart
                t0 = time.perf_counter()
                parquet._live = LiveParquet(paths, spec)
                parquet._live._load()
                loaded = time.perf_counter() - t0
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
        step = time.perf_counter() - t0
        for trial in live or controller.get_trials()[-1:]:
            spent["tune_save"][index[trial.trial_id]] += step / max(1, len(live))
    if in_prefix:
        prefix.__exit__(None, None, None)
    wall = time.perf_counter() - wall
    # the study's end: Tune's final save (forced), then runner._fit's final export (from Tune's
    # saved state, as _fit does however the run ended)
    t0 = time.perf_counter()
    controller.checkpoint(force=True, wait=True)
    from study.run.export import export_experiment

    t1 = time.perf_counter()
    export_experiment(spec, paths)
    final = time.perf_counter() - t0
    final_export = time.perf_counter() - t1
    window = range(max(0, n - args.window), n)
    per_trial = {p: statistics.fmean(spent[p][i] for i in window) for p in PHASES}
    statuses: dict[str, int] = {}
    for t in controller.get_trials():
        statuses[t.status] = statuses.get(t.status, 0) + 1
    total = sum(sum(spent[p]) for p in PHASES) if not measured_from else None
    return {
        "n": n,
        "per_trial": per_trial,
        "cost": sum(per_trial.values()),
        "total": total,
        "final": final,
        "final_export": final_export,
        "loaded": loaded,
        "wall": wall,
        "statuses": statuses,
        "paths": paths,
    }


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


class _MotoProcess:
    """moto's S3 server in a process of its own: in this one, its threads' work (Tune's uploads of
    its whole experiment state, which grow with the study) would take the driver's GIL and show
    as driver time that a real object store does not cost."""

    def __init__(self) -> None:
        import socket
        import subprocess
        import sys
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        code = f"from moto.server import main; main(['-H', '127.0.0.1', '-p', '{self.port}'])"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/moto-api/", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server; killed when it does not stop within 30 s (seen at N = 2,000: the
        bench's figures were printed, then it died on the wait)."""
        import subprocess

        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def _moto(root: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    server = _MotoProcess()
    endpoint = f"http://127.0.0.1:{server.port}"
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        PONDER_STUDY_CACHE=os.path.join(root, "cache"),
    )
    pafs.S3FileSystem(endpoint_override=endpoint, allow_bucket_creation=True).create_dir("bench")
    return server, "s3://bench/studies"


def real_studies(sizes: list[int]) -> None:
    """``--real``: the driver's CPU per real trial, parity-smoke at each size (see the module)."""
    import resource
    import subprocess

    os.environ["RAY_AUTH_MODE"] = "token"  # read when Ray is imported; drivers joining by address need it
    import ray

    tmp = tempfile.mkdtemp(prefix="driver_scale_real.")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    print(f"driver CPU per real trial: parity-smoke, ponder-study run joined to one Ray instance ({address})")
    rows: list[tuple[int, float]] = []
    try:
        for n in sizes:
            cmd = [sys.executable, "-m", "study", "run", "parity-smoke", "--name", f"real{n}"]
            cmd += ["--num-samples", str(n), "--storage", os.path.join(tmp, "results")]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            joined = {**os.environ, "RAY_ADDRESS": address}
            done = subprocess.run(cmd, cwd=REPO, env=joined, capture_output=True)
            wall = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if done.returncode != 0:
                sys.exit(f"N={n}: the study failed: {done.stderr.decode()[-2000:]}")
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            rows.append((n, cpu))
            marginal = ""
            if len(rows) > 1:
                (n0, c0), (n1, c1) = rows[-2], rows[-1]
                marginal = f", {(c1 - c0) / (n1 - n0) * 1e3:.1f} ms a trial from N={n0}"
            per_trial = f"{cpu / n * 1e3:.1f} ms a trial{marginal}"
            print(f"N={n}: driver CPU {cpu:.2f} s, {per_trial}; wall {wall:.1f} s")
    finally:
        ray.shutdown()
    if len(rows) < 3:
        sys.exit("--real needs three sizes or more: the growth compares the first and last marginal costs")
    first = (rows[1][1] - rows[0][1]) / (rows[1][0] - rows[0][0])
    last = (rows[-1][1] - rows[-2][1]) / (rows[-1][0] - rows[-2][0])
    print(f"growth {last / first:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", type=int, nargs="+", help="study sizes N (default 100 500 2000; with --real 20 100 500)"
    )
    parser.add_argument("--reports", type=int, default=12, help="reports per trial (parity.toml: 12)")
    parser.add_argument("--concurrent", type=int, default=4, help="trials live at once")
    parser.add_argument("--window", type=int, default=50, help="last trials whose cost is averaged")
    parser.add_argument(
        "--sampler", default="random", help="the spec's sampler (TPE's own cost grows with N)"
    )
    parser.add_argument("--s3", action="store_true", help="store the studies on moto's S3 server")
    parser.add_argument("--fast-prefix", action="store_true", help="time only the last --window trials")
    parser.add_argument("--no-recipes", action="store_true", help="skip the Parquet recipes' timing")
    parser.add_argument("--keep", action="store_true", help="keep the studies' directory (printed)")
    parser.add_argument("--quick", action="store_true", help="sizes 20 60, a smoke check")
    parser.add_argument(
        "--real", action="store_true", help="real parity-smoke trials through the CLI (sizes 20 100 500)"
    )
    args = parser.parse_args()
    if args.real:
        real_studies(args.sizes or [20, 100, 500])
        return
    args.sizes = args.sizes or [100, 500, 2000]
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
    base = tune_overhead.run_worker("--worker", "metrics")
    reports = _reports(base, max(args.sizes), args.reports)
    ray.init(
        address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
    )
    where = "S3 (moto server)" if args.s3 else "a local directory"
    print(
        f"driver cost per trial, {args.reports} reports a trial, {args.concurrent} live at once, "
        f"sampler {args.sampler}, on {where}; averaged over the last {args.window} trials of each study"
        + (" (the earlier ones run without Parquet refresh or forced save)" if args.fast_prefix else "")
    )
    rows = []
    try:
        for n in args.sizes:
            row = run_study(n, storage, args, reports)
            rows.append(row)
            parts = ", ".join(f"{p} {row['per_trial'][p] * 1e3:.1f} ms" for p in PHASES)
            total = f"{row['total']:.1f} s" if row["total"] is not None else "n/a (prefix not timed)"
            if args.fast_prefix:
                total += f", the callback's Parquet read after the prefix {row['loaded']:.2f} s"
            print(
                f"N={n}: {row['cost'] * 1e3:.1f} ms per trial ({parts}); total driver time {total}, "
                f"study end {row['final']:.1f} s (export {row['final_export']:.1f} s), "
                f"bench wall {row['wall']:.0f} s; {row['statuses']}"
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
            shutil.rmtree(tmp, ignore_errors=True)  # 2,000 trials' directories: hundreds of MB
    print(f"growth {rows[-1]['cost'] / rows[0]['cost']:.2f}")


if __name__ == "__main__":
    main()
