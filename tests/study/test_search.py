"""DivergenceAwareOptunaSearch on a real Optuna journal: what Optuna is told when a restored
trial ends (Tune's calls made by hand, as a resume makes them)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import optuna
import pytest

from study.records.records import EndRecord
from study.search.journal import flush_journals
from study.search.search import (
    TUNE_ID_ATTR,
    DivergenceAwareOptunaSearch,
    SearcherStateError,
    make_searcher,
    optuna_storage,
    param_space,
)
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths, trial_reports

SPEC = load_spec("parity-smoke")
METRIC = SPEC.metric


def _searcher(paths: StudyPaths) -> DivergenceAwareOptunaSearch:
    """The study's searcher asking Optuna for each trial as Tune wants it: one ask a suggest
    (asking ahead has tests of its own)."""
    searcher = make_searcher(SPEC, paths, ask_ahead=False).searcher  # the ConcurrencyLimiter's Optuna search
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

    restored = make_searcher(SPEC, paths, ask_ahead=False).searcher
    restored.restore(str(tmp_path / "searcher.pkl"))  # a resume
    with caplog.at_level(logging.WARNING):
        restored.on_trial_complete("t1", result={})
    trial = _optuna_trial(paths)
    assert (trial.state, trial.value) == (optuna.trial.TrialState.COMPLETE, 0.75)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def _study(paths: StudyPaths) -> optuna.Study:
    return optuna.load_study(study_name=paths.name, storage=optuna_storage(paths))


def test_an_optuna_trial_tune_never_saved_goes_to_the_next_new_trial(tmp_path: Path) -> None:
    """A driver killed between Optuna's ask and Tune's next state save leaves an Optuna trial
    RUNNING that no Tune trial knows. On resume it is handed to the next new Tune trial (same
    params, tagged with the new id) instead of a new ask: one Optuna trial per Tune trial."""
    paths = StudyPaths(str(tmp_path), "s")
    searcher = _searcher(paths)
    searcher.suggest("t1")
    searcher.save(str(tmp_path / "searcher.pkl"))  # Tune's state holds t1 only
    orphan = searcher.suggest("t2")  # then the kill

    restored = make_searcher(SPEC, paths, ask_ahead=False).searcher
    restored.restore(str(tmp_path / "searcher.pkl"))
    restored.rebind(paths)
    restored.reconcile({"t1": {}}, {})
    assert restored.suggest("t3") == orphan
    trials = _study(paths).trials
    assert len(trials) == 2
    assert [t.user_attrs[TUNE_ID_ATTR] for t in trials] == ["t1", "t3"]
    restored.suggest("t4")  # then new asks
    assert [t.user_attrs[TUNE_ID_ATTR] for t in _study(paths).trials] == ["t1", "t3", "t4"]


@pytest.mark.parametrize("outcome", ["completed", "early_stopped", "diverged"])
def test_replay_tells_optuna_the_ends_it_missed(tmp_path: Path, outcome: str) -> None:
    """A trial whose end record exists but whose Optuna trial is still RUNNING (a kill between
    the record and the searcher's tell) is told its end from the record at resume."""
    paths = StudyPaths(str(tmp_path), "s")
    searcher = _searcher(paths)
    searcher.suggest("t1")
    searcher.suggest("t2")
    end = EndRecord("t1", outcome, 60, last_result={METRIC: 0.875, "outcome": "completed"})
    searcher.reconcile({"t2": {}}, {"t1": end})
    t1, t2 = _study(paths).trials
    if outcome == "diverged":
        assert t1.state == optuna.trial.TrialState.FAIL
    else:
        assert (t1.state, t1.value) == (optuna.trial.TrialState.COMPLETE, 0.875)
    assert t2.state == optuna.trial.TrialState.RUNNING  # still Tune's to run
    searcher.on_trial_complete("t1", result={METRIC: 0.1})  # Tune's own tell later: not twice
    assert _study(paths).trials[0].state == t1.state


def test_a_new_tune_experiment_on_an_existing_journal_adopts_its_running_trials(tmp_path: Path) -> None:
    """Killed before Tune saved any state (or with its only state torn), a study resumes as a new
    Tune experiment on its Optuna journal: the trials asked before the kill are reused, not left
    RUNNING beside new ones."""
    paths = StudyPaths(str(tmp_path), "s")
    first = _searcher(paths)
    asked = [first.suggest("t1"), first.suggest("t2")]
    again = _searcher(paths)  # the resume's searcher, built anew
    assert [again.suggest("u1"), again.suggest("u2")] == asked
    again.suggest("u3")
    trials = _study(paths).trials
    assert [t.user_attrs[TUNE_ID_ATTR] for t in trials] == ["u1", "u2", "u3"]


def test_a_searcher_built_again_does_not_draw_its_first_points_again(tmp_path: Path) -> None:
    """A resume builds the sampler again (a new Tune experiment, or a pickle older than the
    journal): seeded as at the start, it would propose the study's first configurations again."""
    paths = StudyPaths(str(tmp_path), "s")
    first = _searcher(paths)
    asked = [first.suggest("t1"), first.suggest("t2")]
    again = _searcher(paths)  # both asked trials are orphans: u1 and u2 take them
    assert [again.suggest("u1"), again.suggest("u2")] == asked
    assert again.suggest("u3") not in asked


def test_a_report_or_end_of_a_trial_optuna_does_not_hold_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = StudyPaths(str(tmp_path), "s")
    searcher = _searcher(paths)
    searcher.suggest("t1")
    with caplog.at_level(logging.WARNING):
        searcher.on_trial_result("stranger", {METRIC: 0.5, "training_iteration": 1, "iteration": 10})
        searcher.on_trial_complete("stranger", result={METRIC: 0.5})
    assert "no open trial for Tune trial stranger" in caplog.text
    assert [t.state for t in _study(paths).trials] == [optuna.trial.TrialState.RUNNING]


def test_the_searcher_takes_rays_arguments_in_rays_order(tmp_path: Path) -> None:
    """A subclass of Ray's OptunaSearch is built as Ray's is: the space first, positional."""
    import inspect

    from ray.tune.search.optuna import OptunaSearch

    ours = list(inspect.signature(DivergenceAwareOptunaSearch).parameters.values())
    rays = list(inspect.signature(OptunaSearch).parameters.values())
    positional = [p.name for p in ours if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == [p.name for p in rays]
    assert [p.default for p in ours[: len(rays)]] == [p.default for p in rays]
    space = {"x": optuna.distributions.FloatDistribution(0, 1)}
    searcher = DivergenceAwareOptunaSearch(space, METRIC, "max", paths=StudyPaths(str(tmp_path), "s"))
    assert (searcher.metric, searcher.mode) == (METRIC, "max")
    assert searcher.suggest("t1") is not None


def test_the_searcher_refuses_a_storage_other_than_its_journal(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="pass paths, not storage"):
        DivergenceAwareOptunaSearch(
            storage=optuna.storages.InMemoryStorage(), paths=StudyPaths(str(tmp_path), "s")
        )


def _saved_state(paths: StudyPaths, checkpoint: Path) -> None:
    searcher = _searcher(paths)
    searcher.suggest("t1")
    searcher.save(str(checkpoint))


@pytest.mark.parametrize("other", ["empty", "another"])
def test_a_state_restored_into_another_study_is_refused_at_once(tmp_path: Path, other: str) -> None:
    """The study is its journal, not the pickle: a state saved by a searcher of one study, restored
    into a searcher of an empty study folder or of another study (the same name, elsewhere), is
    refused by `restore` itself, saying what to do, not by a KeyError at a later call."""
    checkpoint = tmp_path / "searcher.pkl"
    _saved_state(StudyPaths(str(tmp_path / "a"), "s"), checkpoint)
    paths = StudyPaths(str(tmp_path / "b"), "s")
    if other == "another":
        _searcher(paths).suggest("u1")
    restored = make_searcher(SPEC, paths, ask_ahead=False).searcher
    with pytest.raises(SearcherStateError, match="built with the StudyPaths of the study that saved it"):
        restored.restore(str(checkpoint))


def test_a_searcher_tune_unpickled_is_refused_when_rebound_to_another_study(tmp_path: Path) -> None:
    """Tune unpickles the searcher with the first run's paths; the resume's `rebind` is where a
    journal that lacks its study is found, and said."""
    import pickle

    paths = StudyPaths(str(tmp_path / "a"), "s")
    searcher = _searcher(paths)
    searcher.suggest("t1")
    unpickled = pickle.loads(pickle.dumps(searcher))
    with pytest.raises(SearcherStateError, match="does not hold"):
        unpickled.rebind(StudyPaths(str(tmp_path / "b"), "s"))


def test_an_ask_cut_short_by_a_kill_is_finished_and_run_not_failed_beside_a_new_one(tmp_path: Path) -> None:
    """Optuna writes an ask's parameters one journal record each: a driver killed inside the ask
    leaves a RUNNING trial with some of them. The next new Tune trial takes it, its missing
    parameters drawn then: one Optuna trial per Tune trial, none FAILED beside them (seen in the
    kill campaign, seed 390991844: 9 finished Optuna trials for 8 Tune trials)."""
    paths = StudyPaths(str(tmp_path), "s")
    searcher = _searcher(paths)
    searcher.suggest("t1")
    searcher.save(str(tmp_path / "searcher.pkl"))
    study = _study(paths)
    cut = study.ask()  # the kill came after its first parameter reached the journal
    cut.suggest_float("lambda_p", 0.05, 0.95)
    flush_journals()

    restored = make_searcher(SPEC, paths, ask_ahead=False).searcher
    restored.restore(str(tmp_path / "searcher.pkl"))
    restored.rebind(paths)
    restored.reconcile({"t1": {}}, {})
    params = restored.suggest("t2")
    assert params is not None and params["lambda_p"] == cut.params["lambda_p"]
    assert {d.name for d in SPEC.space} <= set(params)
    trials = _study(paths).trials
    assert [t.number for t in trials] == [0, 1]
    assert [t.user_attrs[TUNE_ID_ATTR] for t in trials] == ["t1", "t2"]
    assert all(t.state == optuna.trial.TrialState.RUNNING for t in trials)


def _asking_ahead(paths: StudyPaths) -> DivergenceAwareOptunaSearch:
    searcher = make_searcher(SPEC, paths).searcher  # as the driver makes it: asking ahead
    assert isinstance(searcher, DivergenceAwareOptunaSearch)
    assert searcher.set_search_properties(None, None, param_space(SPEC))
    return searcher


def test_the_next_trial_is_asked_ahead_and_none_beyond_the_study_s_trials(tmp_path: Path) -> None:
    """After each suggestion the next trial is asked for in a thread, and handed to the next
    suggestion; never more Optuna trials than the study's ``num_samples``."""
    paths = StudyPaths(str(tmp_path), "s")
    searcher = _asking_ahead(paths)
    searcher.suggest("t1")
    assert searcher._ahead is not None
    ahead = searcher._ahead.result()
    params = searcher.suggest("t2")
    assert params is not None and params["lambda_p"] == ahead.params["lambda_p"]
    for k in range(3, SPEC.search.num_samples + 1):
        searcher.suggest(f"t{k}")
    assert searcher._ahead is None  # the study has all its trials
    trials = _study(paths).trials
    assert len(trials) == SPEC.search.num_samples
    assert [t.user_attrs[TUNE_ID_ATTR] for t in trials] == [f"t{k}" for k in range(1, len(trials) + 1)]


def test_a_trial_asked_ahead_when_the_driver_is_killed_goes_to_the_next_new_trial(tmp_path: Path) -> None:
    """A kill once the trial asked ahead reached the journal leaves it RUNNING with no Tune trial:
    the resume gives it to the next new trial, not a new ask (one Optuna trial per Tune trial);
    and the searcher's saved state, taken with an ask in flight, holds no part of it."""
    paths = StudyPaths(str(tmp_path), "s")
    searcher = _asking_ahead(paths)
    searcher.suggest("t1")
    searcher.save(str(tmp_path / "searcher.pkl"))  # Tune's save, the ask in flight or done
    assert searcher._ahead is not None
    ahead = searcher._ahead.result()
    flush_journals()  # on the file when the kill comes
    restored = make_searcher(SPEC, paths).searcher
    restored.restore(str(tmp_path / "searcher.pkl"))
    restored.rebind(paths)
    restored.reconcile({"t1": {}}, {})
    params = restored.suggest("u2")
    assert params is not None and params["lambda_p"] == ahead.params["lambda_p"]
    assert [t.user_attrs.get(TUNE_ID_ATTR) for t in _study(paths).trials][:2] == ["t1", "u2"]
