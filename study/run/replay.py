"""A restored experiment brought level with the study's records, before any trial starts.

Tune restores its saved experiment, which lags the records after a kill and holds what it
unpickled from where the study was first run. `replaying_records` runs `replay_records` inside
Tune's restore, between loading the saved trials and queueing them: everything restored is
pointed at the study where it is now, and the records the resume read (`study.records.truth`)
are replayed into Tune, Optuna and ASHA (docs/resume.md, step 3).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow.fs as pafs
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.search import ConcurrencyLimiter

from study.records.records import EndRecord
from study.records.truth import StudyTruth
from study.run.export import ParquetCallback
from study.search import ray_private
from study.search.scheduler import PersistentASHA, SnapshotBeforeStart
from study.search.search import DivergenceAwareOptunaSearch, SamplerRecipe
from study.storage.storage import CHECKPOINT_FILE

__all__ = ["attach_reported_checkpoint", "replay_asha", "replay_records", "replaying_records"]

log = logging.getLogger("ponder-study")


def _optuna_searcher(search_alg: Any) -> DivergenceAwareOptunaSearch | None:
    """The study's Optuna searcher inside Tune's wrappers (SearchGenerator, ConcurrencyLimiter)."""
    seen = 0
    while search_alg is not None and seen < 5:
        if isinstance(search_alg, DivergenceAwareOptunaSearch):
            return search_alg
        search_alg = getattr(search_alg, "searcher", None)
        seen += 1
    return None


def attach_reported_checkpoint(trial: Trial) -> bool:
    """Give a restored trial the checkpoint its last saved report names, if Tune's saved state
    lacks it; True if it did.

    Tune registers a reported checkpoint only after a second round trip to the trial (its
    ``save``), so a stop that lands in between (Ctrl-C just after a report) saves the report
    without its checkpoint, and the resume would train the trial again from scratch, repeating
    its reports (seen in tests/study/test_resume.py::test_ctrl_c_then_resume). The checkpoint is
    whole: the trial writes it to the storage before it sends the report."""
    name = (trial.last_result or {}).get("checkpoint_dir_name")
    if not isinstance(name, str) or not name.startswith("checkpoint_"):
        return False
    latest = trial.checkpoint
    if latest is not None and latest.path.rstrip("/").rsplit("/", 1)[-1] >= name:
        return False  # Tune's own is that one or newer
    storage = trial.storage
    if storage is None:
        return False
    path = f"{storage.trial_fs_path}/{name}"
    fs = storage.storage_filesystem
    if fs.get_file_info(f"{path}/{CHECKPOINT_FILE}").type != pafs.FileType.File:
        return False
    checkpoint = tune.Checkpoint(path, filesystem=fs)
    trial.on_checkpoint(ray_private.training_result(checkpoint, dict(trial.last_result)))
    return True


def replay_records(controller: Any, trials: list[Trial], truth: StudyTruth) -> None:
    """Bring a restored experiment level with the study's records (``truth``, read at the
    start of the resume), before any trial starts.

    Everything Tune unpickled is pointed at the study where it is now; every trial with an end
    record is TERMINATED with its last report (so Tune, its progress table and the searcher's
    concurrency limit see an ended trial, not one to run again); Optuna is told the ends it
    missed; ASHA gets the stops it missed; the trials counted towards ``num_samples`` are those
    Tune saved and those that ended (the Parquet takes the latter from their records)."""
    spec, paths, ends = truth.spec, truth.paths, truth.ends
    scheduler = ray_private.scheduler(controller)
    if isinstance(scheduler, PersistentASHA):
        scheduler.rebind(paths)
        scheduler.use_saved(truth.asha)
    elif isinstance(scheduler, SnapshotBeforeStart):
        scheduler.paths = paths
    for callback in ray_private.callbacks(controller):
        if isinstance(callback, ParquetCallback):
            callback.rebind(paths, spec)
    search_alg = ray_private.search_alg(controller)
    searcher = _optuna_searcher(search_alg)
    if searcher is not None:
        searcher.rebind(paths, SamplerRecipe.of(spec))
        live = {t.trial_id: t.config for t in trials if t.trial_id not in ends}
        dropped = searcher.reconcile(live, ends, truth.reports)
        if dropped:  # Tune's list itself: a dropped trial is never queued
            log.warning(
                "%d trial(s) in Tune's saved state repeat a configuration another trial holds "
                "(left by an earlier recovery); they are dropped: %s",
                len(dropped),
                ", ".join(sorted(dropped)),
            )
            trials[:] = [t for t in trials if t.trial_id not in dropped]
    known = {t.trial_id for t in trials}
    for trial in trials:
        end = ends.get(trial.trial_id)
        if end is None:
            if trial.status != Trial.TERMINATED and attach_reported_checkpoint(trial):
                log.info("trial %s continues from the checkpoint of its last report", trial.trial_id)
            continue
        if isinstance(scheduler, PersistentASHA):
            replay_asha(scheduler, end)
        if trial.status == Trial.TERMINATED and spec.metric in (trial.last_result or {}):
            continue
        trial.set_status(Trial.TERMINATED)  # type: ignore[no-untyped-call]
        if end.last_result:
            trial.update_last_result(dict(end.last_result))  # type: ignore[no-untyped-call]
        # the concurrency limiter still counts it live; the searcher skips an end it was told
        search_alg.on_trial_complete(trial.trial_id, result=dict(end.last_result))
    limiter = getattr(search_alg, "searcher", None)
    if isinstance(limiter, ConcurrencyLimiter):  # rebuilt, not unpickled: a dropped trial there
        limiter.live_trials = {  # would hold its slot for ever
            t.trial_id
            for t in trials
            if t.status in (Trial.PENDING, Trial.RUNNING, Trial.PAUSED) and t.trial_id not in ends
        }
        limiter.num_unfinished_live_trials = len(limiter.live_trials)
    experiment = ray_private.searcher_experiment(search_alg)
    if experiment is not None and ray_private.storage(controller) is not None:
        # the searcher's saved experiment creates new trials with the first run's storage: a
        # study resumed from a copy would send their checkpoints to the old place
        experiment.storage = copy.copy(ray_private.storage(controller))
        experiment.spec["storage"] = experiment.storage
    # the stored spec's total is the truth (`resume --more`); the trials the study has are those
    # Tune saved and those that ended without Tune saving it (Tune's own count, from the
    # searcher's file saved apart from the trials', can count a trial neither file holds)
    ray_private.set_trial_count(search_alg, spec.search.num_samples, len(known | set(ends)))


def replay_asha(scheduler: PersistentASHA, end: EndRecord) -> None:
    """An ended trial's state in ASHA, from its end record, where ``asha.json`` lacks it: its
    bracket, rung values and stop (a record written before it kept them: its stop alone)."""
    if end.asha:
        scheduler.replay(list(end.asha))
    elif end.outcome == "early_stopped":
        scheduler.replay_stop(end.trial_id)


@contextlib.contextmanager
def replaying_records(truth: StudyTruth) -> Iterator[None]:
    """Run `replay_records` inside Tune's restore, between loading the saved trials and queueing them
    (`study.search.ray_private.before_restored_trials_queue`: Tune has no public hook there)."""

    def replay(controller: Any, trials: list[Trial]) -> None:
        replay_records(controller, trials, truth)

    with ray_private.before_restored_trials_queue(replay):
        yield
