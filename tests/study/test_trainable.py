"""NaN safety at the boundary to Tune: nothing non-finite reaches the scheduler or Optuna."""

from __future__ import annotations

import math

import pytest

from study.records.ranking import WORST
from study.run.trainable import tune_metrics


def test_non_finite_metrics_are_left_out_and_lists_get_nulls() -> None:
    m = {"train/loss": math.nan, "test/loss": math.inf, "test/halted_accuracy": 0.75, "outcome": "running",
         "test/halting_distribution": [0.5, math.nan, 0.5]}  # fmt: skip
    out = tune_metrics(m, {"test/halted_accuracy": "max"})
    assert "train/loss" not in out and "test/loss" not in out
    assert out["test/halted_accuracy"] == 0.75
    assert out["test/halting_distribution"] == [0.5, None, 0.5]
    assert out["outcome"] == "running"


@pytest.mark.parametrize(("mode", "stand_in"), [("max", -WORST), ("min", WORST)])
def test_a_non_finite_objective_becomes_the_worst_finite_value(mode: str, stand_in: float) -> None:
    out = tune_metrics({"test/loss": math.nan}, {"test/loss": mode})
    assert out["test/loss"] == stand_in
    assert math.isfinite(out["test/loss"])
