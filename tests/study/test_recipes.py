"""The Parquet recipes of docs/parquet.md (the README links there), run as they stand against a
study the CLI generates."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from study.records.ranking import beats_chance
from tests.study.conftest import REPO

pytestmark = pytest.mark.slow
RECIPES = REPO / "docs" / "parquet.md"
TEXT = RECIPES.read_text()


def _blocks(language: str) -> list[str]:
    recipes = TEXT.split("<!-- recipes -->", 1)[1].split("<!-- /recipes -->", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", recipes, flags=re.S)


@pytest.fixture
def in_results(smoke: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pd.DataFrame:
    """A working directory whose ``results/`` is the smoke study's storage; its trials table."""
    storage, _ = smoke
    (tmp_path / "results").symlink_to(storage, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return pd.read_parquet(storage / "trials")


def test_the_recipes_are_there() -> None:
    assert len(_blocks("python")) == 1 and len(_blocks("sh")) == 1


def test_the_pandas_recipes_answer_their_questions(in_results: pd.DataFrame) -> None:
    trials = in_results
    acc = "test/halted_accuracy"
    ns: dict[str, Any] = {}
    exec(compile(_blocks("python")[0], str(RECIPES), "exec"), ns)

    finished = trials["status"].isin(["completed", "early_stopped"])
    top = ns["top"]
    assert len(top) == min(5, finished.sum()) and top[acc].iloc[0] == trials.loc[finished, acc].max()
    assert top[acc].is_monotonic_decreasing and top["status"].isin(["completed", "early_stopped"]).all()
    # dtype_backend="pyarrow": an integer column stays one, a list column holds lists
    assert str(ns["trials"]["iteration"].dtype) == "int64[pyarrow]"
    assert str(ns["trials"][f"{acc.split('/')[0]}/per_step_accuracy"].dtype).startswith("list<")

    by_lambda = ns["by_lambda"]
    assert by_lambda[(acc, "count")].sum() == finished.sum()
    assert by_lambda[(acc, "max")].max() == trials.loc[finished, acc].max()

    curves = ns["curves"]
    history = pd.read_parquet("results/history")
    assert len(curves) == len(history) and curves["lambda_p"].notna().all()

    front = ns["front"]
    assert set(front["trial_id"]) == set(trials.loc[trials["pareto"], "trial_id"])
    # the front holds trials of the full budget that answer above chance (the smoke study's tiny
    # trials may all be at chance: then it is empty); the most accurate of them is on it
    completed = trials[trials["status"] == "completed"]
    answering = completed[[beats_chance(row, acc) for row in completed.to_dict("records")]]
    if answering.empty:
        assert front.empty, front
    else:
        best = answering.loc[answering[acc].idxmax()]  # (ties: one of them)
        assert (front[acc] == best[acc]).any()


def test_the_duckdb_line_gives_the_same_pareto_set(in_results: pd.DataFrame) -> None:
    (line,) = [ln for ln in _blocks("sh")[0].splitlines() if ln.startswith("python ")]
    command = f"{sys.executable} {line.removeprefix('python ')}"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    front = in_results.loc[in_results["pareto"], "trial_id"]
    shown = set(re.findall(r"^│[^│]+│\s*([0-9a-f]{8})\s*│", done.stdout, flags=re.M))  # the trial_id column
    assert shown == set(front), done.stdout
