"""A trial that fails is retried from its last checkpoint, on a local Ray instance.

``PONDER_STUDY_FAULT=raise@30`` makes every trial raise once, right after its report and
checkpoint at iteration 30: the real exception path of a trial (Tune sees the error, counts
a failure and restarts the trial from ``tune.get_checkpoint()``), with nothing mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.study.conftest import CLI, REPO, history, smoke_source, trials

pytestmark = pytest.mark.slow
BUDGET, EVERY, FAULT = 60, 10, 30


def test_a_trial_that_raises_once_is_retried_from_its_checkpoint(tmp_path: Path) -> None:
    spec = tmp_path / "faulty.toml"  # parity-smoke without early stopping: every trial meets the fault
    spec.write_text(smoke_source(at_once=1).replace("grace_period = 10", f"grace_period = {BUDGET}"))
    env = {**os.environ, "PONDER_STUDY_FAULT": f"raise@{FAULT}"}
    args = ["run", str(spec), "--name", "faulty", "--num-samples", "2", "--storage", str(tmp_path), "--quiet"]
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]

    df = trials(tmp_path, "faulty").set_index("trial_id")
    assert len(df) == 2
    assert (df["status"] == "completed").all() and df["error"].isna().all()
    assert (df["retries"] == 1).all()  # each raised once, and only once
    assert (df["iteration"] == BUDGET).all() and (df["nodes"] == 1).all()
    h = history(tmp_path, "faulty")
    for trial_id in df.index:
        assert list(h.loc[h["trial_id"] == trial_id, "iteration"]) == list(range(EVERY, BUDGET + 1, EVERY))
        # Tune's own log: after the failure the trial went on from iteration 30's checkpoint
        (result,) = (tmp_path / "tune" / "faulty").glob(f"*_{trial_id}_*/result.json")
        lines = [json.loads(x) for x in result.read_text().splitlines()]
        assert [x["iteration"] for x in lines] == list(range(EVERY, BUDGET + 1, EVERY))
        restored = [x for x in lines if x["iterations_since_restore"] < x["training_iteration"]]
        assert restored[0]["iteration"] == FAULT + EVERY
