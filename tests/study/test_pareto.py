"""The Pareto front: checked against a brute-force definition on random points."""

from __future__ import annotations

import numpy as np
import pytest

from study.records.pareto import pareto_mask
from study.records.ranking import beats_chance, chance_bar, front_eligible, pareto_marks


def _dominated(x: np.ndarray, i: int, sign: np.ndarray) -> bool:
    a = x[i] * sign
    for j in range(len(x)):
        b = x[j] * sign
        if j != i and np.isfinite(b).all() and (b >= a).all() and (b > a).any():
            return True
    return False


@pytest.mark.parametrize("modes", [("max", "min"), ("max", "max"), ("min",), ("max", "min", "min")])
def test_the_front_is_exactly_the_undominated_trials(modes: tuple[str, ...]) -> None:
    rng = np.random.default_rng(len(modes))
    x = rng.integers(0, 6, size=(60, len(modes))).astype(float)  # ties on purpose
    sign = np.array([1.0 if m == "max" else -1.0 for m in modes])
    mask = pareto_mask(x, modes)
    assert mask.any()
    for i in range(len(x)):
        assert mask[i] == (not _dominated(x, i, sign)), i


def test_accuracy_against_steps() -> None:
    # (halted accuracy, mean halting step): max the first, min the second
    x = np.array([[0.99, 6.0], [0.98, 3.0], [0.97, 5.0], [0.99, 7.0], [np.nan, 1.0], [0.5, 1.0]])
    assert pareto_mask(x, ["max", "min"]).tolist() == [True, True, False, False, False, True]


def test_bad_shapes_and_modes_are_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        pareto_mask(np.zeros((3, 2)), ["max"])
    with pytest.raises(ValueError, match="'max' or 'min'"):
        pareto_mask(np.zeros((3, 1)), ["maximise"])


def test_the_front_admits_completed_trials_above_the_chance_bar() -> None:
    # parity on 200 samples: 0.5 + 3 * sqrt(0.25 / 200) = 0.6061; 0.605 is beaten by nothing
    # but is not above it, so there is no front (what the report's Pareto caption then says)
    bar = chance_bar("parity", 200)
    assert bar == pytest.approx(0.606066, abs=1e-6)
    assert chance_bar("parity", None) == 0.5 and chance_bar("no-such-task", 200) is None
    objectives = [("test/halted_accuracy", "max"), ("test/mean_halting_step", "min")]
    row = {"status": "completed", "task": "parity", "eval_samples": 200, "test/mean_halting_step": 1.9}
    best = {**row, "test/halted_accuracy": 0.605}
    assert not beats_chance(best, "test/halted_accuracy") and not front_eligible(best, objectives)
    assert pareto_marks([best], objectives) == [False]
    above = {**row, "test/halted_accuracy": 0.607}
    assert front_eligible(above, objectives) and pareto_marks([best, above], objectives) == [False, True]
    assert not front_eligible({**above, "status": "early_stopped"}, objectives)
