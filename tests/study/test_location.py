"""A study is where its folder is: resumed from another working directory, from a copy with the
original gone, from a local download of an S3 study; refused in one line when half copied;
grown with more trials; warm-started from another. Each on a real local Ray study."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import optuna
import pandas as pd
import pyarrow.fs as pafs
import pytest

from ponder.files import umask
from study.records.ranking import ranked_trials
from study.search.journal import optuna_storage
from study.search.search import TUNE_ID_ATTR
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths
from tests.study.conftest import S3, Driver, cli, finished, history, smoke_spec, trials

pytestmark = pytest.mark.slow
ENDED = ["completed", "early_stopped", "diverged"]


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its sha256: what a command must not change."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_every_file_of_a_study_is_as_readable_as_the_umask_lets_it(smoke: tuple[Path, object]) -> None:
    """A study copied to or read from a shared disk by a colleague: its Parquet, spec, records
    and checkpoints were written to temporary files and renamed, and were left 0600 (mkstemp's
    mode) whatever the umask; each now has the mode a plain ``open`` gives."""
    storage, _ = smoke
    allowed = 0o666 & ~umask()
    files = [p for p in storage.rglob("*") if p.is_file()]
    modes = {str(p.relative_to(storage)): oct(p.stat().st_mode & 0o666) for p in files}
    assert len(files) > 20 and set(modes.values()) == {oct(allowed)}, modes


def _optuna(storage: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=optuna_storage(StudyPaths(str(storage), name)))


def _check_final(storage: Path, name: str, n: int) -> pd.DataFrame:
    t = trials(storage, name)
    assert len(t) == n and t["trial_id"].is_unique, t[["trial_id", "status"]]
    assert t["status"].isin(ENDED).all(), t["status"].value_counts()
    h = history(storage, name)
    assert not h.duplicated(["trial_id", "iteration"]).any()
    states = [x.state for x in _optuna(storage, name).trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == n and len(states) == n, states
    return t


def test_a_study_made_with_the_default_storage_resumes_from_another_directory(
    driver: Callable[..., Driver], tmp_path: Path
) -> None:
    """Issue 17: from another folder, ``resume X --storage /abs/results`` used to restart Tune's
    experiment, write under the working directory and leave the Parquet with one trial."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir(), elsewhere.mkdir()
    # storage: the spec's, results under the working directory
    d = driver(
        "run", smoke_spec(tmp_path, times=10, at_once=1), "--name", "x", "--num-samples", "4", cwd=project
    )
    storage = project / "results"
    d.wait_until(finished(storage, "x", at_least=1))
    assert d.interrupt() == 130
    ended = set(trials(storage, "x").query("status in @ENDED")["trial_id"])
    done = cli("resume", "x", "--storage", str(storage), cwd=elsewhere)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert list(elsewhere.iterdir()) == []  # nothing written where the command ran
    t = _check_final(storage, "x", 4)
    assert ended <= set(t["trial_id"])
    status = cli("status", "x", "--storage", str(storage), cwd=elsewhere)
    assert status.returncode == 0 and "x: 4 trials" in status.stdout, status.stdout + status.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_copy_resumes_and_reads_with_the_original_gone(
    driver: Callable[..., Driver], tmp_path: Path
) -> None:
    """``cp -r results /elsewhere``, the original removed: resume, status, export, report and
    evaluate of the copy, from another folder; nothing reappears at the old place."""
    old, new, cwd = tmp_path / "old", tmp_path / "new", tmp_path / "cwd"
    cwd.mkdir()
    spec = smoke_spec(tmp_path, times=10, at_once=1)
    d = driver("run", spec, "--name", "c", "--num-samples", "4", "--storage", str(old))
    d.wait_until(finished(old, "c", at_least=1))
    assert d.interrupt() == 130
    before = trials(old, "c").query("status in @ENDED").set_index("trial_id")
    shutil.copytree(old, new)
    shutil.rmtree(old)
    for verb in (["resume", "c"], ["status", "c"], ["export", "c"], ["report", "c"], ["evaluate", "c"]):
        done = cli(*verb, "--storage", str(new), cwd=cwd)
        assert done.returncode == 0, f"{verb}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        assert not old.exists(), f"{verb} wrote at the old place"
        if verb[0] == "resume":  # its progress table, pickled at the first run, names the copy
            assert f"Results: {new} (" in done.stdout, done.stdout[-2000:]
    assert list(cwd.iterdir()) == []
    t = _check_final(new, "c", 4).set_index("trial_id")
    for trial_id, row in before.iterrows():
        assert t.loc[trial_id, "status"] == row["status"]
        assert t.loc[trial_id, "iteration"] == row["iteration"]
    assert t["checkpoint_path"].str.startswith(str(new)).all(), t["checkpoint_path"]
    assert (new / "reports" / "c" / "index.html").exists()


def test_a_local_download_of_an_s3_study_resumes_without_the_bucket(
    driver: Callable[..., Driver], tmp_path: Path, s3: S3
) -> None:
    """A cluster study's S3 prefix synced to a laptop (``aws s3 sync`` layout), the bucket's copy
    deleted: the local copy resumes to the end and reads back."""
    root = f"{s3.bucket()}/ponder"
    spec = smoke_spec(tmp_path, at_once=1)
    d = driver("run", spec, "--name", "s", "--num-samples", "3", "--storage", root, own_ray=True)
    paths = StudyPaths(root, "s")

    def one_ended() -> bool:
        selector = pafs.FileSelector(paths.ended_dir.removeprefix("s3://"), allow_not_found=True)
        return any(i.base_name.endswith(".json") for i in s3.fs().get_file_info(selector))

    d.wait_until(one_ended, poll=0.5)
    assert d.interrupt() == 130
    local = tmp_path / "download"
    prefix = root.removeprefix("s3://")
    for key in s3.files(root):  # aws s3 sync s3://bucket/ponder download/
        target = local / key[len(prefix) + 1 :]
        target.parent.mkdir(parents=True, exist_ok=True)
        with s3.fs().open_input_stream(key) as f:
            target.write_bytes(f.readall())
        s3.fs().delete_file(key)
    done = cli("resume", "s", "--storage", str(local), "--quiet")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    _check_final(local, "s", 3)
    assert s3.files(root) == []  # nothing written back to the bucket


@pytest.mark.parametrize("missing", ["journal", "tune"])
def test_a_half_copied_study_is_refused_in_one_line(
    smoke: tuple[Path, object], tmp_path: Path, missing: str
) -> None:
    storage, _ = smoke
    copy = tmp_path / "copy"
    shutil.copytree(storage, copy)
    if missing == "journal":
        (copy / "studies" / "parity-smoke" / "optuna.journal").unlink()
    else:
        shutil.rmtree(copy / "tune" / "parity-smoke")
    snapshot = _tree(copy)
    done = cli("resume", "parity-smoke", "--storage", str(copy))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "is incomplete" in done.stderr, done.stderr
    assert ("optuna.journal" if missing == "journal" else "tune/parity-smoke") in done.stderr
    assert _tree(copy) == snapshot


def test_a_damaged_study_is_repaired_by_export(smoke: tuple[Path, object], tmp_path: Path) -> None:
    """Today's main could leave a newest Tune state with fewer trials than had ended (and a
    Parquet rewritten from it): ``export`` rebuilds every ended trial from the study's records,
    and ``status`` counts them even before."""
    storage, _ = smoke
    copy = tmp_path / "copy"
    shutil.copytree(storage, copy)
    want = trials(copy, "parity-smoke").set_index("trial_id")
    (state,) = sorted((copy / "tune" / "parity-smoke").glob("experiment_state-*.json"))[-1:]
    doc = json.loads(state.read_text())
    doc["trial_data"] = doc["trial_data"][:2]  # Tune's state lost four trials
    state.write_text(json.dumps(doc))
    shutil.rmtree(copy / "trials"), shutil.rmtree(copy / "history")
    status = cli("status", "parity-smoke", "--storage", str(copy))
    assert f"{len(want)} trials" in status.stdout and "not in the Parquet" in status.stdout, status.stdout
    done = cli("export", "parity-smoke", "--storage", str(copy))
    assert done.returncode == 0, done.stderr[-3000:]
    got = trials(copy, "parity-smoke").set_index("trial_id")
    assert set(got.index) == set(want.index)
    for column in ("status", "iteration", "test/halted_accuracy", "reports", "lambda_p"):
        assert got[column].sort_index().equals(want[column].sort_index()), column


def test_a_finished_study_grows_with_more_trials(tmp_path: Path) -> None:
    spec = smoke_spec(tmp_path, at_once=1)
    done = cli("run", spec, "--name", "g", "--num-samples", "4", "--storage", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    before = trials(tmp_path, "g")
    history_before = history(tmp_path, "g")
    first = _optuna(tmp_path, "g")
    first_ids = [x.user_attrs[TUNE_ID_ATTR] for x in first.trials]
    for bad in ("0", "-2", "x"):
        refused = cli("resume", "g", "--more", bad, "--storage", str(tmp_path))
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    done = cli("resume", "g", "--more", "3", "--storage", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    t = _check_final(tmp_path, "g", 7)
    assert set(before["trial_id"]) < set(t["trial_id"])
    # the earlier trials did not run again: their rows and history are as they were
    old = history(tmp_path, "g").query("trial_id in @before.trial_id").sort_values(["trial_id", "iteration"])
    expected = history_before.sort_values(["trial_id", "iteration"])
    pd.testing.assert_frame_equal(old.reset_index(drop=True), expected.reset_index(drop=True))
    # the same Optuna study went on: its first four trials are the earlier ones, then three more
    study = _optuna(tmp_path, "g")
    assert study._study_id == first._study_id
    assert [x.user_attrs[TUNE_ID_ATTR] for x in study.trials[:4]] == first_ids
    assert {x.user_attrs[TUNE_ID_ATTR] for x in study.trials} == set(t["trial_id"])
    tune_dirs = [p for p in (tmp_path / "tune" / "g").iterdir() if p.is_dir()]
    assert len({p.name.split("_")[2] for p in tune_dirs}) == 7
    spec = (tmp_path / "studies" / "g" / "spec.toml").read_text()
    assert "num_samples = 7" in spec


def test_a_warm_start_begins_with_the_earlier_studys_best(smoke: tuple[Path, object], tmp_path: Path) -> None:
    storage, _ = smoke
    earlier = trials(storage, "parity-smoke")
    shipped = load_spec("parity-smoke")
    best = ranked_trials(earlier, shipped.metric, shipped.mode).head(2)
    copy = tmp_path / "store"
    shutil.copytree(storage, copy)
    spec = smoke_spec(tmp_path, at_once=1)
    args = ("run", spec, "--name", "w", "--num-samples", "3", "--storage", str(copy), "--quiet")
    done = cli(*args, "--warm-start", "parity-smoke", "--top", "2")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "2 best trials of parity-smoke" in done.stdout
    study = _optuna(copy, "w")
    names = [d.name for d in shipped.space]
    for got, (_, want) in zip(study.trials[:2], best.iterrows(), strict=True):
        assert got.params == pytest.approx({n: want[n] for n in names}), (got.params, want[names].to_dict())
    # a narrower space refuses an earlier value in one line, before Ray starts
    narrow = tmp_path / "narrow.toml"
    narrow.write_text(
        shipped.source.replace(
            "[space.lambda_p]\nlow = 0.05\nhigh = 0.9", "[space.lambda_p]\nlow = 0.95\nhigh = 1.0"
        )
    )
    refused = cli("run", str(narrow), "--name", "n", "--storage", str(copy), "--warm-start", "parity-smoke")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.count("\n") == 1 and "outside this spec's range" in refused.stderr, refused.stderr
    assert not (copy / "studies" / "n").exists()


@pytest.mark.parametrize(
    "torn", [None, "experiment_state", "search_gen_state", "searcher-state", "tuner.pkl"]
)
def test_a_torn_tune_state_file_is_set_aside_whole(
    smoke: tuple[Path, object], tmp_path: Path, torn: str | None
) -> None:
    """One Tune save writes three files (found by the kill campaign: an empty search_gen_state
    made the resume restore a searcher without its space). Any torn one sets its session aside."""
    from study.run.tune_state import restorable

    storage, _ = smoke
    copy = tmp_path / "copy"
    shutil.copytree(storage, copy)
    experiment = copy / "tune" / "parity-smoke"
    if torn is not None:  # in every saved session (an earlier test may have resumed the study)
        victims = list(experiment.glob(torn if torn.endswith(".pkl") else f"{torn}-*"))
        assert victims
        for victim in victims:
            victim.write_bytes(victim.read_bytes()[: len(victim.read_bytes()) // 2])
    assert restorable(StudyPaths(str(copy), "parity-smoke")) is (torn is None)
    assert bool(list(experiment.glob("*.torn"))) is (torn is not None)
    assert (experiment / "tuner.pkl").exists() is (torn != "tuner.pkl")


@pytest.mark.parametrize("table", ["on", "off"])
def test_a_resume_killed_after_setting_a_torn_tuner_pkl_aside_is_finished_by_the_next(
    smoke: tuple[Path, object], tmp_path: Path, table: str
) -> None:
    """Found by the kill campaign: a resume set a torn tuner.pkl aside and was killed before Tune
    wrote a new one; every later resume refused the study as half copied (tune/ "missing")."""
    storage, _ = smoke
    copy = tmp_path / "copy"
    shutil.copytree(storage, copy)
    experiment = copy / "tune" / "parity-smoke"
    (experiment / "tuner.pkl").rename(experiment / "tuner.pkl.torn")  # what that resume left
    before = trials(copy, "parity-smoke").set_index("trial_id")
    quiet = ["--quiet"] if table == "off" else []
    done = cli("resume", "parity-smoke", "--storage", str(copy), *quiet)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    after = _check_final(copy, "parity-smoke", len(before)).set_index("trial_id")
    assert after.loc[before.index, "reports"].equals(before["reports"])  # nothing trained again
