"""Warm start: an earlier study's best configurations as a new study's first trials.

The common path from a small study (parity-8 on a laptop) to a bigger one (parity-15 on a
cluster): the K best trials of the earlier study, by its own objective (`ranked_trials`), are
enqueued in the new study's Optuna study (``enqueue_trial``) before it samples anything. Only
the fields the new spec searches are carried. A trial with a value outside the new space is
skipped (`WarmStart.note` says how many and what to widen); none left is refused.
`read_warm_start` reads the earlier study from its storage; `WarmStart.lines` are what
``run --warm-start`` prints before the study starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from study.records.ranking import ranked_trials
from study.records.records import load_study_spec
from study.spec.spec import Dimension, StudySpec
from study.storage.commands import command_name
from study.storage.hints import count
from study.storage.storage import read_study_table

__all__ = ["WarmStart", "WarmStartError", "read_warm_start", "warm_start_points"]


class WarmStartError(ValueError):
    """The earlier study cannot seed this one; the message says why, in one line."""


@dataclass(frozen=True)
class WarmStart:
    """The configurations to enqueue, best first, and what was left out."""

    points: list[dict[str, Any]]
    trial_ids: list[str]
    left_out: list[str]
    """Fields the earlier study's trials have but the new spec does not search."""
    skipped: list[str] = field(default_factory=list)
    """Ids of the best trials skipped: a value outside the new space."""
    widen: str = ""
    """What to widen in the new spec to include the skipped trials (empty if none)."""

    def note(self, source: str) -> str | None:
        """One line on the skipped trials, or None if none was."""
        if not self.skipped:
            return None
        n = len(self.skipped)
        return (
            f"warm start: skipped {n} of the best trials of {source} ({', '.join(self.skipped)}), "
            f"outside this spec's space; {self.widen} to include {'it' if n == 1 else 'them'}"
        )

    def lines(self, source: str) -> list[str]:
        """What the new study is told before it starts: the skipped trials (`note`), the trials
        that go first, the fields left out."""
        note = self.note(source)
        n, ids = len(self.points), ", ".join(self.trial_ids)
        lines = [] if note is None else [note]
        lines.append(
            f"warm start: {count(n, 'best trial')} of {source} ({ids}) go{'es' if n == 1 else ''} first"
        )
        if self.left_out:
            lines.append(f"warm start: not searched here, so left out: {', '.join(self.left_out)}")
        return lines


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value) if isinstance(value, str) else str(value)


def _outside(d: Dimension, value: Any) -> bool:
    if d.values is not None:
        return value not in d.values
    assert d.low is not None and d.high is not None
    return not (d.low <= value <= d.high)


def _where(d: Dimension, values: list[Any]) -> str:
    """``max_steps = 10, 12 outside this spec's range [2, 8]``."""
    got = ", ".join(_fmt(v) for v in dict.fromkeys(values))
    if d.values is not None:
        return f"{d.name} = {got} not among this spec's values {list(d.values)}"
    return f"{d.name} = {got} outside this spec's range [{_fmt(d.low)}, {_fmt(d.high)}]"


def _widen(space: dict[str, Dimension], outside: dict[str, list[Any]]) -> str:
    """``widen [space.max_steps] to [1, 10]``: for each dimension a skipped value lies outside."""
    parts = []
    for name, values in outside.items():
        d = space[name]
        if d.values is not None:
            extra = ", ".join(_fmt(v) for v in dict.fromkeys(values))
            parts.append(f"add {extra} to [space.{name}] values")
            continue
        assert d.low is not None and d.high is not None
        low, high = min([d.low, *values]), max([d.high, *values])
        parts.append(f"widen [space.{name}] to [{_fmt(low)}, {_fmt(high)}]")
    return " and ".join(parts)


def read_warm_start(source: str, storage: str, spec: StudySpec, top: int) -> WarmStart:
    """The ``top`` best trials of the study ``source`` under ``storage`` as points of ``spec``'s
    space (`warm_start_points`), read from its spec record and its Parquet."""
    earlier, paths = load_study_spec(source, storage)
    table = read_study_table(paths, "trials")
    if table is None:
        raise WarmStartError(
            f"--warm-start {source}: it has no Parquet yet under {storage}; "
            f"run `{command_name()} export {source}`"
        )
    return warm_start_points(spec, earlier, table.to_pandas(), top, source)


def warm_start_points(
    spec: StudySpec, earlier: StudySpec, trials: pd.DataFrame, top: int, source: str
) -> WarmStart:
    """The ``top`` best trials of ``earlier`` (its trials table ``trials``) as points of ``spec``'s
    space, those with a value outside it skipped; `WarmStartError` if none is left."""
    if top < 1:
        raise WarmStartError(f"--top must be a positive integer, got {top}")
    everyone = ranked_trials(trials, earlier.metric, earlier.mode)
    ranked = everyone.head(top)
    if ranked.empty:
        raise WarmStartError(f"--warm-start {source}: it has no trial that ended with a result to start from")
    searched = {d.name: d for d in spec.space}
    points, ids, skipped = [], [], []
    outside: dict[str, list[Any]] = {}
    for _, row in ranked.iterrows():
        point, bad = _point(searched, row)
        if bad:
            skipped.append(str(row["trial_id"]))
            for name, value in bad:
                outside.setdefault(name, []).append(value)
            continue
        points.append(point)
        ids.append(str(row["trial_id"]))
    widen = _widen(searched, outside)
    if not points:
        n = len(ranked)
        what = "; ".join(_where(searched[name], values) for name, values in outside.items())
        which = "its best trial is" if n == 1 else f"its {n} best trials are all"
        deeper = next(
            (i for i, (_, row) in enumerate(everyone.iterrows()) if i >= n and not _point(searched, row)[1]),
            None,
        )
        raise WarmStartError(
            f"--warm-start {source}: {which} outside this spec's space ({what}); "
            f"{widen} to include {'it' if n == 1 else 'them'}"
            + (
                f", or give --top {deeper + 1} to reach its best trial inside it"
                if deeper is not None
                else ""
            )
        )
    left_out = sorted({dim.name for dim in earlier.space} - set(searched))
    return WarmStart(points, ids, left_out, skipped, widen)


def _point(searched: dict[str, Dimension], row: pd.Series) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """A trial's values of the searched fields, and those of them outside the space."""
    point, bad = {}, []
    for name, d in searched.items():
        value = row.get(name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue  # the earlier study has no value: Optuna samples it
        value = d.coerce(value.item() if hasattr(value, "item") else value)
        if _outside(d, value):
            bad.append((name, value))
        point[name] = value
    return point, bad
