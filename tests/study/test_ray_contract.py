"""Ray's own tests of the classes this project extends, with the project's class swapped in.

Copied from Ray (https://github.com/ray-project/ray, by the Ray authors, under the Apache License
2.0), their Tune API checked against the Ray this project pins (2.60.0):

- ``python/ray/tune/tests/test_trial_scheduler.py`` (at 017deaf1), ``AsyncHyperBandSuite``: its
  cases of ``AsyncHyperBandScheduler`` (the others test other schedulers), in which
  `study.search.scheduler.PersistentASHA` replaces it;
- ``python/ray/tune/tests/test_searchers.py`` (at 03db4911): the OptunaSearch cases of
  ``InvalidValuesTest``, ``AddEvaluatedPointTest``, ``SaveRestoreCheckpointTest`` and
  ``MultiObjectiveTest``;
- ``python/ray/tune/tests/test_sample.py`` (at 00d1eee2): ``testConvertOptuna``,
  ``testSampleBoundsOptuna``, ``testPointsToEvaluateOptuna``;
- ``python/ray/tune/tests/test_tune_restore_warm_start.py`` (at 001dbf67): ``OptunaWarmStartTest``;

in each, ``OptunaSearch`` is `study.search.search.DivergenceAwareOptunaSearch`.

What changed in the copy, beside unittest classes becoming pytest functions: each class is built
with Ray's arguments, as Ray's test builds it, plus what the project's needs, from the fixtures
below (ASHA's state file or study folder; the searcher's study folder, one per searcher as Ray's
each get an in-memory study of their own); Ray's ``Trial("PPO")`` is a stub trial (RLlib's PPO is
not registered here); reports use Tune 2.60's ``tune.report``; Ray is started only by the tests
that run Tune (marked ``ray``), once for the module, and Tune writes under ``tmp_path``. Where the
project differs on purpose, the test is marked ``xfail(strict=True)`` or says ``DIFFERS:``, and
the class's docstring names the difference.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from copy import deepcopy
from pathlib import Path
from typing import Any, TypeVar
from unittest.mock import patch

import numpy as np
import pytest
from ray import tune
from ray.air.constants import TRAINING_ITERATION
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import ConcurrencyLimiter

from study.search.scheduler import PersistentASHA
from study.search.search import DivergenceAwareOptunaSearch, SearcherStateError
from study.storage.storage import StudyPaths

OptunaSearch = DivergenceAwareOptunaSearch  # the swap: Ray's tests name OptunaSearch


# -- fixtures: the project's classes, built as Ray's tests build Ray's ---------------------------


@pytest.fixture(params=["state_file", "study"])
def asha(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., PersistentASHA]:
    """``AsyncHyperBandScheduler(...)`` in Ray's tests: `PersistentASHA` with the same arguments
    and a new place for its state, a bare state file or a study folder (its end records too)."""
    made = itertools.count()

    def make(*args: Any, **kwargs: Any) -> PersistentASHA:
        n = next(made)
        if request.param == "state_file":
            return PersistentASHA(*args, state_uri=str(tmp_path / f"asha-{n}.json"), **kwargs)
        return PersistentASHA(*args, paths=StudyPaths(str(tmp_path), f"asha-{n}"), **kwargs)

    return make


@pytest.fixture
def study_root(tmp_path: Path) -> Iterator[Path]:
    """Where the searchers' study folders go: a RAM disk where there is one, else ``tmp_path``.
    Each suggestion is a few fsynced appends to the study's journal, 4-6 ms each on a disk."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    root = Path(tempfile.mkdtemp(prefix="ponder-ray-contract-", dir=shm))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def optuna_search(study_root: Path) -> Callable[..., DivergenceAwareOptunaSearch]:
    """``OptunaSearch(...)`` in Ray's tests: the project's searcher with the same arguments, on a
    study folder of its own (``study=`` names one, to build a second searcher on it)."""
    made = itertools.count()

    def make(*args: Any, study: str | None = None, **kwargs: Any) -> DivergenceAwareOptunaSearch:
        paths = StudyPaths(str(study_root), study or f"study-{next(made)}")
        return DivergenceAwareOptunaSearch(*args, paths=paths, **kwargs)

    return make


@pytest.fixture(scope="module")
def ray_started() -> Iterator[None]:
    """Ray for the tests that run Tune (Ray's start it per test class): once for the module."""
    import ray

    sigterm = signal.getsignal(signal.SIGTERM)  # ray.init installs its own in the test process
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        signal.signal(signal.SIGTERM, sigterm)


F = TypeVar("F", bound=Callable[..., Any])


def runs_tune(test: F) -> F:
    """Mark a test that runs Tune: ``ray`` (it starts Ray), and in one test process with the
    others (``--dist loadgroup``), so that the module's Ray instance starts once."""
    marked: F = pytest.mark.ray(pytest.mark.xdist_group("ray_contract")(test))
    return marked


def _run(tmp_path: Path, *args: Any, **kwargs: Any) -> Any:
    """``tune.run`` as Ray's tests call it, its results under ``tmp_path`` (not ~/ray_results),
    and one worker for all the trials: Ray's start one per trial (``reuse_actors=False``, also
    tune.run's default), about 5 s each on two cores, which the searcher cannot tell apart."""
    kwargs.setdefault("verbose", 0)
    kwargs["reuse_actors"] = True
    return tune.run(*args, storage_path=str(tmp_path / "ray_results"), **kwargs)


# == test_trial_scheduler.py: AsyncHyperBandSuite ================================================


def result(t: float, rew: float) -> dict[str, Any]:
    return dict(time_total_s=t, episode_reward_mean=rew, training_iteration=int(t))


def _trial() -> Trial:
    return Trial("__fake", stub=True)  # Ray's: Trial("PPO"), RLlib's trainable


def basicSetup(scheduler: PersistentASHA) -> tuple[Trial, Trial]:
    t1 = _trial()  # mean is 450, max 900, t_max=10
    t2 = _trial()  # mean is 450, max 450, t_max=5
    scheduler.on_trial_add(None, t1)
    scheduler.on_trial_add(None, t2)
    for i in range(10):
        assert scheduler.on_trial_result(None, t1, result(i, i * 100)) == TrialScheduler.CONTINUE
    for i in range(5):
        assert scheduler.on_trial_result(None, t2, result(i, 450)) == TrialScheduler.CONTINUE
    return t1, t2


def nanSetup(scheduler: PersistentASHA) -> tuple[Trial, Trial]:
    t1 = _trial()  # mean is 450, max 450, t_max=10
    t2 = _trial()  # mean is nan, max nan, t_max=10
    scheduler.on_trial_add(None, t1)
    scheduler.on_trial_add(None, t2)
    for i in range(10):
        assert scheduler.on_trial_result(None, t1, result(i, 450)) == TrialScheduler.CONTINUE
    for i in range(10):
        assert scheduler.on_trial_result(None, t2, result(i, np.nan)) == TrialScheduler.CONTINUE
    return t1, t2


def test_async_hb_on_complete(asha: Callable[..., PersistentASHA]) -> None:  # testAsyncHBOnComplete
    scheduler = asha(metric="episode_reward_mean", mode="max", max_t=10, brackets=1)
    _t1, t2 = basicSetup(scheduler)
    t3 = _trial()
    scheduler.on_trial_add(None, t3)
    scheduler.on_trial_complete(None, t3, result(10, 1000))
    assert scheduler.on_trial_result(None, t2, result(101, 0)) == TrialScheduler.STOP


def test_async_hb_grace_period(asha: Callable[..., PersistentASHA]) -> None:  # testAsyncHBGracePeriod
    scheduler = asha(
        metric="episode_reward_mean", mode="max", grace_period=2.5, reduction_factor=3, brackets=1
    )
    t1, t2 = basicSetup(scheduler)
    scheduler.on_trial_complete(None, t1, result(10, 1000))
    scheduler.on_trial_complete(None, t2, result(10, 1000))
    t3 = _trial()
    scheduler.on_trial_add(None, t3)
    assert scheduler.on_trial_result(None, t3, result(1, 10)) == TrialScheduler.CONTINUE
    assert scheduler.on_trial_result(None, t3, result(2, 10)) == TrialScheduler.CONTINUE
    assert scheduler.on_trial_result(None, t3, result(3, 10)) == TrialScheduler.STOP


def test_async_hb_all_completes(asha: Callable[..., PersistentASHA]) -> None:  # testAsyncHBAllCompletes
    scheduler = asha(metric="episode_reward_mean", mode="max", max_t=10, brackets=10)
    trials = [_trial() for i in range(10)]
    for t in trials:
        scheduler.on_trial_add(None, t)
    for t in trials:
        assert scheduler.on_trial_result(None, t, result(10, -2)) == TrialScheduler.STOP


def test_async_hb_uses_percentile(asha: Callable[..., PersistentASHA]) -> None:  # testAsyncHBUsesPercentile
    scheduler = asha(
        metric="episode_reward_mean", mode="max", grace_period=1, max_t=10, reduction_factor=2, brackets=1
    )
    t1, t2 = basicSetup(scheduler)
    scheduler.on_trial_complete(None, t1, result(10, 1000))
    scheduler.on_trial_complete(None, t2, result(10, 1000))
    t3 = _trial()
    scheduler.on_trial_add(None, t3)
    assert scheduler.on_trial_result(None, t3, result(1, 260)) == TrialScheduler.STOP
    assert scheduler.on_trial_result(None, t3, result(2, 260)) == TrialScheduler.STOP


def test_async_hb_nan_percentile(asha: Callable[..., PersistentASHA]) -> None:  # testAsyncHBNanPercentile
    scheduler = asha(
        metric="episode_reward_mean", mode="max", grace_period=1, max_t=10, reduction_factor=2, brackets=1
    )
    t1, t2 = nanSetup(scheduler)
    scheduler.on_trial_complete(None, t1, result(10, 450))
    scheduler.on_trial_complete(None, t2, result(10, np.nan))
    t3 = _trial()
    scheduler.on_trial_add(None, t3)
    assert scheduler.on_trial_result(None, t3, result(1, 260)) == TrialScheduler.STOP
    assert scheduler.on_trial_result(None, t3, result(2, 260)) == TrialScheduler.STOP


def test_async_hb_save_restore(
    asha: Callable[..., PersistentASHA], tmp_path: Path
) -> None:  # testAsyncHBSaveRestore
    tmpfile = str(tmp_path / "scheduler.pkl")  # Ray's: tempfile.mkstemp()

    scheduler = asha(
        metric="episode_reward_mean", mode="max", grace_period=1, max_t=10, reduction_factor=2, brackets=1
    )

    # Add some trials
    trials = [_trial() for i in range(10)]
    for t in trials:
        scheduler.on_trial_add(None, t)

    # Report some results
    for t in trials[0:5]:
        assert scheduler.on_trial_result(None, t, result(1, 10)) != TrialScheduler.STOP

    # Report worse result: Trial should stop
    assert scheduler.on_trial_result(None, trials[5], result(1, 5)) == TrialScheduler.STOP

    scheduler.save(tmpfile)

    scheduler2 = asha()
    scheduler2.restore(tmpfile)

    # Report a new bad result: Trial should stop
    assert scheduler2.on_trial_result(None, trials[6], result(1, 4)) == TrialScheduler.STOP

    # Create a new trial and report bad result: Trial should stop
    # Report a new bad result: Trial should stop
    new_trial = _trial()
    scheduler2.on_trial_add(None, new_trial)
    assert scheduler2.on_trial_result(None, new_trial, result(1, 2)) == TrialScheduler.STOP


def test_async_hb_non_stop_trials(asha: Callable[..., PersistentASHA]) -> None:  # testAsyncHBNonStopTrials
    trials = [_trial() for i in range(4)]
    scheduler = asha(
        metric="metric",
        mode="max",
        grace_period=1,
        max_t=3,
        reduction_factor=2,
        brackets=1,
        stop_last_trials=False,
    )
    scheduler.on_trial_add(None, trials[0])
    scheduler.on_trial_add(None, trials[1])
    scheduler.on_trial_add(None, trials[2])
    scheduler.on_trial_add(None, trials[3])

    # Report one result
    action = scheduler.on_trial_result(None, trials[0], {"training_iteration": 2, "metric": 10})
    assert action == TrialScheduler.CONTINUE
    action = scheduler.on_trial_result(None, trials[1], {"training_iteration": 2, "metric": 8})
    assert action == TrialScheduler.STOP
    action = scheduler.on_trial_result(None, trials[2], {"training_iteration": 2, "metric": 6})
    assert action == TrialScheduler.STOP
    action = scheduler.on_trial_result(None, trials[3], {"training_iteration": 2, "metric": 4})
    assert action == TrialScheduler.STOP

    # Report more. This will fail if `stop_last_trials=True`
    action = scheduler.on_trial_result(None, trials[0], {"training_iteration": 4, "metric": 10})
    assert action == TrialScheduler.CONTINUE

    action = scheduler.on_trial_result(None, trials[0], {"training_iteration": 8, "metric": 10})
    assert action == TrialScheduler.CONTINUE

    # Also continue if we fall below the cutoff eventually
    action = scheduler.on_trial_result(None, trials[0], {"training_iteration": 14, "metric": 1})
    assert action == TrialScheduler.CONTINUE


def _test_metrics(
    asha: Callable[..., PersistentASHA],
    result_func: Callable[[int, float], dict[str, Any]],
    metric: str,
    mode: str,
) -> None:
    scheduler = asha(grace_period=1, time_attr="training_iteration", metric=metric, mode=mode, brackets=1)
    t1 = _trial()  # mean is 450, max 900, t_max=10
    t2 = _trial()  # mean is 450, max 450, t_max=5
    scheduler.on_trial_add(None, t1)
    scheduler.on_trial_add(None, t2)
    for i in range(10):
        assert scheduler.on_trial_result(None, t1, result_func(i, i * 100)) == TrialScheduler.CONTINUE
    for i in range(5):
        assert scheduler.on_trial_result(None, t2, result_func(i, 450)) == TrialScheduler.CONTINUE
    scheduler.on_trial_complete(None, t1, result_func(10, 1000))
    assert scheduler.on_trial_result(None, t2, result_func(5, 450)) == TrialScheduler.CONTINUE
    assert scheduler.on_trial_result(None, t2, result_func(6, 0)) == TrialScheduler.CONTINUE


def test_alternate_metrics(asha: Callable[..., PersistentASHA]) -> None:  # testAlternateMetrics
    def result2(t: int, rew: float) -> dict[str, Any]:
        return dict(training_iteration=t, neg_mean_loss=rew)

    _test_metrics(asha, result2, "neg_mean_loss", "max")


def test_alternate_metrics_min(asha: Callable[..., PersistentASHA]) -> None:  # testAlternateMetricsMin
    def result2(t: int, rew: float) -> dict[str, Any]:
        return dict(training_iteration=t, mean_loss=-rew)

    _test_metrics(asha, result2, "mean_loss", "min")


def _anonymous_metric_train_fn(config: dict[str, Any]) -> None:
    tune.report({"_metric": config["value"]})  # Ray's returns the value (Tune 2.60 wants a report)


@runs_tune
def test_anonymous_metric_end_to_end_asha(
    ray_started: None, asha: Callable[..., PersistentASHA], tmp_path: Path
) -> None:  # testAnonymousMetricEndToEndASHA
    out = _run(
        tmp_path,
        _anonymous_metric_train_fn,
        mode="max",
        num_samples=1,
        config={"value": tune.uniform(-2.0, 2.0)},
        scheduler=asha(),
        search_alg=None,
    )
    assert bool(out.best_trial)


# == test_searchers.py ===========================================================================


def _invalid_objective(config: dict[str, Any]) -> None:
    metric = "report"

    if config[metric] > 4:
        tune.report({"_metric": float("inf")})
    elif config[metric] > 3:
        tune.report({"_metric": float("-inf")})
    elif config[metric] > 2:
        tune.report({"_metric": np.nan})
    else:
        tune.report({"_metric": float(config[metric]) or 0.1})


def _multi_objective(config: dict[str, Any]) -> None:
    tune.report(dict(a=config["a"] * 100, b=config["b"] * -100, c=config["c"]))


def _dummy_objective(config: dict[str, Any]) -> None:
    tune.report(dict(metric=config["report"]))


INVALID_VALUES_CONFIG = {"report": tune.uniform(0.0, 5.0), "list": [1, 2, 3], "num": 4}


def assertCorrectExperimentOutput(analysis: Any) -> None:
    best_trial = analysis.best_trial
    assert best_trial.config["report"] <= 2.0
    # Make sure that constant parameters aren't lost
    # Hyperopt converts lists to tuples, so check for either
    assert best_trial.config["list"] in ([1, 2, 3], (1, 2, 3))
    assert best_trial.config["num"] == 4


@contextlib.contextmanager
def check_searcher_checkpoint_errors_scope() -> Iterator[None]:
    buffer: list[str] = []
    from ray.tune.execution.tune_controller import logger

    with patch.object(logger, "warning", lambda x: buffer.append(x)):
        yield

    assert not any("Trial Runner checkpointing failed: Can't pickle local object" in x for x in buffer), (
        "Searcher checkpointing failed (unable to serialize)."
    )


@runs_tune
def test_invalid_values_optuna(
    ray_started: None, optuna_search: Callable[..., DivergenceAwareOptunaSearch], tmp_path: Path
) -> None:  # InvalidValuesTest.testOptuna
    from optuna.samplers import RandomSampler

    np.random.seed(1000)  # At least one nan, inf, -inf and float

    with check_searcher_checkpoint_errors_scope():
        out = _run(
            tmp_path,
            _invalid_objective,
            search_alg=optuna_search(sampler=RandomSampler(seed=1234)),
            config=INVALID_VALUES_CONFIG,
            metric="_metric",
            mode="max",
            num_samples=8,
            # Ray's: reuse_actors=False (_run reuses the worker)
        )
    assertCorrectExperimentOutput(out)


def test_optuna_report_too_often(
    optuna_search: Callable[..., DivergenceAwareOptunaSearch],
) -> None:  # InvalidValuesTest.testOptunaReportTooOften
    from optuna.samplers import RandomSampler

    searcher = optuna_search(
        sampler=RandomSampler(seed=1234),
        space=OptunaSearch.convert_search_space(INVALID_VALUES_CONFIG),
        metric="metric",
        mode="max",
    )
    searcher.suggest("trial_1")
    searcher.on_trial_result("trial_1", {"training_iteration": 1, "metric": 1})
    searcher.on_trial_complete("trial_1", {"training_iteration": 2, "metric": 1})

    # Report after complete should not fail
    searcher.on_trial_result("trial_1", {"training_iteration": 3, "metric": 1})

    searcher.on_trial_complete("trial_1", {"training_iteration": 4, "metric": 1})


@pytest.fixture(scope="module")
def evaluated_analysis(ray_started: None, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """AddEvaluatedPointTest.setUp: four trials run by Tune's default searcher."""
    return _run(
        tmp_path_factory.mktemp("evaluated"),
        _dummy_objective,
        config={"report": tune.uniform(0.0, 5.0)},
        metric="metric",
        num_samples=4,
        verbose=0,
    )


def _add_evaluated_point_optuna(
    optuna_search: Callable[..., DivergenceAwareOptunaSearch],
    analysis: Any,
    copy: Callable[[DivergenceAwareOptunaSearch], DivergenceAwareOptunaSearch],
) -> None:
    """AddEvaluatedPointTest.testOptuna with its ``run_add_evaluated_trials``; ``copy`` stands
    for its ``deepcopy`` of the searcher."""
    from optuna.trial import TrialState

    param_name, valid_value = "report", 1.0
    space = {param_name: tune.uniform(0.0, 5.0)}

    searcher = optuna_search(
        space=space,
        metric="metric",
        mode="max",
        points_to_evaluate=[{param_name: valid_value}],
        evaluated_rewards=[1.0],
    )

    def get_len(s: DivergenceAwareOptunaSearch) -> int:
        assert s._ot_study is not None
        return len(s._ot_study.trials)

    assert get_len(searcher) > 0

    searcher = optuna_search(space=space, metric="metric", mode="max")

    point = {param_name: valid_value}

    assert get_len(searcher) == 0

    searcher.add_evaluated_point(point, 1.0, intermediate_values=[0.8, 0.9])
    assert get_len(searcher) == 1
    assert searcher._ot_study is not None
    assert searcher._ot_study.trials[-1].state == TrialState.COMPLETE

    searcher.add_evaluated_point(point, 1.0, intermediate_values=[0.8, 0.9], error=True)
    assert get_len(searcher) == 2
    assert searcher._ot_study.trials[-1].state == TrialState.FAIL

    searcher.add_evaluated_point(point, 1.0, intermediate_values=[0.8, 0.9], pruned=True)
    assert get_len(searcher) == 3
    assert searcher._ot_study.trials[-1].state == TrialState.PRUNED

    searcher.suggest("1")

    searcher = optuna_search(space=space, metric="metric", mode="max")

    # run_add_evaluated_trials(searcher, get_len, get_len)
    searcher_copy = copy(searcher)
    searcher_copy.add_evaluated_trials(analysis, "metric")
    assert get_len(searcher_copy) == 4
    searcher_copy.suggest("1")

    searcher_copy = copy(searcher)
    searcher_copy.add_evaluated_trials(analysis.trials, "metric")
    assert get_len(searcher_copy) == 4
    searcher_copy.suggest("1")

    searcher_copy = copy(searcher)
    searcher_copy.add_evaluated_trials(analysis.trials[0], "metric")
    assert get_len(searcher_copy) == 1
    searcher_copy.suggest("1")

    def dbr_space(trial: Any) -> dict[str, Any]:
        return {param_name: trial.suggest_float(param_name, 0.0, 5.0)}

    dbr_searcher = optuna_search(space=dbr_space, metric="metric", mode="max")
    with pytest.raises(TypeError):
        dbr_searcher.add_evaluated_point(point, 1.0)


@runs_tune
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="DIFFERS: the study lives in its journal, not in the searcher: a deep copy of the "
    "searcher shares its study, so the second copy starts with the first copy's trials",
)
def test_add_evaluated_point_optuna(
    optuna_search: Callable[..., DivergenceAwareOptunaSearch], evaluated_analysis: Any
) -> None:  # AddEvaluatedPointTest.testOptuna, as Ray's
    _add_evaluated_point_optuna(optuna_search, evaluated_analysis, deepcopy)


@runs_tune
def test_add_evaluated_point_optuna_on_a_new_study_per_copy(
    optuna_search: Callable[..., DivergenceAwareOptunaSearch], evaluated_analysis: Any
) -> None:  # AddEvaluatedPointTest.testOptuna
    # DIFFERS: each of Ray's deep copies (a new in-memory study) is a new searcher on a new study
    def copy(searcher: DivergenceAwareOptunaSearch) -> DivergenceAwareOptunaSearch:
        return optuna_search(space=searcher._space, metric=searcher.metric, mode=searcher.mode)

    _add_evaluated_point_optuna(optuna_search, evaluated_analysis, copy)


SAVE_RESTORE_METRIC, SAVE_RESTORE_CONFIG = "metric", {"a": tune.uniform(0.0, 5.0)}


def _on_trial_callbacks(searcher: DivergenceAwareOptunaSearch, trial_id: str) -> None:
    result = {
        TRAINING_ITERATION: 1,
        SAVE_RESTORE_METRIC: 1,
        "config/a": 1.0,
        "time_total_s": 1,
    }
    searcher.on_trial_result(trial_id, result)
    searcher.on_trial_complete(trial_id, result)


def _save(searcher: DivergenceAwareOptunaSearch, checkpoint_path: str) -> None:
    searcher.set_search_properties(metric=SAVE_RESTORE_METRIC, mode="max", config=SAVE_RESTORE_CONFIG)

    searcher.suggest("1")
    searcher.suggest("2")
    searcher.suggest("not_completed")
    _on_trial_callbacks(searcher, "1")

    searcher.save(checkpoint_path)


def _restore(searcher: DivergenceAwareOptunaSearch, checkpoint_path: str) -> None:
    # Restoration shouldn't require another call to `searcher.set_search_properties`
    searcher.restore(checkpoint_path)

    _on_trial_callbacks(searcher, "2")
    searcher.suggest("3")
    _on_trial_callbacks(searcher, "3")

    # NOTE: Trial "not_completed" that was suggested before saving never completes
    # We expect that it should still be tracked in the searcher state,
    # which is usually done in the searcher's `_live_trial_mapping`.
    # See individual searcher tests below for the special cases (e.g. Optuna, BOHB).
    if hasattr(searcher, "_live_trial_mapping"):
        assert "not_completed" in searcher._live_trial_mapping


def test_save_restore_optuna(
    optuna_search: Callable[..., DivergenceAwareOptunaSearch], tmp_path: Path
) -> None:  # SaveRestoreCheckpointTest.testOptuna
    checkpoint_path = str(tmp_path / "checkpoint.pkl")
    searcher = optuna_search(space=SAVE_RESTORE_CONFIG, metric=SAVE_RESTORE_METRIC, mode="max", study="saved")
    _save(searcher, checkpoint_path)

    # DIFFERS: Ray's restores into OptunaSearch(), whose in-memory study the pickle replaces; the
    # project's study is its journal, so the searcher restored is one of the study that saved it
    searcher = optuna_search(study="saved")
    _restore(searcher, checkpoint_path)

    assert "not_completed" in searcher._ot_trials


@pytest.mark.xfail(
    strict=True,
    raises=SearcherStateError,
    reason="DIFFERS: the study lives in its journal, not in the pickle: restoring into a searcher "
    "of another study (here a new, empty one) is refused, saying so",
)
def test_save_restore_optuna_into_another_study(
    optuna_search: Callable[..., DivergenceAwareOptunaSearch], tmp_path: Path
) -> None:  # SaveRestoreCheckpointTest.testOptuna, as Ray's
    checkpoint_path = str(tmp_path / "checkpoint.pkl")
    searcher = optuna_search(space=SAVE_RESTORE_CONFIG, metric=SAVE_RESTORE_METRIC, mode="max")
    _save(searcher, checkpoint_path)

    searcher = optuna_search()
    _restore(searcher, checkpoint_path)

    assert "not_completed" in searcher._ot_trials


@runs_tune
def test_multi_objective_optuna(
    ray_started: None, optuna_search: Callable[..., DivergenceAwareOptunaSearch], tmp_path: Path
) -> None:  # MultiObjectiveTest.testOptuna
    from optuna.samplers import RandomSampler

    np.random.seed(1000)

    out = _run(
        tmp_path,
        _multi_objective,
        search_alg=optuna_search(
            sampler=RandomSampler(seed=1234),
            metric=["a", "b", "c"],
            mode=["max", "min", "max"],
        ),
        config={"a": tune.uniform(0, 1), "b": tune.uniform(0, 1), "c": tune.uniform(0, 1)},
        num_samples=16,
        # Ray's: reuse_actors=False (_run reuses the worker)
    )

    best_trial_a = out.get_best_trial("a", "max")
    assert best_trial_a.config["a"] >= 0.8
    best_trial_b = out.get_best_trial("b", "min")
    assert best_trial_b.config["b"] >= 0.8
    best_trial_c = out.get_best_trial("c", "max")
    assert best_trial_c.config["c"] >= 0.8


# == test_sample.py ==============================================================================


def _mock_objective(config: dict[str, Any]) -> None:
    tune.report(config)


SAMPLE_CONFIG = {
    "func": tune.sample_from(lambda spec: spec.config.uniform * 0.01),
    "uniform": tune.uniform(-5, -1),
    "quniform": tune.quniform(3.2, 5.4, 0.2),
    "loguniform": tune.loguniform(1e-4, 1e-2),
    "qloguniform": tune.qloguniform(1e-4, 1e-1, 5e-5),
    "choice": tune.choice([2, 3, 4]),
    "randint": tune.randint(-9, 15),
    "lograndint": tune.lograndint(1, 10),
    "qrandint": tune.qrandint(-21, 12, 3),
    "qrandint_q3": tune.qrandint(1, 10, 3),
    "qrandint_q1": tune.qrandint(1, 5, 1),
    "qlograndint": tune.qlograndint(2, 20, 2),
    "randn": tune.randn(10, 2),
    "qrandn": tune.qrandn(10, 2, 0.2),
}


def _testTuneSampleAPI(configs: Iterator[dict[str, Any]], ignore: list[str]) -> None:
    """SearchSpaceTest._testTuneSampleAPI for the keys testSampleBoundsOptuna keeps."""
    from collections import defaultdict

    stats: dict[str, list[Any]] = defaultdict(list)
    for out in configs:
        for k, v in out.items():
            if k not in ignore:
                stats[k].append(v)
        assert -5 <= out["uniform"] < -1
        assert 3.2 <= out["quniform"] <= 5.4
        assert out["quniform"] / 0.2 == pytest.approx(round(out["quniform"] / 0.2))
        assert 1e-4 <= out["loguniform"] < 1e-2
        assert out["choice"] in [2, 3, 4]
        assert -9 <= out["randint"] < 15 and isinstance(out["randint"], int)
        assert 1 <= out["lograndint"] < 10 and isinstance(out["lograndint"], int)
        assert -21 <= out["qrandint"] <= 12 and out["qrandint"] % 3 == 0
        assert isinstance(out["qrandint"], int)
        assert 1 <= out["qrandint_q1"] <= 5 and out["qrandint_q1"] % 1 == 0
        assert isinstance(out["qrandint_q1"], int)
    for k, v in stats.items():
        if k == "choice":
            assert {2, 3, 4} <= set(v)
        elif k == "randint":
            assert set(range(-9, 15)) <= set(v), f"randint failed for {set(range(-9, 15)) - set(v)}"
        elif k == "qrandint":
            assert set(range(-21, 13, 3)) <= set(v)
        elif k == "qrandint_q1":
            assert set(range(1, 5, 1)) <= set(v)
        elif k == "lograndint":
            assert set(range(1, 10)) <= set(v)


def test_convert_optuna(
    optuna_search: Callable[..., DivergenceAwareOptunaSearch],
) -> None:  # testConvertOptuna
    import optuna
    import ray.tune.search.sample
    from optuna.samplers import RandomSampler

    # Grid search not supported, should raise ValueError
    with pytest.raises(ValueError):
        OptunaSearch.convert_search_space({"grid": tune.grid_search([0, 1])})

    config = {
        "a": ray.tune.search.sample.Categorical([2, 3, 4]).uniform(),
        "b": {
            "x": ray.tune.search.sample.Integer(0, 5).quantized(2),
            "y": 4,
            "z": ray.tune.search.sample.Float(1e-4, 1e-2).loguniform(),
        },
    }
    converted_config = OptunaSearch.convert_search_space(config)
    optuna_config = {
        "a": optuna.distributions.CategoricalDistribution([2, 3, 4]),
        "b": {
            "x": optuna.distributions.IntDistribution(0, 5, step=2),
            "z": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
        },
    }

    def optuna_define_by_run(ot_trial: Any) -> None:
        ot_trial.suggest_categorical("a", [2, 3, 4])
        ot_trial.suggest_int("b/x", 0, 5, step=2)
        ot_trial.suggest_float("b/z", 1e-4, 1e-2, log=True)  # Ray's: suggest_loguniform (deprecated)

    def optuna_define_by_run_with_constants(ot_trial: Any) -> dict[str, Any]:
        ot_trial.suggest_categorical("a", [2, 3, 4])
        ot_trial.suggest_int("b/x", 0, 5, step=2)
        ot_trial.suggest_float("b/z", 1e-4, 1e-2, log=True)
        return {"constant": 1}

    def optuna_define_by_run_invalid(ot_trial: Any) -> Any:
        ot_trial.suggest_categorical("a", [2, 3, 4])
        ot_trial.suggest_int("b/x", 0, 5, step=2)
        ot_trial.suggest_float("b/z", 1e-4, 1e-2, log=True)
        return 1

    sampler1 = RandomSampler(seed=1234)
    searcher1 = optuna_search(space=converted_config, sampler=sampler1, metric="a", mode="max")

    sampler2 = RandomSampler(seed=1234)
    searcher2 = optuna_search(space=optuna_config, sampler=sampler2, metric="a", mode="max")

    sampler3 = RandomSampler(seed=1234)
    searcher3 = optuna_search(space=optuna_define_by_run, sampler=sampler3, metric="a", mode="max")

    sampler4 = RandomSampler(seed=1234)
    searcher4 = optuna_search(
        space=optuna_define_by_run_with_constants,
        sampler=sampler4,
        metric="a",
        mode="max",
    )

    config_constant = searcher4.suggest("0")
    assert config_constant is not None
    assert "constant" in config_constant
    config_constant.pop("constant")

    sampler5 = RandomSampler(seed=1234)
    searcher5 = optuna_search(space=optuna_define_by_run_invalid, sampler=sampler5, metric="a", mode="max")

    with pytest.raises(TypeError):
        searcher5.suggest("0")

    config1 = searcher1.suggest("0")
    config2 = searcher2.suggest("0")
    config3 = searcher3.suggest("0")

    assert config1 is not None
    assert config1 == config2
    assert config1 == config3
    assert config1 == config_constant
    assert config1["a"] in [2, 3, 4]
    assert config1["b"]["x"] in list(range(5))
    assert config1["b"]["z"] > 1e-4
    assert config1["b"]["z"] < 1e-2

    def optuna_define_by_run_branching_invalid(ot_trial: Any) -> None:
        # this is invalid because such a dict cannot be
        # unflattened (will try to assign child dicts to value under "a",
        # but that will be an int, instead of a dict)
        a = ot_trial.suggest_categorical("a", [1, 2])
        if a == 1:
            ot_trial.suggest_int("a/b", 0, 3)
            ot_trial.suggest_int("a/first", 2, 8)
        else:
            ot_trial.suggest_int("a/b", 4, 10)
            ot_trial.suggest_float("a/second", -0.4, 0.4)  # Ray's: suggest_uniform (deprecated)

    def optuna_define_by_run_branching(ot_trial: Any) -> None:
        a = ot_trial.suggest_categorical("a", ["1", "2"])
        if a == "1":
            ot_trial.suggest_int("nest/b", 0, 3)
            ot_trial.suggest_int("nest/first", 2, 8)
        else:
            ot_trial.suggest_int("nest/b", 4, 10)
            ot_trial.suggest_float("nest/second", -0.4, 0.4)

    class MockOptunaSampler(RandomSampler):
        def __init__(self, seed: int) -> None:
            super().__init__(seed=seed)
            self.counter = 0

        def sample_independent(self, study: Any, trial: Any, param_name: str, param_distribution: Any) -> Any:
            if param_name == "a":
                if self.counter == 0:
                    self.counter += 1
                    return param_distribution.choices[0]
                return param_distribution.choices[1]
            return super().sample_independent(study, trial, param_name, param_distribution)

    sampler_branching = RandomSampler(seed=1234)
    searcher_branching = optuna_search(
        space=optuna_define_by_run_branching_invalid,
        sampler=sampler_branching,
        metric="a",
        mode="max",
    )

    with pytest.raises(TypeError):
        searcher_branching.suggest("0")

    sampler_branching = MockOptunaSampler(seed=1234)
    searcher_branching = optuna_search(
        space=optuna_define_by_run_branching,
        sampler=sampler_branching,
        metric="a",
        mode="max",
    )

    config_branching_1 = searcher_branching.suggest("0")
    assert config_branching_1 is not None
    assert "a" in config_branching_1
    assert config_branching_1["a"] == "1"
    assert "nest" in config_branching_1
    assert "b" in config_branching_1["nest"]
    assert "first" in config_branching_1["nest"]
    assert config_branching_1["nest"]["b"] < 4
    assert config_branching_1["nest"]["first"] > 0.5

    config_branching_2 = searcher_branching.suggest("1")
    assert config_branching_2 is not None
    assert "a" in config_branching_2
    assert config_branching_2["a"] == "2"
    assert "nest" in config_branching_2
    assert "b" in config_branching_2["nest"]
    assert "second" in config_branching_2["nest"]
    assert config_branching_2["nest"]["b"] > 3
    assert config_branching_2["nest"]["second"] < 0.5

    # (here Ray's runs Tune: test_convert_optuna_in_tune)

    mixed_config = {
        "a": tune.uniform(5, 6),
        "b": tune.uniform(8, 9),  # Cannot mix List and Dict
    }
    searcher = optuna_search(space=mixed_config, metric="a", mode="max")
    mixed = searcher.suggest("0")
    assert mixed is not None
    assert 5 <= mixed["a"] <= 6
    assert 8 <= mixed["b"] <= 9


@runs_tune
def test_convert_optuna_in_tune(
    ray_started: None, optuna_search: Callable[..., DivergenceAwareOptunaSearch], tmp_path: Path
) -> None:  # testConvertOptuna, its part that runs Tune
    import ray.tune.search.sample

    config = {
        "a": ray.tune.search.sample.Categorical([2, 3, 4]).uniform(),
        "b": {
            "x": ray.tune.search.sample.Integer(0, 5).quantized(2),
            "y": 4,
            "z": ray.tune.search.sample.Float(1e-4, 1e-2).loguniform(),
        },
    }
    searcher = optuna_search(metric="a", mode="max")
    analysis = _run(tmp_path, _mock_objective, config=config, search_alg=searcher, num_samples=1)
    trial = analysis.trials[0]
    assert trial.config["a"] in [2, 3, 4]


def test_sample_bounds_optuna(
    optuna_search: Callable[..., DivergenceAwareOptunaSearch],
) -> None:  # testSampleBoundsOptuna
    # Quantization and log does not seem to work with Optuna
    # Also, qrandint works differently in Optuna (it moves the boundaries)
    ignore = ["func", "randn", "qrandn", "qloguniform", "qlograndint", "qrandint_q3"]

    config = SAMPLE_CONFIG.copy()
    for k in ignore:
        config.pop(k)

    searcher = optuna_search(space=config, metric="a", mode="max")

    def config_generator() -> Iterator[dict[str, Any]]:
        # DIFFERS: 400 suggestions, not 1000, as each is written to the study's journal (3 ms
        # each on a RAM disk, 70 ms on a disk here): 400 draw every value checked (the least
        # likely, lograndint's 9, has p = 0.04) in all but about one run in a million
        for i in range(400):
            suggested = searcher.suggest(f"trial_{i}")
            assert suggested is not None
            yield suggested

    _testTuneSampleAPI(config_generator(), ignore=ignore)


@runs_tune
def test_points_to_evaluate_optuna(
    ray_started: None, optuna_search: Callable[..., DivergenceAwareOptunaSearch], tmp_path: Path
) -> None:  # testPointsToEvaluateOptuna (with _testPointsToEvaluate)
    import ray.tune.search.sample

    config = {
        "metric": ray.tune.search.sample.Categorical([1, 2, 3, 4]).uniform(),
        "a": ray.tune.search.sample.Categorical(["t1", "t2", "t3", "t4"]).uniform(),
        "b": ray.tune.search.sample.Integer(0, 5),
        "c": ray.tune.search.sample.Float(1e-4, 1e-1).loguniform(),
    }
    points_to_evaluate = [{k: v.sample() for k, v in config.items()} for _ in range(2)]
    searcher = optuna_search(points_to_evaluate=points_to_evaluate)

    analysis = _run(
        tmp_path,
        _mock_objective,
        config=config,
        metric="metric",
        mode="max",
        search_alg=searcher,
        num_samples=5,
    )

    for i in range(len(points_to_evaluate)):
        trial_config = analysis.trials[i].config
        trial_config_dict = {
            "metric": trial_config["metric"],
            "a": trial_config["a"],
            "b": trial_config["b"],
            "c": trial_config["c"],
        }
        assert trial_config_dict == points_to_evaluate[i]


# == test_tune_restore_warm_start.py: OptunaWarmStartTest ========================================


def _warm_start_cost(space: dict[str, Any]) -> None:
    tune.report({"loss": (space["height"] - 14) ** 2 - abs(space["width"] - 3)})


class _OptunaWarmStart:
    """AbstractWarmStartTest with OptunaWarmStartTest's ``set_basic_conf``."""

    experiment_name = "results"

    def __init__(self, tmp_path: Path, optuna_search: Callable[..., DivergenceAwareOptunaSearch]) -> None:
        self.tmpdir = tmp_path
        self.optuna_search = optuna_search

    def set_basic_conf(self, study: str) -> tuple[ConcurrencyLimiter, Callable[[dict[str, Any]], None]]:
        from optuna.samplers import TPESampler

        space = OptunaSearch.convert_search_space(
            {"width": tune.uniform(0, 20), "height": tune.uniform(-100, 100)}
        )
        # the space first, positional, as Ray's test passes it; DIFFERS: a study folder to say
        # which study the searcher is of (Ray's each have an in-memory study of their own)
        search_alg = self.optuna_search(
            space, sampler=TPESampler(seed=10), metric="loss", mode="min", study=study
        )
        return ConcurrencyLimiter(search_alg, 1), _warm_start_cost

    def run(self, search_alg: ConcurrencyLimiter, cost: Any, num_samples: int, **kwargs: Any) -> Any:
        return tune.run(
            cost, num_samples=num_samples, search_alg=search_alg, verbose=0, reuse_actors=True, **kwargs
        )

    def run_part_from_scratch(self) -> tuple[Any, Any, str]:
        np.random.seed(162)
        search_alg, cost = self.set_basic_conf("part")
        results_exp_1 = self.run(
            search_alg, cost, 5, name=self.experiment_name, storage_path=str(self.tmpdir)
        )
        checkpoint_path = str(self.tmpdir / "warmStartTest.pkl")
        search_alg.save(checkpoint_path)
        return results_exp_1, np.random.get_state(), checkpoint_path

    def run_from_experiment_restore(self, random_state: Any) -> Any:
        # DIFFERS: the searcher restored is one of the study that saved its state ("part")
        search_alg, cost = self.set_basic_conf("part")
        search_alg.restore_from_dir(str(self.tmpdir / self.experiment_name))
        return self.run(search_alg, cost, 5, name=self.experiment_name, storage_path=str(self.tmpdir))

    def run_explicit_restore(self, random_state: Any, checkpoint_path: str) -> Any:
        np.random.set_state(random_state)
        search_alg2, cost = self.set_basic_conf("part")  # DIFFERS: as above
        search_alg2.restore(checkpoint_path)
        return self.run(search_alg2, cost, 5, storage_path=str(self.tmpdir / "explicit"))

    def run_full(self) -> Any:
        np.random.seed(162)
        search_alg3, cost = self.set_basic_conf("full")
        return self.run(search_alg3, cost, 10, storage_path=str(self.tmpdir / "full"))


@runs_tune
def test_optuna_warm_start(
    ray_started: None, optuna_search: Callable[..., DivergenceAwareOptunaSearch], tmp_path: Path
) -> None:  # OptunaWarmStartTest.testWarmStart
    t = _OptunaWarmStart(tmp_path, optuna_search)
    results_exp_1, r_state, checkpoint_path = t.run_part_from_scratch()
    results_exp_2 = t.run_explicit_restore(r_state, checkpoint_path)
    results_exp_3 = t.run_full()
    trials_1_config = [trial.config for trial in results_exp_1.trials]
    trials_2_config = [trial.config for trial in results_exp_2.trials]
    trials_3_config = [trial.config for trial in results_exp_3.trials]
    assert trials_1_config + trials_2_config == trials_3_config


@runs_tune
def test_optuna_restore(
    ray_started: None, optuna_search: Callable[..., DivergenceAwareOptunaSearch], tmp_path: Path
) -> None:  # OptunaWarmStartTest.testRestore
    t = _OptunaWarmStart(tmp_path, optuna_search)
    results_exp_1, r_state, _checkpoint_path = t.run_part_from_scratch()
    results_exp_2 = t.run_from_experiment_restore(r_state)
    results_exp_3 = t.run_full()
    trials_1_config = [trial.config for trial in results_exp_1.trials]
    trials_2_config = [trial.config for trial in results_exp_2.trials]
    trials_3_config = [trial.config for trial in results_exp_3.trials]
    assert trials_1_config + trials_2_config == trials_3_config


@runs_tune
def test_tune_s_registry_answers_a_registered_trainable_from_memory(
    ray_started: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not Ray's test: the driver's `remember_registered` asks Ray's GCS once whether a
    trainable is registered, where Tune asks twice a trial, and reads the trainable once, where
    Tune reads it for each trial; a registration or removal in this process asks again."""
    import ray.tune.registry as registry_module

    from study.search.ray_private import remember_registered

    asked: list[bytes] = []
    ask = registry_module._internal_kv_get
    monkeypatch.setattr(
        registry_module, "_internal_kv_get", lambda key, **kw: asked.append(key) or ask(key, **kw)
    )
    registry = registry_module._global_registry
    try:
        remember_registered()
        remember_registered()  # once a process: not wrapped twice
        registry_module.register_trainable("remembered", lambda config: None)
        assert [registry.contains("trainable_class", "remembered") for _ in range(3)] == [True] * 3
        assert len(asked) == 1
        assert registry.contains("trainable_class", "never-registered") is False
        assert registry.contains("trainable_class", "never-registered") is False  # no is asked again
        assert len(asked) == 3
        registry.unregister("trainable_class", "remembered")
        assert registry.contains("trainable_class", "remembered") is False
        registry_module.register_trainable("remembered", lambda config: None)
        assert registry.contains("trainable_class", "remembered") is True
        assert len(asked) == 5
        first = registry.get("trainable_class", "remembered")
        assert registry.get("trainable_class", "remembered") is first  # read once
        assert len(asked) == 6
        registry_module.register_trainable("remembered", lambda config: config)
        assert registry.get("trainable_class", "remembered") is not first  # registered again: read
        assert len(asked) == 7
    finally:  # the other tests of this process see Tune's own registry
        for name in ("contains", "get", "register", "unregister", "_remembered"):
            registry.__dict__.pop(name, None)
