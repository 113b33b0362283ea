"""The study's Parquet, exported from Tune's trials and the study's records.

Each trial's rows are built from its end record (with its reports) and Tune's ``result.json``
(`study.run.trial_rows`). While a study runs, `ParquetCallback` keeps the trials that end and
writes them on a budget, and whole when the run ends (`study.run.live_parquet`).
``ponder-study export``, and a run's end whose callback could not write it whole, rebuild it from
every record and Tune's saved state (`export_experiment`, `write_tables`). The records are the
truth: a trial Tune's saved state lacks is exported from its end record.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from ray import tune
from ray.tune import Callback
from ray.tune.experiment import Trial

from study.records.journal_copy import push_journal
from study.records.parquet import TrialRecord, history_table, trials_table
from study.records.records import EndRecord, read_end_records, read_reports
from study.run.dataset import write_study_table
from study.run.live_parquet import LiveParquet
from study.run.trial_rows import FINAL, checkpoint_uri, has_directory, record_from_end, record_of
from study.run.tune_state import restorable
from study.search.journal import SYNC_S, optuna_storage
from study.search.trial_map import map_trials
from study.spec.spec import StudySpec
from study.storage.storage import (
    StudyPaths,
    join,
    read_study_table,
    replaced_folder,
    write_parquet_state,
)

__all__ = [
    "EMPTIED_NOTE",
    "FINAL",
    "ExportCache",
    "LiveParquet",
    "ParquetCallback",
    "checkpoint_uri",
    "export_experiment",
    "finished_parquet",
    "has_directory",
    "without_duplicates",
    "write_tables",
]

log = logging.getLogger("ponder-study")


def _exported_history(paths: StudyPaths) -> dict[str, list[dict[str, Any]]]:
    """Reports already in the study's history Parquet, by trial. A driver killed between two of
    Tune's copies to storage loses the last reports from ``result.json``; the Parquet written
    when those trials ended still has them, so every export starts from it."""
    table = read_study_table(paths, "history")
    if table is None:
        return {}
    rows: dict[str, list[dict[str, Any]]] = {}
    for row in table.to_pylist():
        rows.setdefault(row["trial_id"], []).append({k: v for k, v in row.items() if v is not None})
    return rows


def _record(
    trial: Trial, paths: StudyPaths, end: EndRecord | None, exported: list[dict[str, Any]]
) -> TrialRecord:
    saved = read_reports(paths, trial.trial_id) if end is not None else []
    return record_of(trial, paths, end, saved, exported)


def _record_from_end(paths: StudyPaths, end: EndRecord, exported: list[dict[str, Any]]) -> TrialRecord:
    """A trial that ended but that Tune's saved state does not hold (it lags the records)."""
    return record_from_end(paths, end, read_reports(paths, end.trial_id), exported)


@dataclass
class ExportCache:
    """What a running study's exports need not redo: the Parquet history as it was when the
    driver started, and the records of trials that have ended (their files no longer change)."""

    exported: dict[str, list[dict[str, Any]]] | None = None
    records: dict[str, TrialRecord] = field(default_factory=dict)


def write_tables(
    paths: StudyPaths,
    spec: StudySpec,
    trials: Sequence[Trial],
    cache: ExportCache | None = None,
    ends: Mapping[str, EndRecord] | None = None,
) -> list[TrialRecord]:
    """Rewrite the study's Parquet from Tune's trials and the study's records, compacted: the
    trials that ended for good (`FINAL`) in one file per table, every other trial (running,
    pending, errored: its rows may still change) in its own fragment; then the fragments of the
    trials now in the compacted files go. Each file is written atomically. What ``export`` and
    the end of a run do: its cost grows with the study, unlike `LiveParquet`'s per trial.
    ``ends``: the study's end records, when the caller has just read them."""
    cache = cache or ExportCache()
    ends = read_end_records(paths) if ends is None else ends
    if cache.exported is None:
        cache.exported = _exported_history(paths)
    records = []
    for t in trials:
        rec = cache.records.get(t.trial_id)
        if rec is None or rec.tune_status != t.status or rec.ended != (t.trial_id in ends):
            rec = _record(t, paths, ends.get(t.trial_id), cache.exported.get(t.trial_id, []))
            if t.status == Trial.TERMINATED:
                cache.records[t.trial_id] = rec
        records.append(rec)
    known = {t.trial_id for t in trials}
    for trial_id in sorted(set(ends) - known):  # ended, but not (yet) in Tune's state: never lost
        records.append(_record_from_end(paths, ends[trial_id], cache.exported.get(trial_id, [])))
    table = trials_table(records, spec.metric, spec.mode, spec.front_objectives, spec.objectives)
    history = history_table(records, spec.objectives)
    final = [r.trial_id for r in records if r.ended and r.status() in FINAL]
    rest = [r.trial_id for r in records if r.trial_id not in set(final)]
    # history first: a driver killed between the two leaves every trial the trials files show
    # (an ended one included) with its reports in history, never the other way round
    for kind, t in (("history", history), ("trials", table)):
        ids = t.column("trial_id")
        with replaced_folder(paths.table_dir(kind)) as folder:  # the final trials' fragments go
            compacted = join(folder, paths.compacted_name(kind))
            done = t.filter(pc.is_in(ids, pa.array(final, pa.string())))
            write_study_table(paths, kind, done, file=compacted)
            for trial_id in rest:
                part = t.filter(pc.equal(ids, trial_id))
                write_study_table(paths, kind, part, file=join(folder, paths.fragment_name(trial_id)))
    write_parquet_state(paths, table.num_rows, final=True)
    return records


EMPTIED_NOTE = "EMPTIED.txt"
"""Left in a superseded checkpoint on an object store, where a directory is only its objects."""


def _empty_superseded_checkpoints(trial: Trial, keep: str) -> None:
    """Free the storage an ended trial's earlier checkpoints hold (one per report: ~200 KB each
    for parity, GBs over a large study), keeping its last. The directories stay: a restore from
    a lagging experiment state checks that its checkpoint exists, then the trainable finds the
    trial in the ledger and returns without reading it. On an object store each keeps a short
    note (`EMPTIED_NOTE`), without which the directory would vanish with its last file."""
    if trial.storage is None or not has_directory(trial) or not trial.path:
        return
    fs = trial.storage.storage_filesystem
    local = isinstance(fs, pafs.LocalFileSystem)

    def norm(path: str) -> str:
        return os.path.abspath(path) if local else path.strip("/")

    for d in fs.get_file_info(pafs.FileSelector(trial.path)):
        name = d.path.rstrip("/").rsplit("/", 1)[-1]
        if (
            d.type != pafs.FileType.Directory
            or not name.startswith("checkpoint_")
            or norm(d.path) == norm(keep)
        ):
            continue
        files = [
            f.path
            for f in fs.get_file_info(pafs.FileSelector(d.path, recursive=True))
            if f.type == pafs.FileType.File and not f.path.endswith(f"/{EMPTIED_NOTE}")
        ]
        if not files:
            continue
        if not local:
            with fs.open_output_stream(f"{d.path.rstrip('/')}/{EMPTIED_NOTE}") as note:
                note.write(b"Emptied when the trial ended: its last checkpoint holds the weights.\n")
        for f in files:
            fs.delete_file(f)


class ParquetCallback(Callback):
    """Keeps each trial that ends for the study's Parquet, written on a budget (`LiveParquet`) and
    whole when the run ends; frees an ended trial's superseded checkpoints; copies the Optuna
    journal's new lines to an object store at most once a second; keeps a retried trial's
    reports. The scheduler, which Tune tells of an end first, has already written the end record,
    so a kill here loses nothing ``export`` cannot rebuild."""

    def __init__(self, paths: StudyPaths, spec: StudySpec) -> None:
        self.paths = paths
        self.spec = spec
        self._live: LiveParquet | None = None
        self._pushed_at = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_live": None}  # Tune pickles callbacks; the rows are rebuilt

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.pop("_cache", None)  # an older callback's ExportCache: not restored
        self.__dict__.update({"_live": None, "_pushed_at": 0.0, **state})

    def rebind(self, paths: StudyPaths, spec: StudySpec) -> None:
        """Write where the study is now (Tune restores callbacks with the first run's paths)."""
        self.paths, self.spec, self._live = paths, spec, None

    @property
    def live(self) -> LiveParquet:
        if self._live is None:
            self._live = LiveParquet(self.paths, self.spec, self.spec.run.parquet_refresh_s)
        return self._live

    def _refresh(self) -> None:
        if not self.live.due():
            return
        try:
            self.live.refresh()
        except Exception as e:  # an export problem must not end the study; `export` can redo it
            log.error("could not write the study's Parquet (%s); `ponder-study export` will retry", e)
            log.debug("the Parquet write failed", exc_info=True)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        if time.monotonic() - self._pushed_at >= SYNC_S:  # an object store's journal copy
            push_journal(self.paths)
            self._pushed_at = time.monotonic()
        checkpoint = trial.checkpoint if has_directory(trial) else None
        if checkpoint is not None:
            _empty_superseded_checkpoints(trial, keep=checkpoint.path)
        self.live.add(trial)
        self._refresh()

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.live.add(trial)
        self._refresh()

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        self._refresh()  # trials that ended while no other did are written once the wait is over

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        _push_reports_before_retry(trial)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """The run's end, however it ended but a kill: the Parquet written whole (`LiveParquet.finish`)."""
        try:
            _FINISHED[self.paths.study_dir] = dict(self.live.finish(trials))
        except Exception as e:  # the driver's export from Tune's saved state tries again
            log.debug("the Parquet's final write failed (%s)", e, exc_info=True)


_FINISHED: dict[str, dict[str, int]] = {}
"""Study folder -> its trials by status, once its callback wrote the Parquet whole at a run's end."""


def finished_parquet(paths: StudyPaths) -> dict[str, int] | None:
    """The trials by status if this run's callback wrote the study's Parquet whole as Tune ended
    the experiment (then the export from Tune's saved state is not needed); None otherwise."""
    return _FINISHED.pop(paths.study_dir, None)


def _push_reports_before_retry(trial: Trial) -> None:
    """Copy a failed trial's ``result.json`` from the driver to the storage before Tune retries it.

    Tune starts a retry by copying the storage's ``result.json`` over the driver's
    (``JsonLoggerCallback._restore_from_remote``); the storage copy lags by one sync, so this
    keeps the reports made since, among them the one whose checkpoint the retry goes on from."""
    if not has_directory(trial) or trial.storage is None or not trial.local_path:
        return
    local = Path(trial.local_path, "result.json")
    fs, remote = trial.storage.storage_filesystem, f"{trial.storage.trial_fs_path}/result.json"
    same_file = isinstance(fs, pafs.LocalFileSystem) and local.resolve() == Path(remote).resolve()
    if not local.exists() or same_file:
        return
    try:
        pafs.copy_files(str(local), remote, destination_filesystem=fs)
    except OSError as e:  # the retry goes on; only the lagging reports are at risk
        log.warning("could not save trial %s's reports before its retry (%s)", trial.trial_id, e)


class _TuneTrials(tune.ExperimentAnalysis):
    """Tune's experiment on disk, its trials only: skips `ExperimentAnalysis`'s DataFrame of every
    trial's ``result.json``, which the export never uses (4.5 s of 16 s at 2,000 trials)."""

    def _fetch_trial_dataframes(self) -> dict[str, Any]:
        return {}


def export_experiment(spec: StudySpec, paths: StudyPaths) -> list[TrialRecord]:
    """Rewrite the study's Parquet (`write_tables`) from Tune's experiment on disk, its trials less
    `without_duplicates`, and the study's records: what ``export`` and the end of a run do. A
    torn Tune state is set aside first (`study.run.tune_state.restorable`). The end records are
    read once, here: the trials that ended during the run are among them."""
    ends = read_end_records(paths)
    trials: list[Trial] = []
    if restorable(paths, ended=bool(ends)):
        # it warns of every trial without a result.json (one restored before it ever reported,
        # or one Tune gave a new directory): their reports are in the study's records
        quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            trials = _TuneTrials(paths.experiment).trials
        finally:
            quiet.setLevel(level)
    return write_tables(paths, spec, without_duplicates(trials, spec, paths, ends), ends=ends)


def without_duplicates(
    trials: list[Trial], spec: StudySpec, paths: StudyPaths, ends: Mapping[str, EndRecord] | None = None
) -> list[Trial]:
    """Tune's saved trials less those a resume drops (`study.search.trial_map`): a trial left in Tune's
    state by an earlier recovery whose configuration another trial holds. Read-only. ``ends``:
    the study's end records, when the caller has just read them."""
    if not trials or not Path(paths.optuna_journal).exists():
        return trials
    ends = read_end_records(paths) if ends is None else ends
    live = {t.trial_id: t.config for t in trials if t.trial_id not in ends}
    if not live:
        return trials
    study = optuna.load_study(study_name=paths.name, storage=optuna_storage(paths))
    plan = map_trials(study.get_trials(deepcopy=False), live, ends, [d.name for d in spec.space])
    return [t for t in trials if t.trial_id not in plan.drop]
