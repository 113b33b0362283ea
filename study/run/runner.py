"""Run, resume and export a study: the one place that drives Ray Tune.

``run`` refuses a name that exists; ``resume`` restores Tune's experiment (trials, searcher
state), the persisted ASHA rungs and the Optuna journal, and finishes the study with exactly
``num_samples`` trials. The Parquet tables are rewritten as every trial ends and at the end
(`study.run.export`).

The study's own records are the truth (`study.records.records`: one end record per trial, the saved
reports, the Optuna journal); Tune's saved experiment state is a cache of the trials that were
running, which lags them after a kill. On restore, before any trial starts, the records are
replayed into Tune, Optuna and ASHA (`study.run.replay`), and everything restored from Tune's
pickle is pointed at the study where it is now. ``run``, ``resume`` and ``export`` hold the
study's lease (`study.run.lease`) from before Ray starts to their end: one driver per study.

What the driver does beside: the Parquet export (`study.run.export`), TensorBoard's scalars
(`study.run.tensorboard`), signals while Ray starts (`study.run.stops`), and Tune's saved state files,
tended before a restore (`study.run.tune_state`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pyarrow.fs as pafs
import ray
from ray import tune
from ray.tune import Callback, CLIReporter
from ray.tune.experiment import Trial

from ponder.config import CONFIGS
from study.launchers.ray_token import private_token
from study.records import asha_state, journal_copy
from study.records.records import StudyError, load_study_spec, read_end_records, with_config_defaults
from study.records.truth import StudyTruth, read_truth
from study.run.export import ParquetCallback, export_experiment, finished_parquet
from study.run.fused import start_fusion, stop_fusions
from study.run.lease import hold_lease
from study.run.processes import Reaper
from study.run.progress import shown_in_place
from study.run.replay import replay_asha, replaying_records
from study.run.slim_trials import SlimEndedTrials, kept_statistics
from study.run.stops import (
    crash_handler_back_for_ray_processes,
    raise_a_swallowed_stop,
    restore_stop_handlers,
    stop_handlers,
    stops_held_while_ray_starts,
)
from study.run.tensorboard import (
    NoCSV,
    NoTensorBoard,
    ScalarTensorBoard,
    _EventFile,  # noqa: F401  (for a study started before the split: see below)
    import_tensorboardx_without_torch,
)
from study.run.trainable import fault_iteration, train_trial
from study.run.tune_logs import one_line_logs
from study.run.tune_state import merge_started_trials, prune_old_states, restorable
from study.search import ray_private
from study.search.asker import close_askers
from study.search.journal import (
    clear_stale_journal_lock,
    flush_journals,
    live_storage,
    optuna_storage,
    repair_journal,
)
from study.search.scheduler import PersistentASHA, SnapshotBeforeStart
from study.search.search import (
    make_scheduler,
    make_searcher,
    param_space,
)
from study.spec.spec import StudySpec
from study.storage.storage import (
    StudyPaths,
    is_remote,
    is_shared,
    resolve,
    share_filesystems_when_copied,
    sole_writer,
    write_bytes,
)

# Tune pickles the run config into tuner.pkl, and a pickle names a class by its module: a study
# started before the export and TensorBoard code moved out of this module names
# `study.runner.ParquetCallback`, `study.runner.ScalarTensorBoard` and `study.runner._EventFile`
# (the writer class ScalarTensorBoard holds). They stay importable from here (`study.runner` is
# this module: `study/__init__.py`), so that such a study still resumes (tests/study/test_restore.py).

__all__ = [
    "StudyError",
    "StudyOutcome",
    "export",
    "resume_study",
    "run_study",
]

log = logging.getLogger("ponder-study")


@dataclass
class StudyOutcome:
    """What a run or resume ended with."""

    spec: StudySpec
    paths: StudyPaths
    statuses: dict[str, int]
    finished: bool
    """Every one of ``num_samples`` trials reached a final status."""


def _trainable(spec: StudySpec, paths: StudyPaths) -> Any:
    """The trial function with its resources; with ``fuse = K`` (`study.run.fused`), each trial
    reserves 1/K of ``[resources]`` and is trained by its device's fuser, which this driver starts
    here and owns (it ends with the driver)."""
    res, fusion = spec.resources, None
    threads = max(1, int(res.cpu))  # a trial's torch threads, or a fused group's
    if res.fuse > 1:
        fusion, _ = start_fusion(
            res.fuse, threads, group_cpus=res.cpu, group_gpus=res.gpu or 1.0, unroll=spec.longest_max_steps
        )
    fn = tune.with_parameters(
        train_trial, objectives=dict(spec.objectives), paths=paths, threads=threads, fusion=fusion
    )
    share = res.fuse  # a fused group's members share its CPUs and GPU
    return tune.with_resources(fn, {"cpu": res.cpu / share, "gpu": res.gpu / share})


class _StudyReporter(CLIReporter):
    """Tune's progress table, whose "Result logdir" line named the driver's staging folder
    (``/tmp/ray/session_.../artifacts/.../driver_artifacts``), which holds none of the study's
    results and goes with the Ray session: the line names the study's storage instead. Worked
    out from the trials at each redraw, so a resumed study (whose reporter is the one pickled at
    its first run) shows where it lives now, even if it was copied elsewhere."""

    def _progress_str(self, trials: list[Trial], done: bool, *sys_info: str, **kwargs: Any) -> str:
        text: str = super()._progress_str(trials, done, *sys_info, **kwargs)
        if not trials:
            return text
        where = f"Results: {_storage_of(trials[0])} (Parquet under trials/ and history/, Tune's under tune/)"
        return "\n".join(where if line.startswith("Result logdir: ") else line for line in text.split("\n"))

    def report(self, trials: list[Trial], done: bool, *sys_info: str) -> None:
        text = self._progress_str(trials, done, *sys_info)
        if not shown_in_place(self, text):  # in a notebook: one table, redrawn (`study.run.progress`)
            self._print(text)


def _storage_of(trial: Trial) -> str:
    """The storage a trial's experiment lives in (``<storage>/tune/<name>``), as the user writes it."""
    root = trial.remote_experiment_path.rstrip("/").rsplit("/", 2)[0]
    fs = trial.storage.storage_filesystem if trial.storage is not None else None
    kind = fs.type_name if fs is not None else "local"  # "local", "s3", "gcs", ...
    return root if kind == "local" else f"{ {'gcs': 'gs'}.get(kind, kind) }://{root}"


def _reporter(spec: StudySpec) -> _StudyReporter:
    """Tune's progress table, one compact line per trial: the searched fields and the headline metrics."""
    metric = spec.metric
    columns = {"iteration": "iter", **{m: m for m, _ in spec.objectives}, "nan_events": "nan"}
    if metric.endswith("/halted_accuracy"):
        columns[metric.replace("/halted_accuracy", "/mean_halting_step")] = "steps"
    return _StudyReporter(
        parameter_columns=[d.name for d in spec.space],
        metric_columns=columns,
        max_report_frequency=15,
        sort_by_metric=True,
        metric=metric,
        mode=spec.mode,
    )


def study_callbacks(spec: StudySpec, paths: StudyPaths) -> list[Callback]:
    """The study's own callbacks for Tune: the Parquet; TensorBoard's scalars with ``[run]
    tensorboard`` (in place of Tune's default TensorBoard logger, which is off otherwise); Tune's
    JSON logger stays (each trial's ``result.json``: the reports its end record keeps, the live
    view's), its CSV logger goes (``progress.csv``, which nothing reads: the Parquet has it all);
    an ended trial's running statistics in Tune's state are cut to the objectives'."""
    board: Callback = ScalarTensorBoard() if spec.run.tensorboard else NoTensorBoard()
    slim = SlimEndedTrials(metric for metric, _ in spec.front_objectives)
    return [ParquetCallback(paths, spec), board, NoCSV(), slim]


def _tune_storage(uri: str) -> dict[str, Any]:
    """Tune's ``storage_path`` (or a path to restore from) for a storage URI, with the study's own
    filesystem on an object store (`study.storage.filesystems.resolve`: a small file is one PUT,
    where the filesystem Tune would build makes it three requests; the trials' workers get it
    with their storage)."""
    if not is_remote(uri):
        return {"storage_path": uri}
    fs, path = resolve(uri)
    return {"storage_path": path, "storage_filesystem": fs}


def _run_config(spec: StudySpec, paths: StudyPaths, verbose: int) -> tune.RunConfig:
    return tune.RunConfig(
        progress_reporter=_reporter(spec),
        name=paths.name,
        **_tune_storage(paths.tune_root),
        callbacks=study_callbacks(spec, paths),
        failure_config=tune.FailureConfig(max_failures=spec.run.max_failures),
        # every checkpoint is kept: pruning can break a restore after SIGKILL (ray#27790)
        checkpoint_config=tune.CheckpointConfig(num_to_keep=None),
        verbose=verbose,
    )


LAUNCHER_BOOTSTRAP = Path("~/ray_bootstrap_config.yaml")
"""Written by ``ray up`` on a head node: this machine heads a cluster that will add workers."""


def _check_storage(paths: StudyPaths) -> None:
    """Refuse this machine's disk as the storage of a multi-node study: trials on the other
    nodes would write their checkpoints where neither the driver nor a retry can read them."""
    if is_shared(paths.root):
        return
    alive: list[dict[str, Any]] = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    nodes = len(alive)
    launched = LAUNCHER_BOOTSTRAP.expanduser().exists()
    if nodes > 1 or launched:
        where = f"this Ray cluster has {nodes} nodes" if nodes > 1 else "this machine heads a cluster"
        raise StudyError(
            f"storage {paths.root!r} is a path on this machine's disk, but {where}: trials on other nodes "
            "could not save checkpoints there; pass shared storage: --storage s3://BUCKET/PREFIX "
            "(or gs://...), or a filesystem every node mounts as a file:// URI (file:///mnt/nfs/results)"
        )


@contextlib.contextmanager
def _ray_lifetime() -> Iterator[None]:
    """Stop the Ray instance this command started when it ends, however it ends (a Ctrl-C in the
    middle of Ray's start-up included): its helper processes go with the driver."""
    # an agent orphaned by its raylet stays below the driver; the caller's own children are spared
    reaper = Reaper() if not ray.is_initialized() else None
    try:
        yield
    finally:
        if reaper is not None:
            handlers = stop_handlers()
            local = reaper.started()  # a local instance: GCS, raylet, its agents, workers
            with contextlib.suppress(Exception):
                ray_private.stop_local_monitor()
            with contextlib.suppress(Exception):
                ray.shutdown()
            # an agent can outlive its raylet stopped mid-start (45 s seen), or be started after
            # the list above and orphaned by the shutdown: listed again, as the driver's orphans
            reaper.close(also=local)
            # with Ray's crash handler on (a study run from Python, not the command), shutdown
            # leaves SIGTERM at "die at once" (`study.run.stops.RAY_CRASH_HANDLER_OFF`)
            restore_stop_handlers(handlers)


def _init_ray(address: str | None, paths: StudyPaths, spec: StudySpec) -> None:
    """Join the cluster at ``address`` (or $RAY_ADDRESS), else start a local Ray instance sized
    for ``spec``'s processes; then check that every node can reach the study's storage."""
    if ray.is_initialized():
        _check_storage(paths)
        return
    if address is None and not os.environ.get("RAY_ADDRESS"):
        # a Ray instance of its own, as --help says: ray.init() alone would join whatever cluster
        # `ray start` last started on this machine; --address auto asks for that explicitly
        address = "local"
    if address == "local":
        private_token()  # on a shared machine, the instance's token is its owner's alone
    try:  # Ray's start-up notices (token auth, ...) at ERROR: a refusal stays one line on stderr
        crash_handler_back_for_ray_processes()  # Ray read it at import: its processes keep theirs
        with stops_held_while_ray_starts():
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
                _system_config=_local_system_config(spec) if address == "local" else None,
            )
        logging.getLogger("ray").setLevel(logging.WARNING)  # then Tune's warnings as before
        raise_a_swallowed_stop()  # a Ctrl-C while Ray started
    except (ValueError, ConnectionError, RuntimeError, TimeoutError) as e:
        where = os.environ.get("RAY_ADDRESS") if address is None else address
        message = " ".join(str(e).split())[:200]
        raise StudyError(
            f"could not start or join Ray at {where} ({message}); check --address / $RAY_ADDRESS, "
            "or leave both unset to run on a local Ray instance"
        ) from e
    _check_storage(paths)


def _local_system_config(spec: StudySpec) -> dict[str, Any]:
    """A local instance's raylet settings. Ray starts a Python worker per CPU for the first driver,
    which Tune's trial actors never use (they start workers of their own: 4 worker processes for
    the smoke study's 2 trial actors, each idle one about 0.4 s of CPU and its memory, measured).
    And its raylet prints a WARNING to the terminal once a node has 4x as many workers as it starts
    at once (by default its CPU count): a fused study's trials reserve 1/fuse CPU each, so 16 of
    them on 2 CPUs (with their fusers) set it off, for a number of processes the study asked for.
    The start-up concurrency is raised to a quarter of the processes the study will have."""
    config: dict[str, Any] = {"prestart_worker_first_driver": False}
    res = spec.resources
    at_once = spec.search.max_concurrent
    processes = at_once + (at_once // res.fuse + 2 if res.fuse > 1 else 0) + 2  # trials, fusers, spare
    if -(-processes // 4) > (os.cpu_count() or 1):
        config["worker_maximum_startup_concurrency"] = -(-processes // 4)
    return config


def _space(spec: StudySpec) -> dict[str, Any]:
    space = param_space(spec)
    if isinstance(space.get("data_dir"), str):  # trials run in their own directory
        space["data_dir"] = os.path.abspath(space["data_dir"])
    return space


def _check_fault_drill() -> None:
    """A malformed ``PONDER_STUDY_FAULT`` would fail every trial: refuse it before Ray starts."""
    try:
        fault_iteration()
    except ValueError as e:
        raise StudyError(str(e)) from e


def run_study(
    spec: StudySpec,
    *,
    address: str | None = None,
    verbose: int = 1,
    warm_start: Sequence[Mapping[str, Any]] = (),
    resume_hint: str | None = None,
    on_written: Callable[[], None] | None = None,
) -> StudyOutcome:
    """Start a new study named ``spec.name`` under ``spec.run.storage`` and run it to the end;
    ``warm_start`` configurations (`study.search.warmstart`) are its first trials. ``on_written`` is
    called once the study is on the storage (its spec saved): from then on `resume_study`
    continues it, however this run ends."""
    _check_fault_drill()
    paths = StudyPaths(spec.run.storage, spec.name)
    with hold_lease(paths, "run"), _ray_lifetime():  # the lease first: two runs of one name, one wins
        if paths.exists() or tune.Tuner.can_restore(paths.experiment):
            hint = resume_hint or f"ponder-study resume {spec.name}"
            raise StudyError(
                f"a study named {spec.name!r} already exists under {spec.run.storage}: "
                f"resume it with `{hint}`, or pick another --name"
            )
        _init_ray(address, paths, spec)  # before anything is written: a run that cannot start leaves no study
        # the saved spec names the data stream its trials draw from, so a later default cannot change it
        stream = {"data_stream": CONFIGS[spec.task]().data_stream}
        spec = with_config_defaults(spec, stream, "this study's data stream, pinned when it was started")
        write_bytes(paths.spec, spec.source.encode())
        if on_written is not None:
            on_written()
        return _fit(spec, paths, address, verbose, restore=False, warm_start=warm_start)


def check_whole(paths: StudyPaths) -> None:
    """Refuse a study that is half there (a partial copy or download) before anything is written:
    its Optuna journal and, once trials have ended, Tune's experiment must be where it is.

    Run before the lease is taken (taking it writes), so what it reads is not the truth the
    resume goes on with (`study.records.truth`): it reads no record of a study whose journal and
    Tune's folder are there, and the end records only when one of the two is missing."""
    journal = paths.optuna_journal_copy or paths.optuna_journal
    has_journal = Path(paths.optuna_journal).exists() or journal_copy.exists(journal)
    # Tune's folder, whole or not: a resume killed after setting a torn tuner.pkl aside leaves
    # one without it, which the next resume recovers from the records (`study.run.tune_state.restorable`)
    fs, experiment = resolve(paths.experiment)
    has_tune = fs.get_file_info(experiment).type == pafs.FileType.Directory
    if has_tune and has_journal:
        return
    ended = read_end_records(paths)
    if (ended or has_tune) and not has_journal:
        raise StudyError(
            f"study {paths.name!r} under {paths.root} is incomplete: its Optuna journal {journal} is missing "
            "(copy the whole study folder: studies/, tune/, trials/, history/)"
        )
    if ended and not has_tune:
        raise StudyError(
            f"study {paths.name!r} under {paths.root} is incomplete: {len(ended)} trials ended but Tune's "
            f"experiment {paths.experiment} is missing (copy tune/{paths.name}/ too)"
        )


def resume_study(
    name: str, storage: str, *, address: str | None = None, verbose: int = 1, more: int = 0
) -> StudyOutcome:
    """Finish an interrupted study: nothing finished runs again, nothing unfinished is lost.
    ``more`` adds that many trials to it (finished or not), the sampler going on where it was."""
    _check_fault_drill()
    if more < 0:
        raise StudyError(f"--more must be a positive integer, got {more}")
    paths = StudyPaths(storage, name)
    if paths.exists():  # read-only: a half-copied study is refused before the lease is taken
        check_whole(paths)
    with hold_lease(paths, "resume"), _ray_lifetime():  # a `run` still starting has no spec yet
        truth = read_truth(name, storage)  # each record once, handed to every step below
        spec, paths = truth.spec, truth.paths
        if more:
            if spec.search.sampler == "grid":
                raise StudyError(
                    f"study {name!r} uses the grid sampler, whose trials are its grid's points: "
                    "--more cannot add any; start a new study with a larger grid"
                )
            spec = spec.with_overrides(num_samples=spec.search.num_samples + more)
            write_bytes(paths.spec, spec.source.encode())  # the stored spec holds the new total
            truth = truth.with_spec(spec)
        # after `restorable`, which may set a torn tuner.pkl aside: Tune restores only with one
        restore = restorable(paths, ended=bool(truth.ends)) and tune.Tuner.can_restore(paths.experiment)
        if restore:
            prune_old_states(paths)
            merge_started_trials(paths)
        return _fit(spec, paths, address, verbose, restore=restore, truth=truth)


def _scheduler(spec: StudySpec, paths: StudyPaths, truth: StudyTruth) -> PersistentASHA | SnapshotBeforeStart:
    """The study's scheduler for a new Tune experiment; ASHA takes the saved state the resume read."""
    scheduler = make_scheduler(spec, paths)
    if isinstance(scheduler, PersistentASHA):
        scheduler.use_saved(truth.asha)
        for end in truth.ends.values():  # what a crash kept from asha.json, the records hold
            replay_asha(scheduler, end)
    return scheduler


def _prepare_driver(paths: StudyPaths) -> None:
    """What the driver sets up once Ray is up, before Tune starts: the Optuna journal ready
    under the lease, and Tune's settings."""
    share_filesystems_when_copied()  # Tune copies its spec, and the filesystem, for each new trial
    ray_private.remember_registered()  # Tune asks Ray's GCS twice a new trial otherwise
    ray_private.tune_json_in_c()  # Tune's saves and result.json lines encoded in Python otherwise
    ray_private.incremental_uploads()  # Tune copies every trial's folder at each save otherwise
    journal_copy.pull(paths)
    if clear_stale_journal_lock(paths.optuna_journal):  # under the lease: a killed driver's
        log.info("removed the Optuna journal lock a stopped driver left")
    if repair_journal(paths.optuna_journal):
        log.warning("the Optuna journal ended in a torn write (a full disk, a kill); it was cut back")
    # A restored trial that had already ended returns without reporting (nothing runs twice);
    # Tune's strict check would take its empty final result for a missing metric. Every report
    # the trainable does make carries the objective (`tune_metrics`), so the check adds nothing.
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    # the compact CLIReporter table (also on resume, whose RunConfig is Tune's saved one) instead
    # of the default output's per-trial config and result dumps
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    import_tensorboardx_without_torch()


def _fit(
    spec: StudySpec,
    paths: StudyPaths,
    address: str | None,
    verbose: int,
    restore: bool,
    warm_start: Sequence[Mapping[str, Any]] = (),
    truth: StudyTruth | None = None,
) -> StudyOutcome:
    """Run the study's trials in Tune, restored or new, then export. ``truth``: the study's
    records as the resume read them (`study.records.truth`); none for a new study, which has
    no records (`run_study` refuses a name that exists)."""
    truth = truth if truth is not None else StudyTruth(spec, paths)
    with sole_writer():  # under the study's lease (held by the caller): no other writer
        return _fit_solely(spec, paths, address, verbose, restore, warm_start, truth)


def _stop_helpers() -> None:
    """What works beside Tune ends with its run: a stopped study's fusers would train on to their
    members' next reports; TPE's asking processes (`study.search.asker`) have no trial to ask for."""
    stop_fusions()
    close_askers()


def _fit_solely(
    spec: StudySpec,
    paths: StudyPaths,
    address: str | None,
    verbose: int,
    restore: bool,
    warm_start: Sequence[Mapping[str, Any]],
    truth: StudyTruth,
) -> StudyOutcome:
    _init_ray(address, paths, spec)
    _prepare_driver(paths)
    trainable = _trainable(spec, paths)
    # trials that ended in an experiment whose saved state was lost are not asked for again
    still_to_run = spec.search.num_samples - (0 if restore else len(truth.ends))
    tuner: tune.Tuner | None = None
    if restore:
        # Tune's restore reads every trial's results into DataFrames the study never uses, and warns
        # for each trial that had not reported when the study stopped: routine after any stop
        analysis = logging.getLogger("ray.tune.analysis.experiment_analysis")
        level, analysis.level = analysis.level, logging.ERROR
        try:
            experiment = _tune_storage(paths.experiment)
            tuner = tune.Tuner.restore(
                experiment["storage_path"],
                trainable,
                resume_unfinished=True,
                resume_errored=True,
                storage_filesystem=experiment.get("storage_filesystem"),
            )
        finally:
            analysis.setLevel(level)
    elif still_to_run > 0:
        tuner = tune.Tuner(
            trainable,
            param_space=_space(spec),
            tune_config=tune.TuneConfig(
                search_alg=make_searcher(spec, paths, warm_start, ends=truth.ends),
                scheduler=_scheduler(spec, paths, truth),
                num_samples=still_to_run,
                # A trial's worker goes on to the next trial: no new process and torch import per
                # trial (the smoke study's CPU halves, 13 s instead of 26). Ctrl-C then resume
                # repeated a report with it (5 of 12 runs of test_ctrl_c_then_resume): a stop
                # between a report and Tune's registering of its checkpoint, which a reused worker
                # makes likelier; `study.run.replay.attach_reported_checkpoint` mends that on resume.
                reuse_actors=True,
            ),
            run_config=_run_config(spec, paths, verbose),
        )
    failed = False
    try:
        if tuner is not None:
            raise_a_swallowed_stop()  # before Tune takes Ctrl-C over (its own handler)
            statistics = ray_private.running_statistics_of(kept_statistics(spec.front_objectives))
            with replaying_records(truth), one_line_logs(paths), statistics:
                tuner.fit()  # the Parquet written by the callback is the result
    except BaseException:
        failed = True
        raise
    finally:  # and once more from the records and Tune's saved state, however fit ended
        _stop_helpers()
        flush_journals(commit=True)  # what Optuna was told, on the disk before it is read again
        asha_state.flush()
        statuses: dict[str, int] = {}
        try:
            # written whole by the Parquet callback as Tune ended the run, else rebuilt here
            written = finished_parquet(paths)
            if written is None:
                written = dict(Counter(rec.status() for rec in export_experiment(spec, paths)))
            statuses = written
            journal_copy.push_journal(paths, whole=True)
        except Exception as e:
            if not failed:
                raise
            log.error("could not write the study's Parquet (%s); `ponder-study export` will retry", e)
    finished = sum(statuses.values()) >= spec.search.num_samples and not (
        statuses.get("running") or statuses.get("pending") or statuses.get("errored")
    )
    if finished and fail_orphaned_optuna_trials(spec, paths):
        journal_copy.push_journal(paths, whole=True)
    return StudyOutcome(spec, paths, statuses, finished)


def export(name: str, storage: str) -> StudyPaths:
    """Rewrite a study's Parquet from its records and Tune's experiment on disk (no trial runs)."""
    with hold_lease(StudyPaths(storage, name), "export"):
        spec, paths = load_study_spec(name, storage)
        if not tune.Tuner.can_restore(paths.experiment) and not read_end_records(paths):
            raise StudyError(f"study {name!r} has no Tune experiment state yet under {paths.experiment}")
        export_experiment(spec, paths)
    return paths


def fail_orphaned_optuna_trials(spec: StudySpec, paths: StudyPaths) -> int:
    """Mark FAILED the Optuna trials left RUNNING by a driver killed between asking Optuna for
    a trial and saving Tune's state (Optuna's own heartbeat does the same to stale trials)."""
    if not Path(paths.optuna_journal).exists():
        return 0
    storage = live_storage(paths) or optuna_storage(paths)  # the searcher's, read already
    study = optuna.load_study(study_name=paths.name, storage=storage)
    orphans = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for t in orphans:
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
    flush_journals(commit=True)
    return len(orphans)
