"""An ended trial's running statistics in Tune's state cut to the study's objectives
(`study.run.slim_trials`)."""

from __future__ import annotations

import json

from ray.tune.experiment import Trial

from study.run.slim_trials import SlimEndedTrials


def _reported(n_reports: int) -> Trial:
    trial = Trial("__fake", stub=True)
    for step in range(1, n_reports + 1):
        report = {f"test/accuracy_at_step_{k}": 0.5 + k / 100 for k in range(40)}
        report.update(
            {"test/halted_accuracy": 0.9, "test/mean_halting_step": 3.0, "training_iteration": step}
        )
        trial.update_last_result(report)
    return trial


def test_an_ended_trial_keeps_the_statistics_of_the_objectives_only_and_tune_saves_them_so() -> None:
    trial = _reported(12)
    before = trial.get_json_state()  # Tune's saved form, cached until the trial changes
    objectives = ("test/halted_accuracy", "test/mean_halting_step")
    SlimEndedTrials(objectives).on_trial_complete(0, [trial], trial)
    analysis = trial.run_metadata.metric_analysis
    assert set(analysis) == {*objectives, "training_iteration"}
    assert analysis["test/halted_accuracy"]["max"] == 0.9
    assert trial.run_metadata.metric_n_steps == {}  # completed: it never reports again
    after = trial.get_json_state()
    assert after != before  # not Tune's cached form of the whole statistics
    saved = json.loads(after[1])
    assert set(saved["metric_analysis"]) == set(analysis)
    assert len(after[1]) < len(before[1]) / 4
    assert saved["last_result"]["test/accuracy_at_step_3"] == 0.53  # the last report itself is kept


def test_a_trial_without_other_statistics_is_left_as_it_was() -> None:
    trial = Trial("__fake", stub=True)
    trial.update_last_result({"test/halted_accuracy": 0.9, "training_iteration": 1})
    state = trial.get_json_state()
    SlimEndedTrials(["test/halted_accuracy"]).on_trial_error(0, [trial], trial)
    assert trial.get_json_state()[0] is state[0]  # nothing dropped: Tune's cached form kept


def test_an_errored_trial_keeps_its_windows_and_reports_again_when_a_resume_retries_it() -> None:
    trial = _reported(12)
    SlimEndedTrials(["test/halted_accuracy"]).on_trial_error(0, [trial], trial)
    assert set(trial.run_metadata.metric_n_steps) == {"test/halted_accuracy", "training_iteration"}
    trial.update_last_result({"test/halted_accuracy": 0.5, "training_iteration": 13})
    analysis = trial.run_metadata.metric_analysis["test/halted_accuracy"]
    assert analysis["last-5-avg"] == (0.9 * 4 + 0.5) / 5
