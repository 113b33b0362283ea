"""A study's own record of how each trial ended: the truth a resume and every reader trust.

Tune's saved experiment state lags (saved every few seconds and before each new trial), so after
a kill it can hold as pending or running a trial that had ended. One end record per trial,
``studies/<name>/ended/<trial_id>.json``, is written the moment the trial ends (by the study's
scheduler, which Tune tells before the searcher and the callbacks), and never replaced
(create-if-absent). It is the one write of a trial's end that is synced to the disk, and it holds
everything a resume needs to replay that end into Tune, Optuna and ASHA, and a reader to show the
trial: on its first line the record (outcome, config, last report, final checkpoint relative to
the storage root so that it stays true when the study is copied or moved, the trial's state in
ASHA), then every report the trial made, one JSON object a line, as Tune's ``result.json`` holds
them. Nothing else the end writes needs syncing: all of it is replayed from this record.

Studies started before: a record as one indented JSON object, the reports apart in
``reports/<trial_id>.jsonl``; before end records, ``ended.json`` (trial id -> checkpoint) and
ASHA's stops in ``asha.json``. `read_end_records` and `read_reports` read those too.
"""

from __future__ import annotations

import contextlib
import functools
import json
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from ponder.config import CONFIGS, STORED_DEFAULTS, fields_of
from study.records.asha_state import Change, read_state
from study.records.parquet import parse_result_lines
from study.spec.spec import StudySpec, parse_spec
from study.spec.toml import rewritten_source, toml_value
from study.storage.files import file_size
from study.storage.storage import (
    StudyPaths,
    create_bytes,
    read_bytes,
    read_json,
    resolve,
    trial_reports,
)


class StudyError(RuntimeError):
    """A study that cannot be run, resumed or exported as asked; the message says what to do."""


def load_study_spec(name: str, storage: str) -> tuple[StudySpec, StudyPaths]:
    """The spec a study was started with, read from its directory (no Ray: `status` needs it)."""
    paths = StudyPaths(storage, name)
    source = read_bytes(paths.spec)
    if source is None:
        raise StudyError(
            f"no study named {name!r} under {storage}: `ponder-study list` shows the studies there"
        )
    spec = parse_spec(source.decode(), name).with_overrides(name=name, storage=storage)
    return with_config_defaults(spec, STORED_DEFAULTS, "saved before the field existed"), paths


def with_config_defaults(spec: StudySpec, values: Mapping[str, Any], why: str) -> StudySpec:
    """``spec`` with the ``[config]`` fields of ``values`` that it neither fixes nor searches set
    to their value there, its source saying so with ``why``: `run` pins the task's data stream in
    the study's saved spec, and a saved spec written before a field existed gets what it meant
    (`ponder.config.STORED_DEFAULTS`)."""
    taken = {*spec.config, *(d.name for d in spec.space)}
    fields = {f.name for f in fields_of(CONFIGS[spec.task])}
    missing = {k: v for k, v in values.items() if k in fields and k not in taken}
    if not missing:
        return spec
    doc = tomllib.loads(spec.source)
    doc.setdefault("config", {}).update(missing)
    note = f"{', '.join(f'{k} = {toml_value(v)}' for k, v in missing.items())}: {why}"
    return parse_spec(rewritten_source(spec.source, doc, note), spec.name)


__all__ = [
    "END_OUTCOMES",
    "EndRecord",
    "StudyError",
    "ended_trial_ids",
    "finished_study",
    "has_ended",
    "load_study_spec",
    "read_end_record",
    "read_end_records",
    "read_ended",
    "read_reports",
    "relative_to_root",
    "with_config_defaults",
    "write_end_record",
]

END_OUTCOMES = ("completed", "early_stopped", "diverged")
"""How a trial can end for good (an errored trial is retried by ``resume``, so it has no record)."""


@dataclass(frozen=True)
class EndRecord:
    """How one trial ended. ``checkpoint`` is relative to the storage root when it lies under it;
    ``asha``: the trial's state in ASHA when it ended (`study.records.asha_state` changes: its
    bracket, its rung values, its stop), replayed by a resume that finds ``asha.json`` behind."""

    trial_id: str
    outcome: str
    iteration: int = 0
    config: Mapping[str, Any] = field(default_factory=dict)
    last_result: Mapping[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    asha: Sequence[Change] = field(default_factory=list)

    def to_json(self) -> bytes:
        """The record as one line of JSON (compact: the C encoder; no newline inside). Its fields
        as they are: `dataclasses.asdict` copies every nested value first (1 ms a record of a
        parity report)."""
        fields = {f.name: getattr(self, f.name) for f in dataclass_fields(self)}
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str).encode()

    @classmethod
    def from_json(cls, data: bytes) -> EndRecord:
        """The record of an end record file: its first line, or (a record written before reports
        were kept in it) the whole file, one indented JSON object."""
        raw = _first_object(data)
        return cls(
            trial_id=str(raw["trial_id"]),
            outcome=str(raw["outcome"]),
            iteration=int(raw.get("iteration") or 0),
            config=dict(raw.get("config") or {}),
            last_result=dict(raw.get("last_result") or {}),
            checkpoint=raw.get("checkpoint"),
            asha=[list(c) for c in raw.get("asha") or ()],
        )


def _first_object(data: bytes) -> dict[str, Any]:
    first, newline, _ = data.partition(b"\n")
    if newline and first.startswith(b"{") and first.endswith(b"}"):
        with contextlib.suppress(ValueError):
            raw: dict[str, Any] = json.loads(first)
            return raw
    whole: dict[str, Any] = json.loads(data)  # an older record: indented, over many lines
    return whole


def _inline_reports(data: bytes) -> bytes | None:
    """The report lines after an end record's first line (None: a record that keeps none)."""
    first, newline, rest = data.partition(b"\n")
    if not newline or not (first.startswith(b"{") and first.endswith(b"}")):
        return None  # an older record, one indented object: its reports are in reports/
    return rest


def relative_to_root(root_fs_path: str, path: str | None) -> str | None:
    """``path`` relative to the storage root's path in its filesystem when it lies under it."""
    if not path:
        return None
    root = root_fs_path.rstrip("/") + "/"
    return path[len(root) :] if path.startswith(root) else path


def write_end_record(paths: StudyPaths, record: EndRecord, reports: bytes = b"") -> bool:
    """Write the trial's end record, with its ``reports`` (Tune's ``result.json``: one JSON object
    a line) after it, unless one exists; returns whether this call wrote it.

    Create-if-absent: the first end is the truth (a restored trial that ends again at once, or a
    second writer, never replaces it). A torn write is impossible: the bytes go to a temporary
    file that is linked into place (one PUT on an object store), then synced to the disk: the one
    sync of a trial's end, which everything the end writes after it relies on."""
    if record.outcome not in END_OUTCOMES:
        raise ValueError(f"outcome {record.outcome!r} is not one of {END_OUTCOMES}")
    lines = b"".join(line + b"\n" for line in reports.splitlines() if line.strip())
    return create_bytes(paths.end_record(record.trial_id), record.to_json() + b"\n" + lines)


def has_ended(paths: StudyPaths, trial_id: str) -> bool:
    """Whether the trial ended for good: what the trainable checks before it trains."""
    fs, path = resolve(paths.end_record(trial_id))
    if file_size(fs, path) is not None:  # its size alone: the record and its reports are not read
        return True
    # a study from before end records keeps its stops in asha.json itself; a later stop has an
    # end record, so ASHA's change log (or FOLD_EVERY objects) need not be read at every start
    legacy_stopped = (read_json(paths.asha) or {}).get("stopped", [])
    return trial_id in (read_json(paths.ended) or {}) or trial_id in legacy_stopped


def read_end_record(paths: StudyPaths, trial_id: str) -> EndRecord | None:
    """One trial's end record (None if it has none; `read_end_records` reads them all)."""
    data = read_bytes(paths.end_record(trial_id))
    try:
        return EndRecord.from_json(data) if data is not None else None
    except (ValueError, KeyError, TypeError):
        return None


def read_ended(paths: StudyPaths, trial_id: str) -> tuple[EndRecord | None, list[dict[str, Any]]]:
    """The trial's end record (None if it has none) and its reports (`read_reports`), from one
    read of the record."""
    data = read_bytes(paths.end_record(trial_id))
    try:
        record = EndRecord.from_json(data) if data is not None else None
    except (ValueError, KeyError, TypeError):
        record, data = None, None
    inline = _inline_reports(data) if data is not None else None
    if not inline:
        return record, read_reports(paths, trial_id) if record is not None else []
    return record, parse_result_lines(inline.decode())


def read_reports(paths: StudyPaths, trial_id: str) -> list[dict[str, Any]]:
    """The reports the trial made, oldest first, as its end record keeps them (or, for a trial
    that ended before end records kept them, as the driver saved them apart); none if it has none."""
    data = read_bytes(paths.end_record(trial_id))
    inline = _inline_reports(data) if data is not None else None
    if not inline:  # an older record, or none: the reports saved apart, if any
        data = read_bytes(trial_reports(paths.reports_dir, trial_id))
        inline = data if data is not None else b""
    return parse_result_lines(inline.decode())


def _listed_end_records(paths: StudyPaths) -> tuple[pafs.FileSystem, list[pafs.FileInfo]]:
    """The end records' files, from one listing of their folder."""
    fs, directory = resolve(paths.ended_dir)
    infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    return fs, [
        i
        for i in infos
        if i.type == pafs.FileType.File and i.base_name.endswith(".json") and not i.base_name.startswith(".")
    ]


def ended_trial_ids(paths: StudyPaths, *, ledgers: bool = True) -> set[str]:
    """The ids of the trials that ended for good, from the listing of the end records (none of
    them read) and, for a study from before end records, its ledgers: what `finished_study`
    needs, read before a resume, which reads the records themselves (`study.records.truth`).
    ``ledgers=False``: the listing alone, where the ledgers were read already (ASHA's, replayed,
    takes 0.2 s at 3,000 trials); a trial that ends now always has an end record."""
    _, listed = _listed_end_records(paths)
    ids = {i.base_name.removesuffix(".json") for i in listed}
    if not ledgers:
        return ids
    legacy = read_json(paths.ended) or {}
    stopped = (read_state(paths.asha) or {}).get("stopped", [])
    return ids | set(legacy) | set(stopped)


def read_end_records(
    paths: StudyPaths,
    *,
    stopped: Iterable[str] | None = None,
    reports: Callable[[str], list[dict[str, Any]]] | None = None,
) -> dict[str, EndRecord]:
    """Every trial's end record, by trial id (a record that cannot be parsed is skipped: it was
    never renamed into place whole, so it cannot exist; a hand-edited one is not trusted).

    A study from before end records keeps ASHA's stops in its state: ``stopped``, those stops
    when the caller has read that state (`study.records.truth`), else it is read here; its
    trials' last reports come from ``reports`` (by default `read_reports`)."""
    records: dict[str, EndRecord] = {}
    fs, listed = _listed_end_records(paths)
    for info in listed:
        with fs.open_input_stream(info.path) as f:
            data = f.readall()
        try:
            rec = EndRecord.from_json(data)
        except (ValueError, KeyError, TypeError):
            continue
        records[rec.trial_id] = rec
    # studies started before end records: ended.json (trial id -> checkpoint) and ASHA's stops
    legacy = read_json(paths.ended) or {}
    if stopped is None:
        stopped = (read_state(paths.asha) or {}).get("stopped", [])
    stops = set(stopped)
    for trial_id in set(legacy) | stops:
        if trial_id in records:
            continue
        saved = (reports or functools.partial(read_reports, paths))(trial_id)
        last = saved[-1] if saved else {}
        outcome = "early_stopped" if trial_id in stops else str(last.get("outcome") or "completed")
        if outcome not in END_OUTCOMES:
            outcome = "early_stopped"
        records[trial_id] = EndRecord(
            trial_id=trial_id,
            outcome=outcome,
            iteration=int(last.get("iteration") or 0),
            config=dict(last.get("config") or {}),
            last_result=last,
            checkpoint=(legacy.get(trial_id) or {}).get("checkpoint"),
        )
    return records


def finished_study(paths: StudyPaths, num_samples: int) -> bool:
    """Whether a study has nothing left to do: ``num_samples`` end records, its Parquet holding
    them all, and no Optuna trial RUNNING. Read without Ray, so ``resume`` can say so at once."""
    from study.storage.storage import join, read_study_table

    ends = ended_trial_ids(paths)
    if len(ends) < num_samples:
        return False
    table = read_study_table(paths, "trials")
    if table is None or not set(ends) <= set(table.column("trial_id").to_pylist()):
        return False
    if not all(s in END_OUTCOMES for s in table.column("status").to_pylist()):
        return False
    here = join(paths.root, "")  # a copied or moved study's Parquet names the old place: export
    if "checkpoint_path" in table.column_names and not all(
        c is None or c.startswith(here) for c in table.column("checkpoint_path").to_pylist()
    ):
        return False
    journal = Path(paths.optuna_journal)
    if not journal.exists():
        return False
    import optuna
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    study = optuna.load_study(study_name=paths.name, storage=storage)
    return not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
