"""Interrupt a real study (Ctrl-C, or SIGKILL of the driver and everything it started) and
resume it: exactly num_samples trials at the end, nothing finished runs again, an early-stopped
trial stays stopped, Optuna keeps every trial. Every case runs the shipped spec with Tune's
progress table on, two trials at a time, as users run it: a resumed study keeps the table of its
first run. The late SIGKILL also runs ``--quiet``, one trial at a time: a kill that finds fewer
trials in flight is a case of its own for the resume. Ctrl-C and a kill as a trial ends meet
``--quiet`` and one trial at a time in the kill campaigns (tests/study/test_kill_campaign.py)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import optuna
import pandas as pd
import pytest

from study.search.journal import optuna_storage
from study.search.search import TUNE_ID_ATTR
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths
from tests.study.conftest import (
    CLI,
    Driver,
    cli,
    driver_env,
    finished,
    history,
    ledger_has,
    smoke_spec,
    trials,
)

pytestmark = pytest.mark.slow
NAME = "parity-smoke"
SMOKE = load_spec(NAME)
ENDED = ["completed", "early_stopped", "diverged"]


def _result_lines(storage: Path) -> dict[str, int]:
    """Lines of Tune's result.json per trial id: grows whenever a trial reports, even re-reports."""
    counts = {}
    for path in (storage / "tune" / NAME).glob("*/result.json"):
        trial_id = path.parent.name.split("_")[2]
        counts[trial_id] = len(path.read_text().splitlines())
    return counts


OWN_RAY = True
"""A SIGKILLed driver takes its own Ray instance with it, as in a terminal. Killed while joined to
the tests' shared instance instead, an ended trial's result.json on the storage grew at the
resume (seen in all six tests: most likely the lines Tune had staged in that still-live session
before the kill, synced late), which the checks below count as reporting again."""


def _flags(table: str) -> list[str]:
    return [] if table == "table" else ["--quiet"]


def _spec(table: str, where: Path, times: int = 1) -> str:
    """The study a case runs: the shipped spec with the table on, one trial at a time without."""
    if table == "table" and times == 1:
        return NAME
    return smoke_spec(where, times=times, at_once=2 if table == "table" else 1)


def _resume_and_check(storage: Path, tmp_path: Path, table: str = "quiet") -> pd.DataFrame:
    """Resume; check nothing that had ended ran again; return the final trials table."""
    before_path = storage / "trials" / f"study={NAME}"
    before = trials(storage, NAME) if before_path.exists() else pd.DataFrame(columns=["trial_id", "status"])
    before_history = history(storage, NAME) if before_path.exists() else None
    ended_before = before[before["status"].isin(ENDED)].set_index("trial_id")
    lines_before = _result_lines(storage)

    done = cli("resume", NAME, "--storage", str(storage), *_flags(table))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stdout[-2000:] + done.stderr[-3000:]
    if "nothing to resume" in done.stdout:  # killed once it had finished: a resume has no work
        assert len(ended_before) == SMOKE.search.num_samples, done.stdout[-2000:]
    elif table == "table":  # the table of the first run, pickled with it, names where the study is
        assert f"Results: {storage} (" in done.stdout and "Result logdir" not in done.stdout, done.stdout[
            -2000:
        ]

    after = trials(storage, NAME).set_index("trial_id")
    assert len(after) == SMOKE.search.num_samples  # exactly num_samples, no more
    assert set(after["status"]) <= {"completed", "early_stopped"}, after["status"].to_dict()
    # a trial that had ended did not run again: same status, same iteration, not one more report
    lines_after = _result_lines(storage)
    for trial_id, row in ended_before.iterrows():
        assert after.loc[trial_id, "status"] == row["status"]
        assert after.loc[trial_id, "iteration"] == row["iteration"]
        # (Tune copies result.json to the storage every few seconds: after a kill it may be short)
        assert lines_after.get(trial_id, 0) == lines_before.get(trial_id, 0), f"{trial_id} reported again"
    if before_history is not None and len(ended_before):
        keep = before_history["trial_id"].isin(ended_before.index)
        old = before_history[keep].sort_values(["trial_id", "iteration"]).reset_index(drop=True)
        new_history = history(storage, NAME)
        new = new_history[new_history["trial_id"].isin(ended_before.index)]
        pd.testing.assert_frame_equal(old, new.sort_values(["trial_id", "iteration"]).reset_index(drop=True))
    # ASHA's stopped trials stayed stopped, and none ran to its budget
    stopped = after[after["status"] == "early_stopped"]
    budget = load_spec(StudyPaths(str(storage), NAME).spec).iterations  # the study's own spec
    assert (stopped["iteration"] < budget).all()
    # every trial kept its reports, one history row each
    assert (after["reports"] > 0).all(), after["reports"].to_dict()
    h = history(storage, NAME)
    rows = h.groupby("trial_id").size().reindex(after.index, fill_value=0)
    assert (rows == after["reports"]).all(), pd.concat({"rows": rows, "reports": after["reports"]}, axis=1)
    # Optuna: one COMPLETE trial per Tune trial, none left RUNNING
    journal = optuna.storages.journal.JournalFileBackend(StudyPaths(str(storage), NAME).optuna_journal)
    study = optuna.load_study(study_name=NAME, storage=optuna.storages.JournalStorage(journal))
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == SMOKE.search.num_samples
    assert optuna.trial.TrialState.RUNNING not in states
    return after


def test_ctrl_c_then_resume(driver: Callable[..., Driver], tmp_path: Path) -> None:
    table = "table"
    d = driver("run", _spec(table, tmp_path, times=10), "--storage", str(tmp_path))
    d.wait_until(finished(tmp_path, NAME, at_least=2))
    assert d.interrupt() == 130
    assert f"ponder-study resume {NAME}" in d.output()
    # not Tune's "Result logdir", the driver's staging folder under /tmp/ray
    assert f"Results: {tmp_path} (" in d.output() and "Result logdir" not in d.output(), d.output()[-2000:]
    before = trials(tmp_path, NAME)
    assert len(before) < SMOKE.search.num_samples or not before["status"].isin(ENDED).all()
    lines = _result_lines(tmp_path)
    after = _resume_and_check(tmp_path, tmp_path, table)
    # Ctrl-C lets Tune save every running trial's state: no report is repeated after resume
    for trial_id, n in _result_lines(tmp_path).items():
        assert n == after.loc[trial_id, "reports"], (
            f"{trial_id} repeated reports ({lines.get(trial_id)} before)"
        )


def test_a_closed_output_stops_the_study_and_its_resume_finishes_it(tmp_path: Path) -> None:
    """``ponder-study run ... | head -3`` once ``head`` has gone: the progress table's next write
    fails (EPIPE), inside Tune's loop. The driver stops, exits 141, its last line on stderr the
    command that resumes the study (it said "error: BrokenPipeError", exit 1), and the resume
    finishes it. The reader goes before the table's first write, at the start of Tune's loop, so
    the study always stops part-way (after ``head`` has its lines, the next write comes at a
    redraw, every 15 s: by hand, a smoke study 300 times longer stopped at 15 s and resumed)."""
    args = ["run", NAME, "--storage", str(tmp_path)]
    proc = subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=driver_env(args)
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdout.close()  # the reader gone before the driver writes a line
        err = proc.stderr.read()
        code = proc.wait(timeout=300)
    finally:
        proc.kill()
    assert code == 141, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.splitlines()[-1] == (
        f"ponder-study: its output was closed (its reader exited), so it stopped; "
        f"resume it with: ponder-study resume {NAME} --storage {tmp_path}"
    ), err[-2000:]
    before = trials(tmp_path, NAME)
    assert len(before) < SMOKE.search.num_samples or not before["status"].isin(ENDED).all()
    _resume_and_check(tmp_path, tmp_path, "table")


@pytest.mark.parametrize("table", ["table", "quiet"])
def test_sigkill_late_in_study_then_resume(driver: Callable[..., Driver], tmp_path: Path, table: str) -> None:
    """SIGKILL once most trials have ended, with Tune's periodic snapshots of its experiment
    state an hour apart: trials created after the first snapshot and ended since must still be
    known to the resume (a CI run once lost a short trial created and ended between two of
    Tune's 10-second snapshots: the resume ran a new trial in its place)."""
    env = {"TUNE_GLOBAL_CHECKPOINT_S": "3600"}
    d = driver(
        "run", _spec(table, tmp_path), "--storage", str(tmp_path), *_flags(table), env=env, own_ray=OWN_RAY
    )
    d.wait_until(finished(tmp_path, NAME, at_least=4))
    d.kill()
    _resume_and_check(tmp_path, tmp_path, table)


@pytest.mark.parametrize("how", ["completed", "stopped"])
def test_sigkill_as_a_trial_ends_then_resume(driver: Callable[..., Driver], tmp_path: Path, how: str) -> None:
    """SIGKILL the instant a ledger says a trial ended (it reached its budget, or ASHA stopped
    it), before the Parquet is rewritten and before Tune's periodic copy of its result.json to
    the storage. A resume never trains that trial again, so its reports must be saved already
    (a CI run once lost every report of a trial ASHA had just stopped; a resume from a state
    that predates the trial's first checkpoint also empties Tune's copy).

    With Tune's periodic saves an hour apart, Tune's only saved state holds the ended trial as
    pending with no result: the resume with the table on used to die in the table's sort by
    metric (None against a float), then in the export of a trial without a directory, and never
    resume again (issue 10). ``export`` of that state must work too."""
    env = {"TUNE_GLOBAL_CHECKPOINT_S": "3600"}
    d = driver("run", NAME, "--storage", str(tmp_path), env=env, own_ray=OWN_RAY)
    d.wait_until(ledger_has(tmp_path, NAME, how), poll=0.002)
    d.kill()
    exported = cli("export", NAME, "--storage", str(tmp_path))
    assert exported.returncode == 0, exported.stderr[-3000:]
    ended = trials(tmp_path, NAME)
    assert ended["status"].isin(ENDED).sum() >= 1, ended[["trial_id", "status"]]
    _resume_and_check(tmp_path, tmp_path, "table")


def test_resume_of_a_finished_study_runs_nothing(smoke: tuple[Path, object], tmp_path: Path) -> None:
    storage = tmp_path / "storage"  # a copy: the session's smoke study stays as `run` left it
    shutil.copytree(smoke[0], storage)
    before = trials(storage, NAME)
    lines = _result_lines(storage)
    done = cli("resume", NAME, "--storage", str(storage), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _result_lines(storage) == lines
    after = trials(storage, NAME)
    assert after["checkpoint_path"].str.startswith(str(storage)).all()  # the copy's own checkpoints
    pd.testing.assert_frame_equal(
        before.drop(columns="checkpoint_path").sort_values("trial_id").reset_index(drop=True),
        after.drop(columns="checkpoint_path").sort_values("trial_id").reset_index(drop=True),
    )


STUCK = Path(__file__).parent / "data" / "stuck-after-sigkill.tar.gz"
"""A study a SIGKILL left stuck (kill campaign, seed 4242): a torn-state recovery had started a new
Tune experiment, and a later resume brought back two trials of the old one (9996d5ee, a31249db)
with the configurations of Optuna's trials 0 and 1, which 752d64c4 (running) and f6885e52 (ended)
hold. It also holds a lock of Optuna's journal that links to the folder it was made in."""


def test_a_study_stuck_after_a_kill_finishes_at_the_next_resume(tmp_path: Path) -> None:
    """The map between Tune's trials and Optuna's is rebuilt from the journal and the end records:
    the two old trials are dropped, not run again (nor sent to a searcher that never knew them)."""
    storage = tmp_path / "unpacked elsewhere"
    storage.mkdir()
    shutil.unpack_archive(STUCK, storage)
    name = "k4242-0"
    done = cli("resume", name, "--storage", str(storage), timeout=180)  # the table on, as users run it
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    assert "they are dropped: 9996d5ee, a31249db" in done.stderr

    table = trials(storage, name)
    assert len(table) == 8 and table["trial_id"].is_unique
    assert not table.duplicated(["lambda_p", "beta", "max_steps", "seed"]).any()  # none twice
    assert not {"9996d5ee", "a31249db"} & set(table["trial_id"])
    ended = table.set_index("trial_id")
    assert (ended.loc["f6885e52", "status"], ended.loc["f6885e52", "iteration"]) == ("early_stopped", 10)
    assert ended.loc["752d64c4", "status"] == "completed"
    assert set(history(storage, name)["trial_id"]) == set(table["trial_id"])
    # made before counter streams: every trial, old or new, drew from the generator stream
    assert (table["data_stream"] == "generator").all()

    paths = StudyPaths(str(storage), name)
    study = optuna.load_study(study_name=name, storage=optuna_storage(paths))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 8  # trial 0 too
    assert sorted(t.user_attrs[TUNE_ID_ATTR] for t in study.trials) == sorted(table["trial_id"])


def test_resume_of_a_finished_study_says_so_before_ray(smoke: tuple[Path, object]) -> None:
    """Nothing to do: the summary and one line naming ``--more``, with Ray never imported (an
    unusable RAY_ADDRESS would fail any Ray start), and nothing in the study rewritten."""
    storage = smoke[0]
    before = {p: p.stat().st_mtime_ns for p in storage.rglob("*") if p.is_file()}
    done = cli("resume", NAME, "--storage", str(storage), env={"RAY_ADDRESS": "/no-ray-here"})
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last == (
        f"ponder-study: study {NAME!r} is finished ({SMOKE.search.num_samples} trials): nothing to resume; "
        f"to add trials: ponder-study resume {NAME} --storage {storage} --more N"
    )
    assert "top " in done.stdout  # the summary above it
    assert {p: p.stat().st_mtime_ns for p in storage.rglob("*") if p.is_file()} == before
