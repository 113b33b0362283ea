"""Which trials are results and how they rank: what "the best trial" and "the Pareto front" mean
wherever a study names them (``status``, the run's summary, the report, ``evaluate``, the
``pareto`` column of the Parquet).

A trial is ranked when it ended with a result (`ENDED_WITH_RESULT`) and its objective is finite
(the trainable's stand-in for a non-finite one, `WORST`, is never a value); it is on the front when
it also ran its whole budget and beat chance (`front_eligible`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ponder.tasks import CHANCE
from study.records.pareto import pareto_mask

__all__ = [
    "ENDED_WITH_RESULT",
    "WORST",
    "beats_chance",
    "chance_bar",
    "front_eligible",
    "leaderboard",
    "pareto_marks",
    "ranked_trials",
]

ENDED_WITH_RESULT = ("completed", "early_stopped")
"""The statuses of trials that ended with a result: those ranked, put on a Pareto front, evaluated."""

WORST = 1e30
"""Magnitude of the trainable's stand-in for a non-finite objective (-WORST when maximising,
+WORST when minimising): never a real value, so the Parquet shows it as null. Only in the
objective's own columns, and only that exact value: any other metric keeps every finite value
(a loss of 1.15e30 after a learning rate of 1e30 is a real, if dreadful, number)."""


def chance_bar(task: Any, eval_samples: Any) -> float | None:
    """The halted accuracy a trial of ``task`` must exceed to beat chance: chance plus 3 standard
    errors of an evaluation set of ``eval_samples`` (chance alone where the size is unknown);
    None for a task without a known chance level."""
    chance = CHANCE.get(str(task))
    if chance is None:
        return None
    size = float(eval_samples) if isinstance(eval_samples, numbers.Real) else math.nan  # numpy, pandas too
    return chance + (3 * math.sqrt(chance * (1 - chance) / size) if size > 0 else 0.0)  # NaN > 0 is False


def beats_chance(row: Mapping[str, Any], accuracy: str) -> bool:
    """Whether a trial's halted accuracy is above a guess's by more than 3 standard errors of its
    evaluation set (``eval_samples``, `chance_bar`): 0.5 + 3 * sqrt(0.25 / 200) = 0.606 for parity-smoke."""
    bar = chance_bar(row.get("task"), row.get("eval_samples"))
    value = row.get(accuracy)
    if bar is None:
        return True  # a task without a known chance level is not held to one
    return isinstance(value, numbers.Real) and math.isfinite(value) and float(value) > bar


def front_eligible(row: Mapping[str, Any], objectives: Sequence[tuple[str, str]]) -> bool:
    """Whether a trial may be on the Pareto front of ``objectives``: it ran its full budget
    (``completed``) and each of its halted accuracies among them beats chance (`beats_chance`)."""
    return row.get("status") == "completed" and all(
        beats_chance(row, m) for m, _ in objectives if m.endswith("/halted_accuracy")
    )


def pareto_marks(rows: Sequence[Mapping[str, Any]], objectives: Sequence[tuple[str, str]]) -> list[bool]:
    """Which rows are Pareto-optimal on ``objectives`` among the trials `front_eligible` admits.
    An early-stopped trial was measured on a smaller budget, and a trial at chance answers
    nothing however few its steps: neither is a trade-off anyone would pick, so neither is on the
    front."""
    eligible = [i for i, r in enumerate(rows) if front_eligible(r, objectives)]
    marks = [False] * len(rows)
    if not eligible or not objectives:
        return marks

    def value(v: Any) -> float:
        ok = isinstance(v, (int, float)) and math.isfinite(v) and abs(v) < WORST
        return float(v) if ok else math.nan

    values = np.array([[value(rows[i].get(m)) for m, _ in objectives] for i in eligible])  # [n, k]
    for i, on_front in zip(eligible, pareto_mask(values, [mode for _, mode in objectives]), strict=True):
        marks[i] = bool(on_front)
    return marks


def ranked_trials(trials: pd.DataFrame, metric: str, mode: str) -> pd.DataFrame:
    """Rows of a trials table that ended with a result (`ENDED_WITH_RESULT`) and a finite
    ``metric``, best first; ties are broken by trial id so the order is the same on every read.
    What "the best trial" means wherever it is named (the report, ``evaluate``). A diverged or
    errored trial's last value is not a result, a running one's is not final."""
    if metric not in trials.columns or "status" not in trials.columns:
        return trials.iloc[:0]
    values = pd.to_numeric(trials[metric], errors="coerce")
    ok = trials[trials["status"].isin(ENDED_WITH_RESULT) & np.isfinite(values)]
    return ok.sort_values([metric, "trial_id"], ascending=[mode == "min", True], kind="mergesort")


def leaderboard(trials: pd.DataFrame, metric: str, mode: str) -> pd.DataFrame:
    """Every row of a trials table, `ranked_trials` first (so the first row is the best trial
    wherever one is named: ``status``, the run's summary, the report, ``evaluate``), then running
    trials by ``metric`` (leaders of a study in progress, not yet results), then the rest (diverged,
    errored, pending, stopped without a value) by trial id."""
    ranked = ranked_trials(trials, metric, mode)
    rest = trials.drop(index=ranked.index)
    if metric in rest.columns and "status" in rest.columns:
        running = rest[rest["status"] == "running"].sort_values(
            [metric, "trial_id"], ascending=[mode == "min", True], na_position="last", kind="mergesort"
        )
        others = rest.drop(index=running.index).sort_values("trial_id", kind="mergesort")
        rest = pd.concat([running, others])
    return pd.concat([ranked, rest])
