"""DivergenceAwareOptunaSearch on a real Optuna journal: what Optuna is told when a restored
trial ends (Tune's calls made by hand, as a resume makes them)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import optuna
import pytest

from study.search import DivergenceAwareOptunaSearch, make_searcher, optuna_storage, param_space
from study.spec import load_spec
from study.storage import StudyPaths, trial_reports

SPEC = load_spec("parity-smoke")
METRIC = SPEC.metric


def _searcher(paths: StudyPaths) -> DivergenceAwareOptunaSearch:
    searcher = make_searcher(SPEC, paths).searcher  # the ConcurrencyLimiter's Optuna search
    assert isinstance(searcher, DivergenceAwareOptunaSearch)
    assert searcher.set_search_properties(None, None, param_space(SPEC))
    return searcher


def _optuna_trial(paths: StudyPaths) -> optuna.trial.FrozenTrial:
    study = optuna.load_study(study_name=paths.name, storage=optuna_storage(paths))
    (trial,) = study.trials
    return trial


def _save_reports(paths: StudyPaths, trial_id: str, values: list[float]) -> None:
    lines = [json.dumps({"iteration": 10 * (i + 1), METRIC: v}) for i, v in enumerate(values)]
    path = Path(trial_reports(paths.reports_dir, trial_id))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("result", [None, {}, {"iteration": 10, METRIC: 0.5}], ids=["none", "empty", "stale"])
def test_a_restored_trial_that_ended_tells_optuna_its_last_saved_report(
    tmp_path: Path, result: dict[str, Any] | None
) -> None:
    """A kill between ASHA's record of a stop and Optuna's tell leaves the trial's end to the
    resume, where the trial returns without a report: Optuna must get the value it ended on
    (from the reports saved before the ledger), not PRUNED without a value, nor a stale one."""
    paths = StudyPaths(str(tmp_path), "s")
    searcher = _searcher(paths)
    assert searcher.suggest("t1") is not None
    _save_reports(paths, "t1", [0.5, 0.875])
    searcher.on_trial_complete("t1", result=result)
    trial = _optuna_trial(paths)
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert trial.value == 0.875


def test_a_trial_optuna_already_has_is_not_told_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The searcher state Tune restores may predate Optuna's tell (the journal is written at
    once, Tune's state every few seconds): the restored trial's end is not told twice."""
    paths = StudyPaths(str(tmp_path), "s")
    searcher = _searcher(paths)
    assert searcher.suggest("t1") is not None
    searcher.save(str(tmp_path / "searcher.pkl"))  # Tune's state, saved before the trial ended
    searcher.on_trial_complete("t1", result={"iteration": 60, METRIC: 0.75})

    restored = make_searcher(SPEC, paths).searcher
    restored.restore(str(tmp_path / "searcher.pkl"))  # a resume
    with caplog.at_level(logging.WARNING):
        restored.on_trial_complete("t1", result={})
    trial = _optuna_trial(paths)
    assert (trial.state, trial.value) == (optuna.trial.TrialState.COMPLETE, 0.75)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
