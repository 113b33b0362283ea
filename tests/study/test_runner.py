"""A real study end to end: Ray Tune, Optuna, ASHA, checkpoints, Parquet read back with pandas."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pandas as pd
import pyarrow.fs as pafs
import pytest

from ponder.config import ParityConfig
from ponder.metrics import eval_set_names
from study.records.asha_state import read_state
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths, write_parquet
from tests.study.conftest import REPO, cli, history, trials

pytestmark = pytest.mark.slow
SMOKE = load_spec("parity-smoke")
FINAL = {"completed", "early_stopped", "diverged"}


def _optuna(storage: Path, name: str) -> optuna.Study:
    journal = optuna.storages.journal.JournalFileBackend(StudyPaths(str(storage), name).optuna_journal)
    return optuna.load_study(study_name=name, storage=optuna.storages.JournalStorage(journal))


def test_every_trial_is_in_parquet_with_its_config(smoke: tuple[Path, Any]) -> None:
    storage, _ = smoke
    df = trials(storage, "parity-smoke")
    assert len(df) == SMOKE.search.num_samples
    assert df["trial_id"].is_unique
    assert set(df["status"]) <= {"completed", "early_stopped"}
    for d in SMOKE.space:  # every searched field is a column under its config name, inside its range
        assert df[d.name].between(d.low, d.high).all(), d.name
    assert df["max_steps"].dtype == "int64"
    for key, value in SMOKE.config.items():  # every fixed field too
        assert (df[key] == value).all(), key
    assert (df["task"] == "parity").all()
    assert (df["device"] == "cpu").all() and df["node_ip"].notna().all()
    assert df["checkpoint_path"].map(lambda p: Path(p, "trainer.pt").is_file()).all()
    # the study's data stream is pinned in its saved spec, so a later default cannot change it
    assert (df["data_stream"] == "counter").all()
    saved = (storage / "studies" / "parity-smoke" / "spec.toml").read_text()
    assert 'data_stream = "counter"' in saved and "data_stream" not in SMOKE.source
    assert df["test/halted_accuracy"].between(0, 1).all()
    assert (df["nan_events"] == 0).all()
    sets = eval_set_names(ParityConfig(**SMOKE.config))
    assert sets == ["test", "easy", "hard"]
    for s in sets:  # the pondering diagnostics of every evaluation set (issue 13)
        halted, best, stable = (
            df[f"{s}/{m}"] for m in ("halted_accuracy", "best_step_accuracy", "stable_accuracy")
        )
        assert best.between(0, 1).all() and stable.between(0, 1).all(), s
        assert (stable <= halted).all(), s


def test_asha_stopped_a_trial_early(smoke: tuple[Path, Any]) -> None:
    storage, _ = smoke
    df = trials(storage, "parity-smoke").set_index("trial_id")
    stopped = df[df["status"] == "early_stopped"]
    assert len(stopped) >= 1
    assert (stopped["iteration"] < SMOKE.iterations).all()
    assert (df.loc[df["status"] == "completed", "iteration"] == SMOKE.iterations).all()
    asha = read_state(StudyPaths(str(storage), "parity-smoke").asha)  # asha.json and its log
    assert asha is not None and set(asha["stopped"]) == set(stopped.index)


def test_history_has_one_row_per_report(smoke: tuple[Path, Any]) -> None:
    storage, _ = smoke
    df = trials(storage, "parity-smoke").set_index("trial_id")
    h = history(storage, "parity-smoke")
    per_trial = h.groupby("trial_id")["iteration"]
    pd.testing.assert_series_equal(
        per_trial.count().sort_index(), df["reports"].sort_index(), check_names=False
    )
    assert (per_trial.max().sort_index() == df["iteration"].sort_index()).all()
    interval = SMOKE.config["eval_interval"]
    assert (h["iteration"] % interval == 0).all()  # every report is an evaluation
    assert (df["reports"] == df["iteration"] // interval).all()
    last = h.sort_values("iteration").groupby("trial_id").last()
    assert (last["test/halted_accuracy"].sort_index() == df["test/halted_accuracy"].sort_index()).all()


def test_all_studies_read_in_one_line(smoke: tuple[Path, Any]) -> None:
    storage, _ = smoke
    df = pd.read_parquet(storage / "trials")
    assert set(df["study"].astype(str)) == {"parity-smoke"}


def test_optuna_study_on_disk_has_every_trial_complete(smoke: tuple[Path, Any]) -> None:
    storage, _ = smoke
    study = _optuna(storage, "parity-smoke")
    states = [t.state for t in study.trials]
    assert len(states) == SMOKE.search.num_samples
    assert states == [optuna.trial.TrialState.COMPLETE] * len(states)


def test_summary_names_the_best_trial(smoke: tuple[Path, Any]) -> None:
    storage, done = smoke
    df = trials(storage, "parity-smoke")
    best = df.sort_values("test/halted_accuracy", ascending=False).iloc[0]
    assert f"{len(df)} trials" in done.stdout
    top = done.stdout.split("top ")[1].splitlines()
    assert top[2].split()[0] == best["trial_id"]  # header, column names, then the best trial


def test_status_and_export_read_the_same_study(smoke: tuple[Path, Any]) -> None:
    storage, _ = smoke
    before = trials(storage, "parity-smoke")
    status = cli("status", "parity-smoke", "--storage", str(storage))
    assert status.returncode == 0
    for s, n in before["status"].value_counts().items():
        assert f"{n} {s}" in status.stdout
    export = cli("export", "parity-smoke", "--storage", str(storage))
    assert export.returncode == 0, export.stderr
    after = trials(storage, "parity-smoke")
    pd.testing.assert_frame_equal(
        before.sort_values("trial_id").reset_index(drop=True),
        after.sort_values("trial_id").reset_index(drop=True),
    )


def test_an_export_killed_between_its_two_writes_leaves_no_trial_without_its_reports(
    smoke: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two Parquet files are written one after the other; a driver killed in between must
    not leave the trials file showing a trial whose reports history lacks (a CI run read an
    ended trial without its rows). Here the study's history is an older one (no rows at all)
    and the export dies at its second write."""
    from study.run import dataset, runner

    storage = tmp_path / "copy"
    shutil.copytree(smoke[0], storage)
    paths = StudyPaths(str(storage), "parity-smoke")
    Path(paths.history_parquet).unlink()
    written: list[str] = []

    def write_then_die(uri: str, table: Any) -> None:
        if written:
            raise KeyboardInterrupt("killed between the two writes")
        written.append(uri)
        write_parquet(uri, table)

    monkeypatch.setattr(dataset, "write_parquet", write_then_die)  # both tables go through it
    with pytest.raises(KeyboardInterrupt):
        runner.export("parity-smoke", str(storage))
    shown = trials(storage, "parity-smoke")
    h = history(storage, "parity-smoke")  # no file left: a frame without columns
    rows = h.groupby("trial_id").size() if "trial_id" in h else pd.Series(dtype=int)
    rows = rows.reindex(shown["trial_id"], fill_value=0)
    assert (rows.to_numpy() == shown["reports"].to_numpy()).all(), rows.to_dict()


DIVERGING = """
description = "one learning rate that diverges"
task = "parity"
[config]
n_elems = 4
n_hidden = 16
batch_size = 32
eval_samples = 200
iterations = 40
eval_interval = 10
grad_clip = 0.0
max_nan_events = 3
[space.lr]
values = [0.003, 1e38]  # overflows float32 at the first update: NaN for certain
[search]
sampler = "random"
seed = 1
num_samples = 4
max_concurrent = 1
[scheduler]
metric = "test/halted_accuracy"
mode = "max"
grace_period = 40
reduction_factor = 2
"""


def test_a_diverged_trial_fails_in_optuna_and_the_study_goes_on(tmp_path: Path) -> None:
    spec = tmp_path / "diverging.toml"
    spec.write_text(DIVERGING)
    done = cli("run", str(spec), "--storage", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    df = trials(tmp_path, "diverging").set_index("trial_id")
    bad, good = df[df["lr"] > 1], df[df["lr"] < 1]
    assert len(bad) >= 1 and len(good) >= 1, "seed 1 should draw both learning rates"
    assert (bad["status"] == "diverged").all()
    assert (bad["nan_events"] > 3).all()
    # the diverged model's arg-maxes over NaN are no result: not 0.5 accuracy at step 1
    assert bad["test/halted_accuracy"].isna().all() and bad["test/mean_halting_step"].isna().all()
    assert bad["hard/halted_accuracy"].isna().all()
    hist = history(tmp_path, "diverging")  # every report as measured, the divergent one labelled
    assert (hist["outcome"] == "diverged").sum() == len(bad)
    lines = done.stdout.splitlines()
    top = lines[next(i for i, ln in enumerate(lines) if ln.startswith("top ")) + 2].split()[0]
    assert top in set(good.index), done.stdout  # the summary's best is the report's and evaluate's
    assert (good["status"] == "completed").all() and (good["nan_events"] == 0).all()
    study = _optuna(tmp_path, "diverging")
    by_lr = {t.params["lr"]: t.state for t in study.trials}
    states = [t.state for t in study.trials if t.params["lr"] > 1]
    assert states and set(states) == {optuna.trial.TrialState.FAIL}, by_lr
    assert {t.state for t in study.trials if t.params["lr"] < 1} == {optuna.trial.TrialState.COMPLETE}
    # Tune's loggers as a spec leaves them: result.json alone (no TensorBoard, no progress.csv)
    trial_dirs = [d for d in (tmp_path / "tune" / "diverging").iterdir() if d.is_dir()]
    assert trial_dirs and all((d / "result.json").exists() for d in trial_dirs)
    assert not [f for d in trial_dirs for f in d.iterdir() if f.name.startswith(("events.", "progress."))]


def test_an_ended_trial_keeps_only_its_last_checkpoint(smoke: tuple[Path, Any]) -> None:
    storage, _ = smoke
    df = trials(storage, "parity-smoke")
    for trial_id, kept, reports in df[["trial_id", "checkpoint_path", "reports"]].itertuples(index=False):
        dirs = sorted((storage / "tune" / "parity-smoke").glob(f"*_{trial_id}_*/checkpoint_*"))
        assert len(dirs) == reports  # one checkpoint a report: the directories all stay
        assert [d for d in dirs if any(d.iterdir())] == [Path(kept)]  # only the last holds weights


def test_every_trial_has_tensorboard_events_though_the_driver_skips_torch(smoke: tuple[Path, Any]) -> None:
    """With ``[run] tensorboard = true`` (the smoke spec's), each trial's event file is written from
    a `run` driver that imported tensorboardX with torch hidden
    (`study.run.tensorboard.import_tensorboardx_without_torch`); Tune's CSV logger stays off."""
    storage, _ = smoke
    for trial_id in trials(storage, "parity-smoke")["trial_id"]:
        events = list((storage / "tune" / "parity-smoke").glob(f"*_{trial_id}_*/events.out.tfevents.*"))
        assert len(events) == 1, trial_id
        assert b"ray/tune/test/halted_accuracy" in events[0].read_bytes(), trial_id
    assert not list((storage / "tune" / "parity-smoke").glob("*/progress.csv"))


def test_optuna_trials_orphaned_by_a_kill_are_marked_failed(tmp_path: Path) -> None:
    """A driver killed between asking Optuna for a trial and saving Tune's state leaves that
    Optuna trial RUNNING with no Tune trial behind it; the finished study marks it FAILED."""
    from study.run.runner import fail_orphaned_optuna_trials

    paths = StudyPaths(str(tmp_path), "s")
    Path(paths.optuna_journal).parent.mkdir(parents=True)
    journal = optuna.storages.journal.JournalFileBackend(paths.optuna_journal)
    study = optuna.create_study(study_name="s", storage=optuna.storages.JournalStorage(journal))
    done, orphan = study.ask(), study.ask()
    study.tell(done, 0.5)
    assert fail_orphaned_optuna_trials(SMOKE, paths) == 1
    states = {t.number: t.state for t in _optuna(tmp_path, "s").trials}
    assert states == {
        done.number: optuna.trial.TrialState.COMPLETE,
        orphan.number: optuna.trial.TrialState.FAIL,
    }


@pytest.mark.parametrize(
    ("experiment", "filesystem", "shown"),
    [
        ("/data/my studies/tune/parity", pafs.LocalFileSystem(), "/data/my studies"),
        (
            "bucket/team/tune/parity",
            pafs.S3FileSystem(anonymous=True, region="us-east-1"),
            "s3://bucket/team",
        ),
    ],
)
def test_the_progress_table_names_the_studys_storage(experiment: str, filesystem: object, shown: str) -> None:
    trial = SimpleNamespace(
        remote_experiment_path=experiment, storage=SimpleNamespace(storage_filesystem=filesystem)
    )
    from study.run.runner import _storage_of

    assert _storage_of(trial) == shown  # type: ignore[arg-type]


def test_a_resume_keeps_tunes_two_newest_states_not_every_one(tmp_path: Path) -> None:
    """Tune writes a set of state files per driver and never removes one (about 70 KB a trial
    each): a resume keeps the newest two sets, a torn one set aside, and no side file without
    its trials' file."""
    from study.run.tune_state import prune_old_states

    paths = StudyPaths(str(tmp_path), "s")
    experiment = Path(paths.experiment)
    experiment.mkdir(parents=True)
    sessions = ["2026-01-01_00-00-01", "2026-01-01_00-00-02", "2026-01-01_00-00-03", "2026-01-01_00-00-04"]
    names = ("experiment_state-{}.json", "search_gen_state-{}.json", "searcher-state-{}.pkl")
    for session in sessions:
        for name in names:
            (experiment / name.format(session)).write_text("{}")
    (experiment / "searcher-state-2026-01-01_00-00-05.pkl").write_text("{}")  # its trials' file never came
    (experiment / "experiment_state-2026-01-01_00-00-00.json.torn").write_text("{")
    (experiment / "tuner.pkl").write_text("x")
    assert prune_old_states(paths) == 2
    assert sorted(p.name for p in experiment.iterdir()) == sorted(
        [
            *(n.format(s) for s in sessions[2:] for n in names),
            "experiment_state-2026-01-01_00-00-00.json.torn",
            "tuner.pkl",
        ]
    )


_MANY_WORKERS = """
import sys, time, ray
from study.run.runner import _init_ray
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths
spec = load_spec(sys.argv[1])
_init_ray("local", StudyPaths(sys.argv[2], spec.name), spec)
@ray.remote
class Trial:
    def ping(self) -> int:
        return 1
n = spec.search.max_concurrent + 2  # the trials, a fuser, the registry
cpus = ray.cluster_resources()["CPU"]
trials = [Trial.options(num_cpus=cpus / n).remote() for _ in range(n)]  # held: all alive at once
ray.get([t.ping.remote() for t in trials])
time.sleep(2)  # the raylet's warnings reach the driver's terminal asynchronously
print("placed", n, flush=True)
"""


def test_a_fused_studys_local_ray_starts_its_workers_without_a_warning(tmp_path: Path) -> None:
    """16 fused trials (and their fusers) on this machine's CPUs are the processes the study asked
    for: its own Ray instance does not print "WARNING: 18 PYTHON worker processes have been started
    ... 9x the maximum expected startup concurrency" on the terminal (Ray's default concurrency,
    the CPU count, did: seen with 8 and 10 workers on two CPUs)."""
    spec = tmp_path / "fused.toml"
    spec.write_text(
        SMOKE.source.replace("max_concurrent = 2", "max_concurrent = 16").replace(
            "gpu = 0\n", "gpu = 0\nfuse = 8\n"
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", _MANY_WORKERS, str(spec), str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0 and "placed 18" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]
    assert "startup concurrency" not in out.stdout + out.stderr, out.stderr[-2000:]
