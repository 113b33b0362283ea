"""Which knob mattered: fANOVA importance read from a study's Optuna journal, real Optuna."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from study.cli import main
from study.reports.importance import MIN_TRIALS, importances, read_journal_study
from study.reports.report import write_report
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths


def _copy(smoke: tuple[Path, Any], tmp_path: Path) -> Path:
    """The shared smoke study, copied: the tests read and report it without touching the original."""
    storage = tmp_path / "results"
    for part in ("studies", "trials", "history"):
        shutil.copytree(smoke[0] / part, storage / part)
    return storage


def test_the_smoke_study_gets_one_seeded_importance_per_searched_field(
    smoke: tuple[Path, Any], tmp_path: Path
) -> None:
    storage = _copy(smoke, tmp_path)
    paths = StudyPaths(str(storage), "parity-smoke")
    journal = Path(paths.optuna_journal).read_bytes()
    spec = load_spec("parity-smoke")
    found = importances(spec, paths)
    assert found.why is None, found.why
    # the trials that count are the ones that ended with a value: completed and ASHA-stopped
    trials = pd.read_parquet(storage / "trials")
    assert found.counted == trials["status"].isin(["completed", "early_stopped"]).sum() >= MIN_TRIALS
    (result,) = found.results
    assert result.objective == "test/halted_accuracy" and result.mode == "max"
    assert set(result.values) == {d.name for d in spec.space}
    shares = list(result.values.values())
    assert shares == sorted(shares, reverse=True) and min(shares) >= 0
    assert sum(shares) == pytest.approx(1.0)
    assert importances(spec, paths).results == found.results  # seeded: the same every time
    assert Path(paths.optuna_journal).read_bytes() == journal  # read, never written
    (line,) = found.lines()
    assert "fANOVA" in line and f"over {found.counted} trials" in line

    # too few trials: says how many it needs and how many there are, and no result
    fewer = importances(spec, paths, minimum=found.counted + 1)
    assert not fewer.results
    assert fewer.lines() == [f"importance: needs {found.counted + 1} ended trials, {found.counted} so far"]


def test_status_and_the_report_show_it(
    smoke: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = _copy(smoke, tmp_path)
    expected = importances(load_spec("parity-smoke"), StudyPaths(str(storage), "parity-smoke")).lines()
    assert main(["status", "parity-smoke", "--storage", str(storage)]) == 0
    assert expected[0] in capsys.readouterr().out.splitlines()

    report = write_report("parity-smoke", str(storage), out=str(tmp_path / "report"))
    assert report.importance is not None and report.importance.lines() == expected
    index = Path(report.index).read_text()
    section = index.split('<section id="importance">', 1)[1].split("</section>", 1)[0]
    (result,) = report.importance.results
    for name, value in result.values.items():
        assert f"<td>{name}</td><td>{value:.3f}</td>" in section


def _journal_study(tmp_path: Path, name: str, directions: list[str]) -> tuple[StudyPaths, optuna.Study]:
    paths = StudyPaths(str(tmp_path), name)
    Path(paths.optuna_journal).parent.mkdir(parents=True)
    storage = JournalStorage(JournalFileBackend(paths.optuna_journal))
    study = optuna.create_study(
        study_name=name, storage=storage, directions=directions, sampler=optuna.samplers.RandomSampler(seed=1)
    )
    return paths, study


def test_each_objective_of_a_pareto_spec_gets_its_own(tmp_path: Path) -> None:
    spec = load_spec("parity-pareto")  # accuracy (max) against mean halting step (min)
    assert spec.multi_objective and {d.name for d in spec.space} == {"lambda_p", "beta", "max_steps"}
    paths, study = _journal_study(tmp_path, "pareto", [mode + "imize" for _, mode in spec.objectives])
    rng = np.random.default_rng(0)
    for _ in range(16):  # accuracy moves with lambda_p, the halting step with max_steps
        t = study.ask()
        lp = t.suggest_float("lambda_p", 0.05, 0.9)
        t.suggest_float("beta", 1e-4, 0.1, log=True)
        n = t.suggest_int("max_steps", 2, 20)
        study.tell(t, [1 - (lp - 0.3) ** 2 + rng.normal(0, 0.01), n / 2 + rng.normal(0, 0.1)])
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # a diverged trial: no value
    study.ask()  # one still running
    found = importances(spec, paths)
    assert found.counted == 16
    accuracy, steps = found.results
    assert (accuracy.objective, steps.objective) == tuple(m for m, _ in spec.objectives)
    assert next(iter(accuracy.values)) == "lambda_p" and next(iter(steps.values)) == "max_steps"
    assert len(found.lines()) == 2


def test_a_torn_last_line_is_left_out_and_no_journal_says_so(tmp_path: Path) -> None:
    spec = load_spec("parity-smoke")
    paths, study = _journal_study(tmp_path, "torn", ["maximize"])
    assert importances(spec, StudyPaths(str(tmp_path), "none")).lines() == [
        f"importance: needs {MIN_TRIALS} ended trials, no Optuna journal yet"
    ]
    for i in range(MIN_TRIALS - 1):
        t = study.ask()
        for d in spec.space:
            t.suggest_float(d.name, float(d.low or 0), float(d.high or 1))
        study.tell(t, float(i))
    with open(paths.optuna_journal, "a") as f:  # a driver killed in the middle of a write
        f.write('{"op_code": 6, "worker_id": "x", "trial_id": ')
    loaded = read_journal_study(paths)
    assert len(loaded.get_trials()) == MIN_TRIALS - 1
    assert importances(spec, paths).why == f"needs {MIN_TRIALS} ended trials, {MIN_TRIALS - 1} so far"
