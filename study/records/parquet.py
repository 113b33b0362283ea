"""The Parquet contract (schema version 7): one table of trials, one of reports, per study.

``trials/study=<name>/trials.parquet`` has one row per trial:

- ``trial_id``, ``status`` (see `STATUSES`), ``task``, ``schema_version``;
- every config field under its config name (``lambda_p``, ``beta``, ``max_steps``, ...; the
  union over all tasks): the trial's whole configuration, its task's defaults filled in
  (`ponder.config.resolve_config`), null only where the task has no such field; ``iterations``
  is the budget; ``device`` is the config's device as resolved on the node;
- ``iteration``, ``reports``, ``nan_events``, ``wall_time_s`` (seconds), ``started_at`` and
  ``ended_at`` (UTC), ``node_ip``, ``node_id``, ``gpu_ids`` (where the last report ran; null on a
  CPU), ``fuse_group`` and ``fuse_members`` (the fused group that trained its last report and the
  members it held then; null unfused), ``nodes``, ``checkpoint_path``, ``error``, ``retries``;
  ``pareto``: on the Pareto front
  of the study's objectives among the trials that ended with a result;
- each metric's final value under its metric name, ``best/<metric>`` at the report where the
  objective was best (``best_iteration``); per set, ``halted_accuracy`` beside
  ``best_step_accuracy`` and ``stable_accuracy`` (`ponder.halting.halting_accuracies`); list
  columns for per-step accuracy and the halting distribution. A diverged trial's final ``<set>/``
  metrics are null (the model that diverged gives no result); ``before_divergence/<metric>`` and
  ``before_divergence_iteration`` keep the last report before it with a finite objective.

``history/study=<name>/`` has one row per trial per report: ``trial_id``,
``report`` (1, 2, ...), ``iteration``, ``outcome``, ``nan_events``, the timings, ``timestamp``
(UTC), where it ran (``fuse_group`` and ``fuse_members`` as above), every metric.

Each study's folder (``trials/study=<name>/``, ``history/study=<name>/``) holds the final
trials (``trials.parquet``; in history a compacted ``history.parquet`` and the files of the
refreshes since, ``trial-batch-*.parquet``, `study.run.live_parquet`) and one fragment per other
trial (``trial-<id>.parquet``: one still running, pending or errored at the last refresh).
Reading the folder (``pd.read_parquet("results/trials")``) gives every trial once. Version 7
added ``data_stream`` (null in older rows: generator, as `fill_config_defaults` reads them); 6
``fuse_group`` and ``fuse_members``; 5 the fragments (4 had one file per study, rewritten whole).

Null: NaN, +-inf, and the objective's stand-in (`WORST`) in the objective's own columns; every
other value is kept. Version 4 added ``<set>/best_step_accuracy`` and ``<set>/stable_accuracy``
(null in older rows: their reports did not measure them); version 3 the resolved config, the
diverged rule and the times; ``ponder-study export NAME`` rewrites an older study, and
`fill_config_defaults` reads one.
Every file of the dataset gets the dataset's one schema from `study.run.dataset` when written.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ponder.config import CONFIGS, STORED_DEFAULTS, FieldInfo, fields_of, resolve_config, stored_config
from ponder.metrics import SET_LIST_METRICS, SET_METRICS, TIMING_KEYS, TRAIN_METRICS
from ponder.tasks import canonical_sets
from study.records.ranking import WORST, pareto_marks

__all__ = [
    "CANONICAL_SETS",
    "ROWS_IN_PYTHON",
    "SCHEMA_VERSION",
    "STATUSES",
    "TrialRecord",
    "fill_config_defaults",
    "history_table",
    "parse_result_lines",
    "trials_table",
]

SCHEMA_VERSION = 7

FUSE_FIELDS = (pa.field("fuse_group", pa.string()), pa.field("fuse_members", pa.int64()))
"""A fused trial's group (the fuser's id: the trials reported with one id trained as one model)
and the members that group held at the report; null for a trial trained alone."""
STATUSES = ("completed", "early_stopped", "diverged", "errored", "running", "pending")
CANONICAL_SETS = canonical_sets()
"""The canonical evaluation sets of the tasks registered at import (`ponder.tasks.canonical_sets`):
their metrics are columns of every table from the start, as the tasks' fields are (`CONFIG_FIELDS`)."""


@dataclass
class TrialRecord:
    """One trial as the export sees it, whatever the source (a live study or its files)."""

    trial_id: str
    tune_status: str
    """Tune's status: PENDING, RUNNING, PAUSED, TERMINATED or ERROR."""
    config: Mapping[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    """Tune's results in the order reported (duplicates of a re-reported iteration allowed)."""
    stopped_early: bool = False
    """ASHA stopped it before its budget."""
    ended: bool = False
    """The study's ledger has its end (Tune's state may not yet, after a kill)."""
    error: str | None = None
    checkpoint_path: str | None = None
    retries: int = 0

    @cached_property
    def reports(self) -> list[dict[str, Any]]:
        """The history with one report per training iteration: after a restart a trial repeats
        the reports since its last checkpoint; the later one is kept (same weights, same values)."""
        by_iteration: dict[int, dict[str, Any]] = {}
        for r in self.history:
            if "iteration" in r:
                by_iteration.pop(int(r["iteration"]), None)
                by_iteration[int(r["iteration"])] = r
        return sorted(by_iteration.values(), key=lambda r: int(r["iteration"]))

    def status(self) -> str:
        """One of `STATUSES`."""
        reports = self.reports
        last = reports[-1] if reports else {}
        if last.get("outcome") == "diverged":
            return "diverged"
        if self.tune_status == "ERROR":
            return "errored"
        if self.tune_status == "PENDING" and not self.ended:
            return "pending"
        if self.tune_status in ("RUNNING", "PAUSED") and not self.ended:
            return "running"
        if self.stopped_early or last.get("outcome") != "completed":
            return "early_stopped"
        return "completed"


def parse_result_lines(text: str) -> list[dict[str, Any]]:
    """Tune's ``result.json`` (one JSON object a line); a line cut short by a kill is skipped."""
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


# -- schema -----------------------------------------------------------------------------------
_ARROW_TYPES: dict[object, pa.DataType] = {
    float: pa.float64(),
    int: pa.int64(),
    bool: pa.bool_(),
    str: pa.string(),
}
"""A config value's column type, by its class (`ponder.config.FieldInfo.kind`); any other: string."""


def _arrow_type(field: FieldInfo) -> pa.DataType:
    """The column type of a config field: its values' (a list of its items' for a tuple)."""
    if field.kind is tuple:
        return pa.list_(_ARROW_TYPES.get(field.item, pa.string()))
    return _ARROW_TYPES.get(field.kind, pa.string())


def _config_fields() -> dict[str, pa.DataType]:
    fields: dict[str, pa.DataType] = {}
    for cls in CONFIGS.values():
        for f in fields_of(cls):
            fields.setdefault(f.name, _arrow_type(f))
    return fields


CONFIG_FIELDS = _config_fields()


def _sets(records: Iterable[TrialRecord]) -> list[str]:
    """Canonical sets first, then any other set a report of this study has."""
    sets = list(CANONICAL_SETS)
    for rec in records:
        for r in rec.history[:1]:
            for key in r:
                name, _, metric = key.partition("/")
                if metric in SET_METRICS and name not in sets and name not in ("best", "train"):
                    sets.append(name)
    return sets


def _metric_fields(sets: Sequence[str]) -> list[pa.Field]:
    fields = [pa.field(f"train/{m}", pa.float64()) for m in TRAIN_METRICS]
    for s in sets:
        fields += [pa.field(f"{s}/{m}", pa.float64()) for m in SET_METRICS]
        fields += [pa.field(f"{s}/{m}", pa.list_(pa.float64())) for m in SET_LIST_METRICS]
    return fields


def _coerce(value: Any, kind: pa.DataType) -> Any:
    """A value converted to the column's type, for rows Arrow refuses as they are."""
    if value is None:
        return None
    if pa.types.is_list(kind):
        return [_coerce(v, kind.value_type) for v in value]
    if pa.types.is_floating(kind):
        return float(value)
    if pa.types.is_integer(kind):
        return int(value)
    if pa.types.is_boolean(kind):
        return bool(value)
    return str(value)


def _objective_key(metric: str, mode: str) -> Any:
    sign = 1.0 if mode == "max" else -1.0

    def key(r: Mapping[str, Any]) -> float:
        v = r.get(metric)
        return sign * float(v) if isinstance(v, (int, float)) and math.isfinite(v) else -math.inf

    return key


def fill_config_defaults(trials: pd.DataFrame) -> pd.DataFrame:
    """A trials table with every config field as this version writes it, from any version: rows of
    schema 1 or 2 have a config field only where the study's spec set or searched it, their nulls
    get the task config's default (`resolve_config`); rows of schema 6 or older lack
    ``data_stream``, which they meant as generator (`ponder.config.STORED_DEFAULTS`). What readers
    use until ``ponder-study export`` rewrites the files; a table of this version comes back as is."""
    if "schema_version" not in trials.columns or "task" not in trials.columns:
        return trials
    version = pd.to_numeric(trials["schema_version"], errors="coerce").fillna(0)
    if not (version < 7).any():
        return trials
    trials = trials.copy()
    for name, value in STORED_DEFAULTS.items():  # a field these rows predate: as they meant it
        trials[name] = trials.get(name, pd.Series(None, trials.index)).astype(object)
        trials.loc[(version < 7) & trials[name].isna(), name] = value
    fields = [name for name in CONFIG_FIELDS if name in trials.columns]
    for index in trials.index[(version < 3).to_numpy()]:
        given = {name: trials.at[index, name] for name in ["task", *fields]}
        given = {k: v for k, v in given.items() if not _missing(v)}
        for name, value in resolve_config(given).items():
            if name in fields and name not in given and value is not None:
                if trials[name].dtype != object and isinstance(value, (str, tuple, list)):
                    trials[name] = trials[name].astype(object)
                trials.at[index, name] = list(value) if isinstance(value, tuple) else value
    return trials


def _missing(value: Any) -> bool:
    if isinstance(value, (list, tuple, np.ndarray)):
        return False
    return bool(pd.isna(value))


def trials_table(
    records: Sequence[TrialRecord],
    metric: str,
    mode: str,
    front: Sequence[tuple[str, str]] = (),
    objectives: Sequence[tuple[str, str]] | None = None,
) -> pa.Table:
    """One row per trial (see the module docstring for the columns); ``metric``/``mode`` is the
    objective "best" means, ``front`` the (metric, mode) pairs of the ``pareto`` column,
    ``objectives`` the (metric, mode) pairs the trainable reports a stand-in for (default: the
    primary objective and ``front``'s)."""
    metric_fields = _metric_fields(_sets(records))
    scalar = [f for f in metric_fields if not pa.types.is_list(f.type)]  # with best/ and before_divergence/
    rows = [_trial_row(rec, metric_fields, scalar, metric, mode) for rec in records]
    for row, on_front in zip(rows, pareto_marks(rows, front), strict=True):
        row["pareto"] = on_front
    stand_ins = _stand_ins([(metric, mode), *front] if objectives is None else objectives)
    stand_ins.update(
        {
            f"{prefix}/{name}": value
            for name, value in stand_ins.items()
            for prefix in ("best", "before_divergence")
        }
    )
    return _table(rows, _trials_schema(metric_fields, scalar), stand_ins)


def _trials_schema(metric_fields: Sequence[pa.Field], scalar: Sequence[pa.Field]) -> pa.Schema:
    """The trials table's columns: the trial, its config, where and how long it ran, its metrics
    (final; the scalar ones at the best report and before divergence too)."""
    return pa.schema(
        [
            pa.field("schema_version", pa.int32()),
            pa.field("trial_id", pa.string()),
            pa.field("status", pa.string()),
            pa.field("task", pa.string()),
            *(pa.field(name, kind) for name, kind in CONFIG_FIELDS.items()),
            pa.field("iteration", pa.int64()),
            pa.field("reports", pa.int64()),
            pa.field("nan_events", pa.int64()),
            pa.field("wall_time_s", pa.float64()),
            pa.field("started_at", pa.timestamp("s", tz="UTC")),
            pa.field("ended_at", pa.timestamp("s", tz="UTC")),
            pa.field("node_ip", pa.string()),
            pa.field("node_id", pa.string()),
            pa.field("gpu_ids", pa.string()),
            *FUSE_FIELDS,
            pa.field("nodes", pa.int64()),
            pa.field("checkpoint_path", pa.string()),
            pa.field("error", pa.string()),
            pa.field("retries", pa.int64()),
            pa.field("pareto", pa.bool_()),
            *metric_fields,
            pa.field("best_iteration", pa.int64()),
            *(pa.field(f"best/{f.name}", f.type) for f in scalar),
            pa.field("before_divergence_iteration", pa.int64()),
            *(pa.field(f"before_divergence/{f.name}", f.type) for f in scalar),
        ]
    )


def _trial_row(
    rec: TrialRecord, metric_fields: Sequence[pa.Field], scalar: Sequence[pa.Field], metric: str, mode: str
) -> dict[str, Any]:
    """One trial's row, less ``pareto`` (a mark among all the trials); ``scalar``: the metric
    fields that are not lists."""
    reports = rec.reports
    last = reports[-1] if reports else {}
    best = max(reports, key=_objective_key(metric, mode)) if reports else {}
    # Tune's params hold only what the spec sets or searches; a trial of an older study lacks fields
    config = resolve_config(stored_config(rec.config))
    row: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "trial_id": rec.trial_id,
        "status": rec.status(),
        "task": config.get("task"),
        **{name: config.get(name) for name in CONFIG_FIELDS},
        "iteration": last.get("iteration", 0),
        "reports": len(reports),
        "nan_events": last.get("nan_events", 0),
        "wall_time_s": last.get("time_total_s"),
        "node_ip": last.get("node_ip"),
        "started_at": _started_at(reports),
        "ended_at": _utc(last.get("timestamp")) if rec.status() not in ("running", "pending") else None,
        "node_id": last.get("node_id"),
        "gpu_ids": _gpu_ids(last.get("gpu_ids")),
        "fuse_group": last.get("fuse_group"),
        "fuse_members": last.get("fuse_members"),
        # every report made, a re-made one's first making included: a trial restarted from
        # scratch on another node (its only checkpoint lost with the node) still counts both
        "nodes": len({r["node_id"] for r in rec.history if r.get("node_id")}),
        "checkpoint_path": rec.checkpoint_path,
        "error": rec.error,
        "retries": rec.retries,
        "best_iteration": best.get("iteration"),
    }
    if last.get("device"):
        row["device"] = last["device"]
    for f in metric_fields:
        row[f.name] = last.get(f.name)
    for f in scalar:
        row[f"best/{f.name}"] = best.get(f.name)
    if row["status"] == "diverged":
        _diverged(row, reports, metric_fields, scalar, metric, mode)
    return row


def _gpu_ids(value: Any) -> Any:
    """Ray's GPU ids as the trainable joined them; "" (a CPU trial) is null: no GPU."""
    return None if value is None or value == "" else value


def _seconds(stamp: Any) -> float | None:
    """Tune's ``timestamp`` (Unix seconds of a report; a UTC time once read back from Parquet)."""
    if isinstance(stamp, datetime):
        return stamp.timestamp()
    if not isinstance(stamp, (int, float)) or isinstance(stamp, bool) or not math.isfinite(stamp):
        return None
    return float(stamp)


def _utc(stamp: Any) -> datetime | None:
    """A report's ``timestamp`` as a UTC time, to the second."""
    seconds = _seconds(stamp)
    return None if seconds is None else datetime.fromtimestamp(int(seconds), tz=UTC)


def _started_at(reports: Sequence[Mapping[str, Any]]) -> datetime | None:
    """When the trial started training: its first report's time less the time it had run by then."""
    if not reports:
        return None
    stamp, ran = _seconds(reports[0].get("timestamp")), reports[0].get("time_total_s")
    if stamp is None or not isinstance(ran, (int, float)) or not math.isfinite(ran):
        return _utc(stamp)
    return _utc(stamp - ran)


def _diverged(
    row: dict[str, Any],
    reports: Sequence[Mapping[str, Any]],
    metric_fields: Sequence[pa.Field],
    scalar_metric_fields: Sequence[pa.Field],
    metric: str,
    mode: str,
) -> None:
    """The rule for a diverged trial: its final evaluation metrics (``<set>/...``) are null, since
    the model that diverged gives no result (its arg-maxes over NaN read as 0.5 at step 1);
    ``before_divergence/<metric>`` holds every scalar metric of the last report before the
    divergent one whose objective was finite, ``before_divergence_iteration`` which that was.
    ``train/...`` (averages over the finite iterations) and ``best/...`` are kept."""
    for f in metric_fields:
        if not f.name.startswith("train/"):
            row[f.name] = None
    stand_in = -WORST if mode == "max" else WORST
    finite = [
        r
        for r in reports[:-1]
        if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric]) and r[metric] != stand_in
    ]
    if finite:
        row["before_divergence_iteration"] = finite[-1].get("iteration")
        for f in scalar_metric_fields:
            row[f"before_divergence/{f.name}"] = finite[-1].get(f.name)


def history_table(records: Sequence[TrialRecord], objectives: Sequence[tuple[str, str]] = ()) -> pa.Table:
    """One row per trial per report (see the module docstring for the columns); ``objectives``:
    the (metric, mode) pairs the trainable reports a stand-in for, null here."""
    schema = pa.schema(
        [
            pa.field("schema_version", pa.int32()),
            pa.field("trial_id", pa.string()),
            pa.field("report", pa.int64()),
            pa.field("iteration", pa.int64()),
            pa.field("outcome", pa.string()),
            pa.field("nan_events", pa.int64()),
            *(pa.field(k, pa.float64()) for k in TIMING_KEYS),
            pa.field("time_total_s", pa.float64()),
            pa.field("timestamp", pa.timestamp("s", tz="UTC")),
            pa.field("node_ip", pa.string()),
            pa.field("node_id", pa.string()),
            pa.field("device", pa.string()),
            pa.field("gpu_ids", pa.string()),
            *FUSE_FIELDS,
            *_metric_fields(_sets(records)),
        ]
    )
    rows = []
    for rec in records:
        for n, r in enumerate(rec.reports, start=1):
            rows.append(
                {
                    **r,
                    "schema_version": SCHEMA_VERSION,
                    "trial_id": rec.trial_id,
                    "report": n,
                    "timestamp": _utc(r.get("timestamp")),
                    "gpu_ids": _gpu_ids(r.get("gpu_ids")),
                }
            )
    return _table(rows, schema, _stand_ins(objectives))


def _stand_ins(objectives: Iterable[tuple[str, str]]) -> dict[str, float]:
    """Column -> the trainable's stand-in for a non-finite value of that objective."""
    return {metric: -WORST if mode == "max" else WORST for metric, mode in objectives}


ROWS_IN_PYTHON = 32
"""Up to this many rows, `_table` sets non-finite numbers to null in Python before Arrow converts
them; beyond, on Arrow's columns after (an Arrow pass costs a few kernel calls a column, about
13 ms over ~170 float columns; Python, about 80 us a row: 1 s for a refresh's 12,000 reports)."""


def _table(rows: list[dict[str, Any]], schema: pa.Schema, stand_ins: Mapping[str, float]) -> pa.Table:
    """Rows to a table of ``schema``, non-finite numbers (and the objectives' stand-ins: column ->
    value) as nulls; every other value is kept as it is.

    Arrow converts whole columns at once; if it refuses a value as the column's type (a float
    where an int goes), every value is converted first. Nulls are set on the rows in Python for
    a few rows (a trial's fragment), on Arrow's columns for more (`ROWS_IN_PYTHON`)."""
    floats = [f.name for f in schema if pa.types.is_floating(f.type)]
    float_lists = [
        f.name for f in schema if pa.types.is_list(f.type) and pa.types.is_floating(f.type.value_type)
    ]

    def finite(rows: list[dict[str, Any]]) -> pa.Table:
        if len(rows) > ROWS_IN_PYTHON:
            return _finite_columns(pa.Table.from_pylist(rows, schema=schema), stand_ins)
        return pa.Table.from_pylist(
            [_finite_row(row, floats, float_lists, stand_ins) for row in rows], schema=schema
        )

    try:
        return finite(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return finite([{f.name: _coerce(row.get(f.name), f.type) for f in schema} for row in rows])


def _finite_columns(table: pa.Table, stand_ins: Mapping[str, float]) -> pa.Table:
    """``table`` with the non-finite numbers (and an objective's stand-in) of its float columns,
    and of its lists of floats, as nulls: what `_finite_row` does to a row."""
    for i, f in enumerate(table.schema):
        stand_in = stand_ins.get(f.name)
        if pa.types.is_floating(f.type):
            column = table.column(i).combine_chunks()
            nulled = _nulled(column, stand_in)
        elif pa.types.is_list(f.type) and pa.types.is_floating(f.type.value_type):
            column = table.column(i).combine_chunks()  # a ListArray from offset 0
            values = _nulled(column.values, stand_in)
            nulled = (
                column
                if values is column.values
                else pa.ListArray.from_arrays(column.offsets, values, type=f.type, mask=column.is_null())
            )
        else:
            continue
        if nulled is not column:
            table = table.set_column(i, f, nulled)
    return table


def _nulled(values: pa.Array, stand_in: float | None) -> pa.Array:
    """``values`` with NaN, +-inf and ``stand_in`` as nulls (``values`` itself if it has none)."""
    bad = pc.invert(pc.is_finite(values))  # [rows]; null where the value is null
    if stand_in is not None:
        bad = pc.or_(bad, pc.equal(values, stand_in))
    if not pc.any(bad).as_py():
        return values
    return pc.if_else(bad, pa.scalar(None, values.type), values)


def _finite_row(
    row: dict[str, Any], floats: list[str], float_lists: list[str], stand_ins: Mapping[str, float]
) -> dict[str, Any]:
    """``row`` with its non-finite numbers (and an objective's stand-in) in float columns as None."""
    out = dict(row)
    for name in floats:
        if name in out and _not_a_value(out[name], stand_ins.get(name)):
            out[name] = None
    for name in float_lists:
        values = out.get(name)
        if isinstance(values, list | tuple | np.ndarray):
            stand_in = stand_ins.get(name)
            with contextlib.suppress(TypeError):  # a None or a string in it: element by element
                if stand_in is None and math.isfinite(sum(values)):  # no NaN or inf in it (the usual)
                    continue
            out[name] = [None if _not_a_value(v, stand_in) else v for v in list(values)]
    return out


def _not_a_value(value: Any, stand_in: float | None) -> bool:
    """NaN, +-inf, or the objective's stand-in for them; anything else (a string too) is left to Arrow."""
    if type(value) is float:  # nearly every value: the ABC check below costs ~10x (an export's ~1.5M)
        return not math.isfinite(value) or value == stand_in
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    return not math.isfinite(value) or (stand_in is not None and value == stand_in)
