"""The study's Parquet, exported from Tune's trials and the study's records.

Each trial's rows are built from its end record, its saved reports and Tune's ``result.json``
(`TrialRecord`). While a study runs, `ParquetCallback` writes an ended trial's rows as its own
fragment (`LiveParquet`, a cost per trial that does not grow with the study); the end of a run
and ``ponder-study export`` rewrite and compact the whole (`export_experiment`, `write_tables`).
The records are the truth: a trial Tune's saved state lacks is exported from its end record.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import ray
from ray import tune
from ray.tune import Callback
from ray.tune.experiment import Trial

from study.records.journal_copy import push_journal
from study.records.parquet import TrialRecord, history_table, pareto_marks, parse_result_lines, trials_table
from study.records.records import END_OUTCOMES, EndRecord, read_end_record, read_end_records
from study.run.dataset import write_study_table
from study.run.tune_state import restorable
from study.search.search import optuna_storage
from study.search.trial_map import map_trials
from study.spec.spec import StudySpec
from study.storage.storage import (
    StudyPaths,
    join,
    read_bytes,
    read_study_table,
    read_table,
    replaced_folder,
    to_uri,
    trial_reports,
)

__all__ = [
    "EMPTIED_NOTE",
    "FINAL",
    "ExportCache",
    "LiveParquet",
    "ParquetCallback",
    "checkpoint_uri",
    "export_experiment",
    "has_directory",
    "without_duplicates",
    "write_tables",
]

log = logging.getLogger("ponder-study")


def _last_line(text: str | None) -> str | None:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else None


def has_directory(trial: Trial) -> bool:
    """Whether Tune gave the trial a directory yet: a trial restored before it ever started has
    none, and Tune raises RuntimeError on any path of it."""
    return trial.storage is not None and bool(trial.storage.trial_dir_name)


def _history(trial: Trial) -> list[dict[str, Any]]:
    """The trial's ``result.json``. Tune writes it in the driver's staging directory and copies
    it to the storage every few seconds: while the driver runs, the staging copy is current."""
    if not has_directory(trial):
        return []
    if ray.is_initialized() and trial.local_path:
        local = Path(trial.local_path, "result.json")
        if local.exists():
            return parse_result_lines(local.read_text())
    if trial.storage is None:
        return []
    fs = trial.storage.storage_filesystem
    try:
        with fs.open_input_stream(f"{trial.path}/result.json") as f:
            return parse_result_lines(f.readall().decode())
    except (FileNotFoundError, OSError):
        return []


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


def _saved_reports(paths: StudyPaths, trial_id: str) -> list[dict[str, Any]]:
    """The reports `save_reports` kept when the trial ended (Tune's copy may have been emptied)."""
    data = read_bytes(trial_reports(paths.reports_dir, trial_id))
    return parse_result_lines(data.decode()) if data is not None else []


def checkpoint_uri(paths: StudyPaths, checkpoint: str | None) -> str | None:
    """A checkpoint path from an end record (relative to the storage root) or from Tune (a path
    in the storage's filesystem) as a path or URI a user can open."""
    if not checkpoint:
        return None
    if "://" not in checkpoint and not checkpoint.startswith("/"):
        return join(paths.root, checkpoint)
    return to_uri(paths.root, checkpoint)


def _record(
    trial: Trial, paths: StudyPaths, end: EndRecord | None, exported: list[dict[str, Any]]
) -> TrialRecord:
    saved = _saved_reports(paths, trial.trial_id) if end is not None else []
    checkpoint = trial.checkpoint if has_directory(trial) else None
    checkpoint_path = checkpoint.path if checkpoint is not None else None
    if end is not None and end.checkpoint:
        checkpoint_path = end.checkpoint  # Tune's may be older after a kill
    error = None
    if trial.status == Trial.ERROR:
        error = _last_line(str(trial.get_error() or "")) or "error (no message recorded)"
    return TrialRecord(
        trial_id=trial.trial_id,
        tune_status=trial.status,
        config=trial.config,
        history=exported + saved + _history(trial),  # for a repeated iteration the later report wins
        stopped_early=end is not None and end.outcome == "early_stopped",
        ended=end is not None,
        error=error,
        checkpoint_path=checkpoint_uri(paths, checkpoint_path),
        retries=int(trial.run_metadata.num_failures),
    )


def _record_from_end(paths: StudyPaths, end: EndRecord, exported: list[dict[str, Any]]) -> TrialRecord:
    """A trial that ended but that Tune's saved state does not hold (it lags the records)."""
    return TrialRecord(
        trial_id=end.trial_id,
        tune_status=Trial.TERMINATED,
        config=end.config,
        history=exported + _saved_reports(paths, end.trial_id),
        stopped_early=end.outcome == "early_stopped",
        ended=True,
        checkpoint_path=checkpoint_uri(paths, end.checkpoint),
    )


@dataclass
class ExportCache:
    """What a running study's exports need not redo: the Parquet history as it was when the
    driver started, and the records of trials that have ended (their files no longer change)."""

    exported: dict[str, list[dict[str, Any]]] | None = None
    records: dict[str, TrialRecord] = field(default_factory=dict)


FINAL = END_OUTCOMES
"""The statuses of a trial whose rows no longer change: the compacted files hold only these (how
a trial can end for good, `study.records.records.END_OUTCOMES`)."""


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
    return records


class LiveParquet:
    """The study's Parquet while it runs, at a cost per trial that does not grow with the study.

    An ended trial's rows are built once from its own files and written as its fragment of each
    table (`StudyPaths.fragment`), history first. Nothing else is rewritten but the ``pareto``
    mark of a trial the new one pushes off the front (kept here: once off, a trial stays off).
    The Parquet's history and front are read once per driver; the run's end compacts (`write_tables`)."""

    def __init__(self, paths: StudyPaths, spec: StudySpec) -> None:
        self.paths, self.spec = paths, spec
        self.exported: dict[str, list[dict[str, Any]]] | None = None
        self.front: dict[str, dict[str, Any]] = {}  # trial id -> its row, for the trials on it
        self.rows: dict[str, pa.Table] = {}  # trial id -> the trials row this driver wrote

    def _load(self) -> None:
        self.exported = _exported_history(self.paths)
        table = read_study_table(self.paths, "trials")
        if table is not None and "pareto" in table.column_names:
            on = table.filter(pc.fill_null(table.column("pareto"), False))
            self.front = {row["trial_id"]: row for row in on.to_pylist()}

    def trial_ended(self, trial: Trial) -> None:
        """Write the trial's fragments (an errored trial's too: a resume may end it again)."""
        if self.exported is None:
            self._load()
        assert self.exported is not None
        paths, spec = self.paths, self.spec
        end = read_end_record(paths, trial.trial_id)
        rec = _record(trial, paths, end, self.exported.get(trial.trial_id, []))
        history = history_table([rec], spec.objectives)
        row = trials_table([rec], spec.metric, spec.mode, spec.front_objectives, spec.objectives)
        changed = self._front_with(trial.trial_id, row.drop_columns(_list_columns(row)).to_pylist()[0])
        row = _with_pareto(row, changed.pop(trial.trial_id, False))
        write_study_table(paths, "history", history, file=paths.fragment("history", trial.trial_id))
        write_study_table(paths, "trials", row, file=paths.fragment("trials", trial.trial_id))
        self.rows[trial.trial_id] = row
        for trial_id, mark in changed.items():
            self._mark(trial_id, mark)

    def _front_with(self, trial_id: str, row: dict[str, Any]) -> dict[str, bool]:
        """Add a trial's row to the front; the marks that change (the new trial's always)."""
        objectives = self.spec.front_objectives
        candidates = {**{k: v for k, v in self.front.items() if k != trial_id}, trial_id: row}
        ids = list(candidates)
        marks = pareto_marks([candidates[i] for i in ids], objectives) if objectives else [False] * len(ids)
        front = {i: candidates[i] for i, on in zip(ids, marks, strict=True) if on}
        changed = {i: False for i in self.front if i not in front}
        changed[trial_id] = trial_id in front
        self.front = front
        return changed

    def _mark(self, trial_id: str, on: bool) -> None:
        """Rewrite one trial's ``pareto`` mark where its row is: its fragment, or (a trial of an
        earlier driver, now compacted) the compacted file."""
        paths = self.paths
        table = self.rows.get(trial_id)
        if table is None:
            table = read_table(paths.fragment("trials", trial_id))
        if table is not None:
            table = _with_pareto(table, on)
            write_study_table(paths, "trials", table, file=paths.fragment("trials", trial_id))
            self.rows[trial_id] = table
            return
        compacted = read_table(paths.trials_parquet)
        if compacted is None or "pareto" not in compacted.column_names:
            return
        ids = compacted.column("trial_id")
        index = compacted.schema.get_field_index("pareto")
        marks = pc.if_else(pc.equal(ids, trial_id), pa.scalar(on), compacted.column("pareto"))
        write_study_table(paths, "trials", compacted.set_column(index, "pareto", marks))


def _list_columns(table: pa.Table) -> list[str]:
    return [f.name for f in table.schema if pa.types.is_list(f.type)]


def _with_pareto(table: pa.Table, on: bool) -> pa.Table:
    index = table.schema.get_field_index("pareto")
    return table.set_column(index, table.schema.field(index), pa.array([on] * table.num_rows, pa.bool_()))


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
    """Writes each trial's Parquet rows as it ends (`LiveParquet`), frees an ended trial's superseded
    checkpoints, and keeps a retried trial's reports. The scheduler, which Tune tells of an end
    first, has already written the end record, so a kill here loses nothing ``export`` cannot rebuild."""

    def __init__(self, paths: StudyPaths, spec: StudySpec) -> None:
        self.paths = paths
        self.spec = spec
        self._live: LiveParquet | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_live": None}  # Tune pickles callbacks; the cache is rebuilt

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.pop("_cache", None)  # an older callback's ExportCache: not restored
        self.__dict__.update({"_live": None, **state})

    def rebind(self, paths: StudyPaths, spec: StudySpec) -> None:
        """Write where the study is now (Tune restores callbacks with the first run's paths)."""
        self.paths, self.spec, self._live = paths, spec, None

    def _write(self, trial: Trial) -> None:
        if self._live is None:
            self._live = LiveParquet(self.paths, self.spec)
        try:
            self._live.trial_ended(trial)
        except Exception as e:  # an export problem must not end the study; `export` can redo it
            log.error("could not write the study's Parquet (%s); `ponder-study export` will retry", e)
            log.debug("the Parquet write failed", exc_info=True)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        push_journal(self.paths)
        checkpoint = trial.checkpoint if has_directory(trial) else None
        if checkpoint is not None:
            _empty_superseded_checkpoints(trial, keep=checkpoint.path)
        self._write(trial)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._write(trial)

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        _push_reports_before_retry(trial)


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
