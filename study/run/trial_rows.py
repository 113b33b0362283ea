"""A trial as the Parquet sees it (`study.records.parquet.TrialRecord`), from Tune's trial and the
study's records: what the live Parquet (`study.run.live_parquet`) and the whole export
(`study.run.export`) build their rows from.

A trial's reports come from three places, joined in this order (for a repeated iteration the
later report wins): the Parquet's own rows of a trial not yet final (an export of an interrupted
study wrote them, and Tune's ``result.json`` may have lost them since), the reports its end record
keeps, and Tune's ``result.json`` (for a trial whose end record keeps none: one not ended, or one
that ended before end records kept reports).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import ray
from ray.tune.experiment import Trial

from study.records.parquet import TrialRecord, parse_result_lines
from study.records.records import END_OUTCOMES, EndRecord
from study.storage.storage import StudyPaths, join, read_table, to_uri

__all__ = [
    "FINAL",
    "checkpoint_uri",
    "fragment_history",
    "has_directory",
    "record_from_end",
    "record_of",
    "tune_history",
]

FINAL = END_OUTCOMES
"""The statuses of a trial whose rows no longer change: the compacted files hold only these (how
a trial can end for good, `study.records.records.END_OUTCOMES`)."""


def _last_line(text: str | None) -> str | None:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else None


def has_directory(trial: Trial) -> bool:
    """Whether Tune gave the trial a directory yet: a trial restored before it ever started has
    none, and Tune raises RuntimeError on any path of it."""
    return trial.storage is not None and bool(trial.storage.trial_dir_name)


def tune_history(trial: Trial) -> list[dict[str, Any]]:
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


def fragment_history(paths: StudyPaths, trial_ids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """The history rows of the given trials' own fragments (``history/study=<name>/trial-<id>``),
    by trial: the reports an export wrote of a trial that was not final then."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for trial_id in trial_ids:
        table = read_table(paths.fragment("history", trial_id))
        if table is not None:
            rows[trial_id] = [{k: v for k, v in r.items() if v is not None} for r in table.to_pylist()]
    return rows


def checkpoint_uri(paths: StudyPaths, checkpoint: str | None) -> str | None:
    """A checkpoint path from an end record (relative to the storage root) or from Tune (a path
    in the storage's filesystem) as a path or URI a user can open."""
    if not checkpoint:
        return None
    if "://" not in checkpoint and not checkpoint.startswith("/"):
        return join(paths.root, checkpoint)
    return to_uri(paths.root, checkpoint)


def record_of(
    trial: Trial,
    paths: StudyPaths,
    end: EndRecord | None,
    saved: list[dict[str, Any]],
    exported: list[dict[str, Any]],
) -> TrialRecord:
    """Tune's trial as a row: ``end`` its end record (None: not ended), ``saved`` the reports the
    record keeps, ``exported`` the Parquet's rows of it when it was not final."""
    checkpoint = trial.checkpoint if has_directory(trial) else None
    checkpoint_path = checkpoint.path if checkpoint is not None else None
    if end is not None and end.checkpoint:
        checkpoint_path = end.checkpoint  # Tune's may be older after a kill
    error = None
    if trial.status == Trial.ERROR:
        error = _last_line(str(trial.get_error() or "")) or "error (no message recorded)"
    # an end record that keeps the reports keeps result.json whole as it was at the end
    live = [] if saved and end is not None else tune_history(trial)
    return TrialRecord(
        trial_id=trial.trial_id,
        tune_status=trial.status,
        config=trial.config,
        history=exported + saved + live,  # for a repeated iteration the later report wins
        stopped_early=end is not None and end.outcome == "early_stopped",
        ended=end is not None,
        error=error,
        checkpoint_path=checkpoint_uri(paths, checkpoint_path),
        retries=int(trial.run_metadata.num_failures),
    )


def record_from_end(
    paths: StudyPaths, end: EndRecord, saved: list[dict[str, Any]], exported: list[dict[str, Any]]
) -> TrialRecord:
    """A trial that ended but that Tune's trials do not hold (its saved state lags the records)."""
    return TrialRecord(
        trial_id=end.trial_id,
        tune_status=Trial.TERMINATED,
        config=end.config,
        history=exported + saved,
        stopped_early=end.outcome == "early_stopped",
        ended=True,
        checkpoint_path=checkpoint_uri(paths, end.checkpoint),
    )
