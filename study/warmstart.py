"""Warm start: an earlier study's best configurations as a new study's first trials.

The common path from a small study (parity-8 on a laptop) to a bigger one (parity-15 on a
cluster): the K best trials of the earlier study, by its own objective (`ranked_trials`), are
enqueued in the new study's Optuna study (``enqueue_trial``) before it samples anything. Only
the fields the new spec searches are carried; a value outside the new space is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from study.parquet import ranked_trials
from study.spec import Dimension, StudySpec

__all__ = ["WarmStart", "WarmStartError", "warm_start_points"]


class WarmStartError(ValueError):
    """The earlier study cannot seed this one; the message says why, in one line."""


@dataclass(frozen=True)
class WarmStart:
    """The configurations to enqueue, best first, and what was left out."""

    points: list[dict[str, Any]]
    trial_ids: list[str]
    left_out: list[str]
    """Fields the earlier study's trials have but the new spec does not search."""


def _check(d: Dimension, value: Any, trial_id: str, source: str) -> Any:
    value = d.coerce(value.item() if hasattr(value, "item") else value)
    if d.values is not None:
        if value not in d.values:
            raise WarmStartError(
                f"--warm-start {source}: trial {trial_id} has {d.name} = {value!r}, not one of this "
                f"spec's values {list(d.values)}; widen [space.{d.name}] or lower --top"
            )
        return value
    assert d.low is not None and d.high is not None
    if not (d.low <= value <= d.high):
        raise WarmStartError(
            f"--warm-start {source}: trial {trial_id} has {d.name} = {value!r}, outside this spec's "
            f"range [{d.low}, {d.high}]; widen [space.{d.name}] or lower --top"
        )
    return value


def warm_start_points(
    spec: StudySpec, earlier: StudySpec, trials: pd.DataFrame, top: int, source: str
) -> WarmStart:
    """The ``top`` best trials of ``earlier`` (its trials table ``trials``) as points of ``spec``'s space."""
    if top < 1:
        raise WarmStartError(f"--top must be a positive integer, got {top}")
    ranked = ranked_trials(trials, earlier.metric, earlier.mode).head(top)
    if ranked.empty:
        raise WarmStartError(f"--warm-start {source}: it has no trial that ended with a result to start from")
    searched = {d.name: d for d in spec.space}
    points, ids = [], []
    for _, row in ranked.iterrows():
        point = {}
        for name, d in searched.items():
            value = row.get(name)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue  # the earlier study has no value: Optuna samples it
            point[name] = _check(d, value, str(row["trial_id"]), source)
        points.append(point)
        ids.append(str(row["trial_id"]))
    left_out = sorted({dim.name for dim in earlier.space} - set(searched))
    return WarmStart(points, ids, left_out)
