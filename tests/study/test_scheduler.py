"""PersistentASHA: rungs and stop decisions survive a new scheduler (what a resume builds)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ray.tune.schedulers import TrialScheduler

from study.records.records import read_end_records, read_reports
from study.search.scheduler import PersistentASHA, stopped_trials
from study.storage.storage import StudyPaths


def _asha(state: Path, grace_period: int = 10, paths: StudyPaths | None = None) -> PersistentASHA:
    return PersistentASHA(
        state_uri=str(state),
        paths=paths,
        time_attr="iteration",
        metric="acc",
        mode="max",
        max_t=40,
        grace_period=grace_period,
        reduction_factor=2,
        stop_last_trials=False,  # as make_scheduler builds it
    )


def test_persistent_asha_keeps_rays_defaults(tmp_path: Path) -> None:
    """A subclass of Ray's scheduler keeps its documented defaults; the study's own choice
    (``stop_last_trials=False``: a trial ends by itself at its budget) is made in make_scheduler."""
    from ray.tune.schedulers import AsyncHyperBandScheduler

    from study.search.search import make_scheduler
    from study.spec.spec import load_spec

    ours = PersistentASHA(metric="acc", mode="max", state_uri=str(tmp_path / "asha.json"))
    assert ours._stop_last_trials == AsyncHyperBandScheduler(metric="acc", mode="max")._stop_last_trials
    spec = load_spec("parity-smoke")
    assert make_scheduler(spec, StudyPaths(str(tmp_path), "s"))._stop_last_trials is False


def _trial(trial_id: str, local_path: Path | None = None) -> Any:
    return SimpleNamespace(
        trial_id=trial_id,
        local_path=str(local_path) if local_path else None,
        config={"lambda_p": 0.2},
        last_result={"config": {"lambda_p": 0.2}, "iteration": 10},
        checkpoint=None,
    )


def _report(s: PersistentASHA, trial: Any, iteration: int, acc: float) -> str:
    return s.on_trial_result(None, trial, {"iteration": iteration, "acc": acc})  # type: ignore[arg-type]


def test_rungs_and_stops_survive_a_new_scheduler(tmp_path: Path) -> None:
    state = tmp_path / "asha.json"
    first = _asha(state)
    a, b, c = _trial("a"), _trial("b"), _trial("c")
    for t in (a, b, c):
        first.on_trial_add(None, t)  # type: ignore[arg-type]
    assert _report(first, a, 10, 0.5) == TrialScheduler.CONTINUE  # first at the rung: nothing to compare
    assert _report(first, b, 10, 0.9) == TrialScheduler.CONTINUE
    assert _report(first, c, 10, 0.1) == TrialScheduler.STOP  # below the rung's median (0.7)
    assert _report(first, c, 10, 0.1) == TrialScheduler.STOP  # and stays stopped
    first.on_trial_complete(None, c, {"iteration": 10, "acc": 0.1})  # type: ignore[arg-type]
    assert stopped_trials(str(state)) == {"c"}

    # the study is resumed: Ray builds the scheduler anew and re-adds the trials
    second = _asha(state)
    for t in (a, b, c):
        second.on_trial_add(None, t)  # type: ignore[arg-type]
    assert _report(second, c, 20, 0.99) == TrialScheduler.STOP  # a stopped trial stays stopped
    d = _trial("d")
    second.on_trial_add(None, d)  # type: ignore[arg-type]
    # a new trial is judged against the rung the first scheduler filled (a fresh ASHA would let it on)
    assert _report(second, d, 10, 0.3) == TrialScheduler.STOP


def test_a_fresh_scheduler_has_nothing_to_judge_against(tmp_path: Path) -> None:
    """The control for the test above: without the saved rungs the same report continues."""
    s = _asha(tmp_path / "asha.json")
    d = _trial("d")
    s.on_trial_add(None, d)  # type: ignore[arg-type]
    assert _report(s, d, 10, 0.3) == TrialScheduler.CONTINUE


def test_changed_asha_settings_are_refused_on_resume(tmp_path: Path) -> None:
    state = tmp_path / "asha.json"
    s = _asha(state)
    s.on_trial_add(None, _trial("a"))  # type: ignore[arg-type]
    other = _asha(state, grace_period=5)
    with pytest.raises(ValueError, match="ASHA settings changed"):
        other.on_trial_add(None, _trial("a"))  # type: ignore[arg-type]


def test_reaching_the_budget_is_not_an_early_stop(tmp_path: Path) -> None:
    state = tmp_path / "asha.json"
    s = _asha(state)
    a = _trial("a")
    s.on_trial_add(None, a)  # type: ignore[arg-type]
    for it in (10, 20, 30, 40):
        _report(s, a, it, 0.9)
    assert stopped_trials(str(state)) == set()


def test_a_stop_is_saved_after_the_trials_reports(tmp_path: Path) -> None:
    """ASHA's stop reaches asha.json only when Tune completes the trial, after it logged the
    report ASHA stopped it on, and the trial's end record, with its reports and its state in
    ASHA, is written first: a resume never trains a stopped trial again, so a kill in between
    must not lose them."""
    paths = StudyPaths(str(tmp_path), "s")
    state = Path(paths.asha)
    staging = tmp_path / "staging"
    staging.mkdir()
    s = _asha(state, paths=paths)
    a, b = _trial("a"), _trial("b", local_path=staging)
    for t in (a, b):
        s.on_trial_add(None, t)  # type: ignore[arg-type]
    _report(s, a, 10, 0.9)
    assert _report(s, b, 10, 0.1) == TrialScheduler.STOP
    assert stopped_trials(str(state)) == set()  # Tune has not logged b's report yet
    assert read_end_records(paths) == {}
    lines = '{"iteration": 10, "acc": 0.1}\n'
    (staging / "result.json").write_text(lines)  # what Tune's JSON logger does next
    s.on_trial_complete(None, b, {"iteration": 10, "acc": 0.1})  # type: ignore[arg-type]
    assert stopped_trials(str(state)) == {"b"}
    assert read_reports(paths, "b") == [{"iteration": 10, "acc": 0.1}]
    assert not Path(paths.reports_dir).exists()  # kept in the end record, not apart
    end = read_end_records(paths)["b"]
    assert (end.outcome, end.iteration, end.config) == ("early_stopped", 10, {"lambda_p": 0.2})
    assert end.last_result == {"config": {"lambda_p": 0.2}, "iteration": 10}  # Tune's, nested
    assert end.asha == [["assign", "b", 0], ["rung", 0, 10, "b", 0.1], ["stop", "b"]]
    # a new scheduler (a resume) still stops it
    again = _asha(state, paths=paths)
    again.on_trial_add(None, b)  # type: ignore[arg-type]
    assert _report(again, b, 20, 0.99) == TrialScheduler.STOP


def test_persistent_asha_takes_rays_arguments(tmp_path: Path) -> None:
    """Ray's positional arguments reach Ray's scheduler; the state goes where it is told, by
    default the study's asha.json."""
    s = PersistentASHA("iteration", "acc", "max", 40, state_uri=str(tmp_path / "state.json"))
    assert (s._time_attr, s._metric, s._mode, s._max_t) == ("iteration", "acc", "max", 40)
    assert s._state_uri == str(tmp_path / "state.json")
    paths = StudyPaths(str(tmp_path), "s")
    assert PersistentASHA(metric="acc", mode="max", paths=paths)._state_uri == paths.asha
    with pytest.raises(TypeError, match="state_uri or paths"):
        PersistentASHA(metric="acc", mode="max")


class _Controller:
    """What the scheduler's choice reads of Tune's controller: its trials, counted."""

    def __init__(self) -> None:
        self.trials: list[Any] = []
        self.listed = 0

    def get_trials(self) -> list[Any]:
        self.listed += 1
        return self.trials

    def checkpoint(self, force: bool, wait: bool) -> None:  # Tune's whole state saved: once
        self.saves = getattr(self, "saves", 0) + 1

    def add(self, scheduler: Any, trial: Any) -> None:  # as TuneController.add_trial does
        self.trials.append(trial)
        scheduler.on_trial_add(self, trial)


def test_the_choice_is_tune_s_fifo_over_the_trials_in_flight_not_the_whole_study(tmp_path: Path) -> None:
    """The first pending trial in Tune's order, else the first paused one; ended trials leave
    the choice, an errored trial Tune requeues goes to the end; the study's list of trials is
    read once a driver, not at every choice (it was a walk over 10,000 trials a start)."""
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import FIFOScheduler

    from study.search.scheduler import SnapshotBeforeStart

    scheduler = SnapshotBeforeStart(paths=None)
    controller = _Controller()
    before = Trial("__fake", stub=True)
    controller.trials.append(before)  # held by Tune before the scheduler saw it (a restore)
    trials = [Trial("__fake", stub=True) for _ in range(4)]
    for trial in trials:
        controller.add(scheduler, trial)
    fifo = FIFOScheduler()
    for status in ("PENDING", "PAUSED", "RUNNING"):
        before.set_status(status)
        assert scheduler.choose_trial_to_run(controller) is fifo.choose_trial_to_run(controller)
    listed = controller.listed  # once by the scheduler, the rest by the FIFO it is held against
    before.set_status(Trial.TERMINATED)
    trials[0].set_status(Trial.ERROR)
    trials[1].set_status(Trial.PAUSED)
    trials[3].set_status(Trial.PAUSED)
    assert scheduler.choose_trial_to_run(controller) is trials[2]
    trials[2].set_status(Trial.RUNNING)
    assert scheduler.choose_trial_to_run(controller) is trials[1]
    trials[1].set_status(Trial.TERMINATED)
    assert scheduler.choose_trial_to_run(controller) is trials[3]
    trials[0].set_status(Trial.PENDING)  # Tune's requeue of an errored trial: to the end, added again
    controller.trials.remove(trials[0])
    controller.add(scheduler, trials[0])
    assert scheduler.choose_trial_to_run(controller) is trials[0]
    trials[3].set_status(Trial.PENDING)
    assert scheduler.choose_trial_to_run(controller) is trials[3]
    assert controller.listed == listed  # the study's trials not read again
    assert fifo.choose_trial_to_run(controller) is trials[3]
    assert controller.saves == 1
    assert set(scheduler._in_flight.open) == {t.trial_id for t in (trials[0], trials[2], trials[3])}
