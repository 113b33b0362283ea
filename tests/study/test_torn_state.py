"""A resume finds Tune's saved state torn, missing or older than the study's records (a kill or a
full disk while Tune wrote it, a partial copy, a backup put back, a user cleaning up): it finishes
the study all the same, with ``num_samples`` trials, none twice, and Optuna level with them; a
finished study grows by ``--more``. Three cases here (the suite's time is spent);
``bench/torn_state.py`` runs the whole matrix: both studies, ``resume`` and ``resume --more``,
every state file with every damage, and pairs of files damaged at once."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest

from study.records.records import EndRecord
from study.search.journal import optuna_storage
from study.search.search import TUNE_ID_ATTR
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths
from tests.study.conftest import Driver, cli, smoke_spec, trials

# one test process runs the module (`--dist loadgroup`), so that each study below is made once:
# spread over the processes, each one that drew an `interrupted` case interrupted a study of its own
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torn_state")]
NAME = "parity-smoke"
NUM_SAMPLES = load_spec(NAME).search.num_samples
STATE_FILES = ("tuner.pkl", "experiment_state", "search_gen_state", "searcher-state")
"""Tune's files: the Tuner, and the three of each save (trials, search generator, searcher)."""
DAMAGES = ("half", "one byte", "empty", "removed", "all removed", "older")
"""Cut to half, to one byte, to nothing; the newest copy removed, every copy removed (each driver
session saves its own); the newest overwritten by an older copy of the same file."""
FINISHED_SAMPLES = 4
"""The finished study's trials: a run of 3, then ``resume --more 1``, so Tune saved twice."""
ENDED = ("completed", "early_stopped", "diverged")


def _ended(storage: Path) -> int:
    return len(list(Path(StudyPaths(str(storage), NAME).ended_dir).glob("*.json")))


def _state_files(experiment: Path) -> list[Path]:
    return [p for p in experiment.iterdir() if p.is_file() and p.name.startswith(STATE_FILES)]


def interrupt_a_study(where: Path) -> tuple[Path, Path]:
    """A smoke study stopped by Ctrl-C after 3 of its trials ended, one trial at a time, and a
    copy of Tune's state files as they were when the first ended: (storage, that copy)."""
    storage, older = where / "study", where / "older"
    spec = smoke_spec(where, times=2, at_once=1)
    d = Driver("run", spec, "--storage", str(storage), "--quiet", log=where / "run.log")
    try:
        d.wait_until(lambda: _ended(storage) >= 1, poll=0.01)
        older.mkdir()
        for f in _state_files(storage / "tune" / NAME):
            shutil.copy2(f, older / f.name)
        d.wait_until(lambda: _ended(storage) >= 3, poll=0.01)
        assert d.interrupt() == 130, d.output()[-2000:]
    finally:
        if d.proc.poll() is None:
            d.kill()
    return storage, older


def finish_a_study(where: Path) -> tuple[Path, Path]:
    """A smoke study of 3 trials run to the end, then grown by ``resume --more 1`` (so Tune saved
    its state twice, in two driver sessions), and a copy of Tune's state files as the run left
    them: (storage, that copy)."""
    storage, older = where / "study", where / "older"
    for args in (("run", "parity-smoke", "--num-samples", "3"), ("resume", NAME, "--more", "1")):
        done = cli(*args, "--storage", str(storage), "--quiet", timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        if args[0] == "run":
            older.mkdir()
            for f in _state_files(storage / "tune" / NAME):
                shutil.copy2(f, older / f.name)
    return storage, older


def damage(experiment: Path, older: Path, kind: str, how: str) -> Path:
    """Damage the newest of Tune's ``kind`` files as ``how`` says; returns the file."""
    copies = [p for p in _state_files(experiment) if p.name.startswith(kind)]
    newest = max(copies, key=lambda p: p.name)
    data = newest.read_bytes()
    if how == "removed":
        newest.unlink()
    elif how == "all removed":
        for p in copies:
            p.unlink()
    elif how == "older":
        copies = sorted(p for p in older.iterdir() if p.name.startswith(kind))
        newest.write_bytes(copies[-1].read_bytes())
    else:
        keep = {"half": len(data) // 2, "one byte": 1, "empty": 0}[how]
        newest.write_bytes(data[:keep])
    return newest


def check_finished(
    storage: Path, ended_before: dict[str, tuple[str, int]], expected: int = NUM_SAMPLES
) -> list[str]:
    """What is wrong with the study after the resume, which should have left ``expected`` trials
    (empty: nothing)."""
    problems = []
    table = trials(storage, NAME)
    if len(table) != expected or not table["trial_id"].is_unique:
        problems.append(f"{len(table)} trials ({table['trial_id'].nunique()} ids), not {expected}")
    if table.duplicated(["lambda_p", "beta", "max_steps", "seed"]).any():
        problems.append("a configuration ran twice")
    if not table["status"].isin(ENDED).all():
        problems.append(f"not all final: {table['status'].tolist()}")
    now = {r.trial_id: (r.status, r.iteration) for r in table.itertuples()}
    for trial_id, was in ended_before.items():
        if now.get(trial_id) != was:
            problems.append(f"ended trial {trial_id} was {was}, now {now.get(trial_id)}")
    paths = StudyPaths(str(storage), NAME)
    study = optuna.load_study(study_name=NAME, storage=optuna_storage(paths))
    states = [t.state for t in study.trials]
    if optuna.trial.TrialState.RUNNING in states:
        problems.append("an Optuna trial is left RUNNING")
    held = sorted(t.user_attrs.get(TUNE_ID_ATTR, "") for t in study.trials if t.state.is_finished())
    if held != sorted(table["trial_id"]):
        problems.append(f"Optuna's finished trials are not the study's: {held}")
    return problems


def ended_trials(storage: Path) -> dict[str, tuple[str, int]]:
    """(outcome, iteration) of every trial with an end record."""
    out = {}
    for path in Path(StudyPaths(str(storage), NAME).ended_dir).glob("*.json"):
        record = EndRecord.from_json(path.read_bytes())
        out[record.trial_id] = (record.outcome, record.iteration)
    return out


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return interrupt_a_study(tmp_path_factory.mktemp("torn"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return finish_a_study(tmp_path_factory.mktemp("torn-finished"))


@pytest.mark.parametrize(
    ("study", "kind", "how", "flags", "expected"),
    [
        ("interrupted", "tuner.pkl", "half", [], NUM_SAMPLES),  # the progress table on, as users run it
        ("interrupted", "experiment_state", "older", ["--quiet"], NUM_SAMPLES),
        # a finished study whose search generator's files are all gone still grows
        ("finished", "search_gen_state", "all removed", ["--more", "2"], FINISHED_SAMPLES + 2),
    ],
)
def test_a_resume_finishes_whatever_tune_state_it_finds(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    study: str,
    kind: str,
    how: str,
    flags: list[str],
    expected: int,
) -> None:
    storage, older = request.getfixturevalue(study)
    copy = tmp_path / "copy"
    shutil.copytree(storage, copy, symlinks=True)
    before = ended_trials(copy)
    damage(copy / "tune" / NAME, older, kind, how)
    done = cli("resume", NAME, "--storage", str(copy), *flags, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert check_finished(copy, before, expected) == []
