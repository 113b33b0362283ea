"""A multi-objective study end to end: Optuna trades halted accuracy against the mean halting
step, no ASHA, and the trials Parquet marks exactly the Pareto-optimal trials."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pandas as pd
import pytest

from study.records.ranking import beats_chance
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths
from tests.study.conftest import cli, smoke_source, trials

pytestmark = pytest.mark.slow
ACC, STEPS = "test/halted_accuracy", "test/mean_halting_step"


def _dominates(a: pd.Series, b: pd.Series) -> bool:
    """a at least as good as b on both objectives (accuracy up, steps down) and better on one."""
    return bool(a[ACC] >= b[ACC] and a[STEPS] <= b[STEPS] and (a[ACC] > b[ACC] or a[STEPS] < b[STEPS]))


def test_a_multi_objective_study_marks_its_pareto_front(tmp_path: Path) -> None:
    smoke = load_spec("parity-smoke")
    source = re.sub(r"\[scheduler\]\n(?:.+\n)+", "", smoke_source(at_once=1))  # no ASHA: one metric only
    spec = tmp_path / "pareto.toml"
    spec.write_text(source + f'\n[objectives]\n"{ACC}" = "max"\n"{STEPS}" = "min"\n')
    done = cli("run", str(spec), "--storage", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]

    df = trials(tmp_path, "pareto")
    assert len(df) == smoke.search.num_samples
    assert (df["status"] == "completed").all() and (df["iteration"] == smoke.iterations).all()  # no ASHA
    assert not Path(StudyPaths(str(tmp_path), "pareto").asha).exists()
    front, rest = df[df["pareto"]], df[~df["pareto"]]
    # a trial at chance is no trade-off, however few its steps: the front is among the others
    answers = df.apply(lambda t: beats_chance(t.to_dict(), ACC), axis=1)
    assert len(front) >= 1 or not answers.any()
    for _, t in front.iterrows():  # no marked trial is dominated and none is at chance ...
        assert answers[t.name] and not any(_dominates(o, t) for _, o in df.iterrows()), t[["trial_id", ACC]]
    for _, t in rest.iterrows():  # ... and every other trial is dominated, or at chance
        assert not answers[t.name] or any(_dominates(o, t) for _, o in front.iterrows()), t[["trial_id", ACC]]

    # Optuna ran a two-objective study and finds the same front from the values Tune told it
    journal = optuna.storages.journal.JournalFileBackend(StudyPaths(str(tmp_path), "pareto").optuna_journal)
    study = optuna.load_study(study_name="pareto", storage=optuna.storages.JournalStorage(journal))
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) == len(df)
    bar = df.iloc[0].to_dict()  # the chance level of this study's task and evaluation set
    optuna_front = {
        (round(t.values[0], 9), round(t.values[1], 9))
        for t in study.best_trials
        if beats_chance({**bar, ACC: t.values[0]}, ACC)
    }
    ours = {(round(a, 9), round(s, 9)) for a, s in zip(front[ACC], front[STEPS], strict=True)}
    assert optuna_front == ours
