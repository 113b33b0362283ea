"""`map_trials`: the map between Tune's trials and Optuna's, from the journal and the end records."""

from __future__ import annotations

from typing import Any

import optuna
import pytest

from study.records.records import EndRecord
from study.search.trial_map import TUNE_ID_ATTR, map_trials, same_params

RUNNING, COMPLETE = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE
NAMES = ["lambda_p", "max_steps"]


def _trial(
    number: int, lambda_p: float, tune_id: str | None, state: Any = RUNNING
) -> optuna.trial.FrozenTrial:
    dists = {
        "lambda_p": optuna.distributions.FloatDistribution(0.0, 1.0),
        "max_steps": optuna.distributions.IntDistribution(2, 8),
    }
    return optuna.trial.FrozenTrial(
        number=number,
        state=state,
        value=0.5 if state == COMPLETE else None,
        datetime_start=None,
        datetime_complete=None,
        params={"lambda_p": lambda_p, "max_steps": 4},
        distributions=dists,
        user_attrs={TUNE_ID_ATTR: tune_id} if tune_id else {},
        system_attrs={},
        intermediate_values={},
        trial_id=number,
    )


def _config(lambda_p: float) -> dict[str, Any]:
    return {"lambda_p": lambda_p, "max_steps": 4, "task": "parity"}


def _end(trial_id: str, lambda_p: float) -> EndRecord:
    return EndRecord(trial_id, "completed", 60, config=_config(lambda_p), last_result={"acc": 0.5})


def test_the_stuck_study_drops_the_old_experiments_trials() -> None:
    """The repro's shape: 9996d5ee and a31249db, trials of a superseded Tune experiment, repeat the
    configurations Optuna's trials 0 (held by running 752d64c4) and 1 (held by ended f6885e52)."""
    frozen = [_trial(0, 0.51, "752d64c4"), _trial(1, 0.41, "f6885e52", COMPLETE)]
    live = {"752d64c4": _config(0.51), "9996d5ee": _config(0.51), "a31249db": _config(0.41)}
    plan = map_trials(frozen, live, {"f6885e52": _end("f6885e52", 0.41)}, NAMES)
    assert plan.held == {"752d64c4": 0, "f6885e52": 1}
    assert plan.drop == {"9996d5ee", "a31249db"}
    assert (plan.adopt, plan.tell, plan.orphans) == ({}, {}, [])


def test_a_trial_whose_holder_is_gone_is_adopted_by_the_trial_with_its_configuration() -> None:
    """Optuna's trial 0 names a Tune trial that no longer exists: the live trial with its
    configuration takes it over, whatever its id."""
    frozen = [_trial(0, 0.51, "gone"), _trial(1, 0.41, "t1")]
    plan = map_trials(frozen, {"old": _config(0.51), "t1": _config(0.41)}, {}, NAMES)
    assert plan.adopt == {"old": 0} and plan.held == {"t1": 1}
    assert plan.drop == set() and plan.orphans == []


def test_a_trial_optuna_never_had_gets_a_new_optuna_trial_and_unheld_ones_are_orphans() -> None:
    frozen = [_trial(0, 0.51, None), _trial(1, 0.41, "t1", COMPLETE)]
    plan = map_trials(frozen, {"new": _config(0.77)}, {}, NAMES)
    assert plan.adopt == {"new": None}
    assert plan.orphans == [0]  # asked, never held: the next new Tune trial takes it


def test_an_end_optuna_missed_is_told_and_its_configuration_stays_held() -> None:
    """Ended trial e0 holds Optuna trial 0 (still RUNNING: killed before the tell); a live copy
    of its configuration is a duplicate. An ended trial whose tag was lost holds its
    configuration too."""
    frozen = [_trial(0, 0.51, "e0"), _trial(1, 0.41, "other")]
    ends = {"e0": _end("e0", 0.51), "e1": _end("e1", 0.41)}
    plan = map_trials(frozen, {"copy": _config(0.51)}, ends, NAMES)
    assert plan.tell == {0: "e0", 1: "e1"}
    assert plan.drop == {"copy"} and plan.orphans == []


@pytest.mark.parametrize(
    ("params", "config", "same"),
    [
        ({"a": 0.1, "b": 4}, {"a": 0.1, "b": 4, "c": "x"}, True),
        ({"a": 0.1, "b": 4}, {"a": 0.1, "b": 4.0}, True),  # Optuna's int read back as a float
        ({"a": 0.1, "b": 4}, {"a": 0.1000001, "b": 4}, False),
        ({"a": 0.1, "b": 4}, {"a": 0.1}, False),
        ({"a": "x", "b": 4}, {"a": "y", "b": 4}, False),
    ],
)
def test_same_params(params: dict[str, Any], config: dict[str, Any], same: bool) -> None:
    assert same_params(params, config, ["a", "b"]) is same
