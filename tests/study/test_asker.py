"""TPE's asks in a process (`study.search.asker`): the draws are TPE's over the study's history,
the mirror holds the study, and a failed or killed process loses nothing."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState

from study.search.asker import Census, ProcessAsker
from study.search.journal import optuna_storage
from study.search.search import TUNE_ID_ATTR, DivergenceAwareOptunaSearch, make_searcher, param_space
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths
from tests.study.conftest import cli, processes_naming, smoke_spec
from tests.study.conftest import trials as trials_of

SPACE = {
    "lambda_p": FloatDistribution(0.05, 0.9),
    "beta": FloatDistribution(1e-4, 0.1, log=True),
    "max_steps": IntDistribution(2, 8),
}


def _score(params: dict[str, float]) -> float:
    return -((params["lambda_p"] - 0.3) ** 2) - 0.01 * params["max_steps"]


def _history(study: optuna.Study, n: int) -> None:
    """``n`` trials of every state TPE reads: COMPLETE, PRUNED with reports, FAIL, two RUNNING."""
    for k in range(n):
        trial = study.ask(fixed_distributions=SPACE)
        if k % 7 == 3:
            trial.report(_score(trial.params), 10)
            study.tell(trial, state=TrialState.PRUNED)
        elif k % 11 == 5:
            study.tell(trial, state=TrialState.FAIL)
        elif k < n - 2:
            study.tell(trial, _score(trial.params))


def test_a_draw_in_the_process_is_the_one_tpe_makes_over_the_same_history() -> None:
    """The mirror is the study as TPE reads it: the same sampler, seeded alike, draws the same
    parameters there as over the study itself (RUNNING trials included: TPE's constant liar)."""
    driver = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    _history(driver, 40)
    asker = ProcessAsker(driver, optuna.samplers.TPESampler(seed=7, n_startup_trials=5), SPACE)
    try:
        asker.ask(driver)
        reference = optuna.create_study(
            direction="maximize", sampler=optuna.samplers.TPESampler(seed=7, n_startup_trials=5)
        )
        reference.add_trials(driver.get_trials())
        expected = reference.ask(fixed_distributions=SPACE).params
        made = asker.take(driver)
        assert made is not None and made.params == expected
        assert (
            made.number == 40 and driver.trials[40].state == TrialState.RUNNING
        )  # made in the driver's study
        assert not driver.get_trials(states=(TrialState.WAITING,))
    finally:
        asker.close()
    assert asker._proc.returncode == 0


def _spec(num_samples: int):  # type: ignore[no-untyped-def]
    spec = load_spec("parity-smoke")
    return dataclasses.replace(spec, search=spec.search.model_copy(update={"num_samples": num_samples}))


def _searcher(paths: StudyPaths, num_samples: int) -> DivergenceAwareOptunaSearch:
    spec = _spec(num_samples)
    searcher = make_searcher(spec, paths).searcher  # as the driver makes it: asking ahead
    assert isinstance(searcher, DivergenceAwareOptunaSearch)
    assert searcher.set_search_properties(None, None, param_space(spec))
    return searcher


def _asking_in_process(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    n: int,
    askers: int | None = None,
    wait_ms: str | None = None,
) -> DivergenceAwareOptunaSearch:
    """`_searcher` of an ``n``-trial study whose asks move to the process at once, with at most
    ``askers`` processes and ``wait_ms`` the wait that starts another (the defaults if None)."""
    monkeypatch.setenv("PONDER_STUDY_ASK_IN_PROCESS_MS", "0")
    for name, value in (("PONDER_STUDY_ASKERS", askers), ("PONDER_STUDY_ASK_WAIT_MS", wait_ms)):
        if value is not None:
            monkeypatch.setenv(name, str(value))
    return _searcher(StudyPaths(str(tmp_path), "s"), n)


def _mirror(asker: ProcessAsker, asker_study: optuna.Study) -> Census:
    """The mirror's trials, as `census` lists them, less the draws the driver never used."""
    return sorted(t for t in asker.census(asker_study) if t[0] != TrialState.FAIL)


def _held(study: optuna.Study) -> Census:
    trials = study.get_trials(deepcopy=False)
    return sorted(
        (int(t.state), None if t.values is None else tuple(t.values), tuple(sorted(t.params.items())))
        for t in trials
        if t.state not in (TrialState.FAIL, TrialState.WAITING)
    )


def test_a_study_asked_in_the_process_mirrors_every_trial_and_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two trials live at once, ended out of order: once the asks move to the process, every
    suggestion is one of its draws, the mirror holds what the journal holds (each trial's state,
    value and parameters: none left RUNNING there that ended here), and the process ends with
    the study's last ask. A warm start's trial, waiting in the journal, still goes first."""
    n = 14
    searcher = _asking_in_process(tmp_path, monkeypatch, n, askers=1)
    metric = searcher.metric
    searcher.suggest("t1")
    searcher.suggest("t2")
    assert searcher._in_process is not None
    (asker,) = searcher._in_process.askers
    assert asker.asking  # t3 is being drawn there
    study = searcher._ot_study
    study.enqueue_trial({"lambda_p": 0.5, "beta": 0.01, "max_steps": 4, "seed": 1})  # as a warm start
    for k in range(3, n + 1):
        searcher.on_trial_complete(f"t{k - 2}", result={metric: 0.1 * (k % 5)})
        if k == 8:  # the draw in flight made in the journal, as `suggest` makes it, then compared
            searcher._ot_trials["t8"] = searcher._take_ahead()
            assert _mirror(asker, study) == _held(study)
        params = searcher.suggest(f"t{k}")
        assert params is not None
        if k == 3:  # the waiting trial first; the draw made for t3 is dropped
            assert params["lambda_p"] == 0.5
    assert searcher._in_process is None and asker._proc.returncode == 0  # the study has all its trials
    trials = study.get_trials(deepcopy=False)
    assert [t.user_attrs[TUNE_ID_ATTR] for t in trials] == [f"t{k}" for k in range(1, n + 1)]
    drawn = [t for t in trials if "fixed_params" in t.system_attrs and t.params["lambda_p"] != 0.5]
    assert len(drawn) >= n - 4  # all but the first two, the warm start's and the last


def test_a_driver_that_waits_on_its_draws_draws_in_two_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Takes that wait start a second child (here any wait: ``PONDER_STUDY_ASK_WAIT_MS=0``). From
    then on two draws are in flight, taken oldest first; a child's mirror holds what the journal holds, no
    draw is made twice, no more are drawn than the study runs, and both children end with it."""
    n = 16
    searcher = _asking_in_process(tmp_path, monkeypatch, n, askers=2, wait_ms="0")
    metric = searcher.metric
    study = searcher._ot_study
    pool = None
    for k in range(1, n + 1):
        if k > 2:
            searcher.on_trial_complete(f"t{k - 2}", result={metric: 0.1 * (k % 5)})
        assert searcher.suggest(f"t{k}") is not None
        pool = searcher._in_process or pool
        if k == 10:
            assert pool is not None and len(pool.askers) == 2
            assert all(a.asking for a in pool.askers)  # t11 and t12, drawn at once
            older, newer = pool._order
            searcher._ot_trials["t11"] = searcher._take_ahead()  # the older draw first
            assert not older.asking and newer.asking
            assert _mirror(older, study) == _held(study)
    assert pool is not None and searcher._in_process is None  # closed with the study's last trial
    assert all(a._proc.returncode == 0 for a in pool.askers)
    assert sum(len(a.drawn_cpu) for a in pool.askers) <= n
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == n
    drawn = [tuple(sorted(t.params.items())) for t in trials]
    assert len(set(drawn)) == n


def test_a_process_that_dies_leaves_the_asks_to_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A killed asker process costs one warning: the draw in flight is asked again in the driver,
    and every suggestion after it too; no Tune trial is left without its own Optuna trial."""
    searcher = _asking_in_process(tmp_path, monkeypatch, 6)
    searcher.suggest("t1")
    searcher.suggest("t2")
    assert searcher._in_process is not None
    asker = searcher._in_process.askers[0]
    asker._proc.kill()
    asker._proc.wait()
    with caplog.at_level(logging.WARNING, logger="ponder-study"):
        for k in range(3, 7):
            assert searcher.suggest(f"t{k}") is not None
    warned = [r for r in caplog.records if "asking Optuna in a process failed" in r.getMessage()]
    assert len(warned) == 1
    assert searcher._in_process is None and searcher._process_broken
    trials = searcher._ot_study.get_trials(deepcopy=False)
    assert [t.user_attrs[TUNE_ID_ATTR] for t in trials] == [f"t{k}" for k in range(1, 7)]
    assert all(t.state == TrialState.RUNNING for t in trials)


@pytest.mark.parametrize("stop", ["close", "sigkill", "sigint", "sigint-at-start"])
def test_the_process_ends_with_its_driver_and_ignores_its_signals(stop: str) -> None:
    """The process lives no longer than its driver: it ends when the driver closes it or is
    killed (its input closes). A Ctrl-C of the driver's process group is the driver's to handle,
    even in the process's first second, while it imports Optuna: it keeps answering, and prints
    no traceback."""
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert driver.stdout is not None and driver.stdin is not None
    child = int(driver.stdout.readline())
    if stop == "sigint-at-start":  # the process started a moment ago: Optuna is being imported
        os.killpg(driver.pid, signal.SIGINT)
    assert driver.stdout.readline().strip() == "drawn"
    if stop == "sigkill":  # the driver alone (the OOM killer's choice): the process sees its input end
        os.kill(driver.pid, signal.SIGKILL)
    elif stop == "sigint":
        os.killpg(driver.pid, signal.SIGINT)  # the driver ignores it here; so must the process
        time.sleep(0.5)
        driver.stdin.write("ask\n")
        driver.stdin.flush()
        assert driver.stdout.readline().strip() == "drawn"
    driver.stdin.close()  # the driver closes its asker and exits
    driver.wait(30)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    assert driver.stderr is not None
    err = driver.stderr.read()  # the driver's and the process's, both ended
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return status != "Z"


_DRIVER = """
import signal, sys
import optuna
from optuna.distributions import FloatDistribution
from study.search.asker import ProcessAsker
signal.signal(signal.SIGINT, lambda *_: None)  # handled, as the study's driver does: not inherited
study = optuna.create_study()
asker = ProcessAsker(study, optuna.samplers.TPESampler(seed=0), {"x": FloatDistribution(0, 1)})
print(asker._proc.pid, flush=True)
asker.ask(study)
asker.take(study)
print("drawn", flush=True)
for line in sys.stdin:
    asker.ask(study)
    asker.take(study)
    print("drawn", flush=True)
asker.close()
"""


@pytest.mark.parametrize(
    ("setting", "asks_ms", "in_process"),
    [
        (None, [3, 3, 3, 3, 60], False),  # one slow ask (TPE's first models take 6 ms) is not enough
        (None, [3, 9, 9, 9, 3], True),  # the median of the last five, over 8 ms
        (None, [20, 20, 20, 20], False),  # fewer than five asks judged
        ("off", [500] * 5, False),
        ("0", [0.1], True),
        ("not a number", [3] * 5, False),  # the default kept, said once
    ],
)
def test_the_asks_move_to_the_process_on_the_median_of_the_last_asks(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    setting: str | None,
    asks_ms: list[float],
    in_process: bool,
) -> None:
    """`ASK_IN_PROCESS_MS` against the median CPU of the last five asks in the thread, or the
    environment's setting; only TPE's asks move."""
    if setting is None:
        monkeypatch.delenv("PONDER_STUDY_ASK_IN_PROCESS_MS", raising=False)
    else:
        monkeypatch.setenv("PONDER_STUDY_ASK_IN_PROCESS_MS", setting)
    searcher = _searcher(StudyPaths(str(tmp_path), "s"), 8)
    searcher._asks_cpu = [ms / 1e3 for ms in asks_ms]
    recipe = searcher._recipe
    assert recipe is not None and searcher._asks_in_process(recipe) is in_process
    random = dataclasses.replace(recipe, kind="random")
    assert not searcher._asks_in_process(random)


@pytest.mark.ray
def test_a_study_run_from_the_cli_draws_its_tpe_trials_in_the_process_and_ends_it(tmp_path: Path) -> None:
    """``ponder-study run`` of the smoke study from another folder, its asks moved to the process at
    once: every trial after the first two was drawn there (made in the journal from the draw,
    Optuna's fixed parameters), all six ran once each, and no asking process outlives the driver."""
    mark = f"ponder-asker-test-{os.getpid()}-{time.monotonic_ns()}"
    done = cli(
        "run",
        smoke_spec(tmp_path),
        "--storage",
        str(tmp_path / "results"),
        "--quiet",
        cwd=tmp_path,  # not the repository: the child finds the package all the same
        env={"PONDER_STUDY_ASK_IN_PROCESS_MS": "0", "PONDER_ASKER_TEST": mark},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "asking Optuna in a process failed" not in done.stderr
    paths = StudyPaths(str(tmp_path / "results"), "parity-smoke")
    trials = optuna.load_study(study_name=paths.name, storage=optuna_storage(paths)).trials
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE for t in trials)
    assert len({t.user_attrs[TUNE_ID_ATTR] for t in trials}) == 6
    assert [t.number for t in trials if "fixed_params" in t.system_attrs] == [2, 3, 4, 5]
    assert len(trials_of(tmp_path / "results", "parity-smoke")) == 6  # the Parquet, read back
    assert not processes_naming(mark, where="environ"), "an asking process outlived its driver"
