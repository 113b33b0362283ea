"""Fused trials (``[resources] fuse = K``): a study's trials trained as one model per device, each
still a trial everywhere: its Tune trial, Optuna trial, end record, reports, checkpoint and ASHA
decision. Real Ray, Optuna and Parquet; the numbers checked against plain `Trainer` runs."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch

from ponder.config import config_from_dict
from ponder.trainer import Trainer
from study.records.records import ended_trial_ids, read_reports
from study.search.journal import optuna_storage
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths
from tests.study.conftest import REPO, Driver, cli, history, ledger_has, trials

pytestmark = pytest.mark.slow
NAME = "parity-smoke"
SAMPLES = load_spec(NAME).search.num_samples
ENDED = {"completed", "early_stopped", "diverged"}
FUSE = 4


def fused_spec(where: Path, fuse: int = FUSE) -> str:
    """parity-smoke with ``fuse`` trials a group on the machine's two CPUs, ``fuse`` at once."""
    source = load_spec(NAME).source
    spec = where / f"{NAME}.toml"
    spec.write_text(
        source.replace("max_concurrent = 2", f"max_concurrent = {fuse}")
        .replace("cpu = 1\n", "cpu = 2\n")
        .replace("gpu = 0\n", f"gpu = 0\nfuse = {fuse}\n")
    )
    return str(spec)


def saved_reports(storage: Path, name: str = NAME) -> dict[str, list[dict[str, object]]]:
    """Every report of every ended trial, as the study saved them (in its end records)."""
    paths = StudyPaths(str(storage), name)
    return {trial_id: read_reports(paths, trial_id) for trial_id in ended_trial_ids(paths)}


def check_study(storage: Path) -> pd.DataFrame:
    """The checks every finished fused study passes; returns its trials table."""
    table = trials(storage, NAME)
    assert len(table) == SAMPLES and table["trial_id"].is_unique
    assert set(table["status"]) <= ENDED
    paths = StudyPaths(str(storage), NAME)
    study = optuna.load_study(study_name=NAME, storage=optuna_storage(paths))
    assert [t.state.is_finished() for t in study.trials] == [True] * SAMPLES
    assert len(list(Path(paths.ended_dir).glob("*.json"))) == SAMPLES
    h = history(storage, NAME)
    for _, rows in h.groupby("trial_id"):  # one row per report, none made twice
        made = list(rows.sort_values("report")["iteration"])
        assert made == list(range(10, max(made) + 1, 10))
    return table


def plain_accuracies(checkpoint: Path, iterations: int) -> list[float]:
    """test/halted_accuracy at each evaluation of a plain `Trainer` run of the checkpoint's config."""
    state = torch.load(checkpoint / "trainer.pt", map_location="cpu", weights_only=True)
    config = config_from_dict(dict(state["config"]))
    config.iterations = iterations
    return [m["test/halted_accuracy"] for m in Trainer(config).run()]


def test_a_fused_study_is_its_trials_run_alone(tmp_path: Path) -> None:
    """The progress table on, as users run it: every trial ends, each in Parquet, Optuna, its end
    record and its checkpoint; several were trained in one group at once; each reported exactly
    the accuracies its configuration gives when trained alone."""
    done = cli("run", fused_spec(tmp_path), "--storage", str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    table = check_study(tmp_path)
    assert set(table["status"]) == {"completed", "early_stopped"}  # ASHA stopped some members alone

    h = history(tmp_path, NAME)
    # the Parquet says which group trained each report and each trial: one device, one shape,
    # one group trained them all, several at once, never more than its K slots
    assert h["fuse_group"].notna().all() and h["fuse_group"].nunique() == 1
    assert 2 <= h["fuse_members"].max() <= FUSE
    assert list(table["fuse_group"]) == [h["fuse_group"].iloc[0]] * SAMPLES
    reports = saved_reports(tmp_path)  # the study's own copy of the reports says the same
    assert {r["fuse_group"] for rs in reports.values() for r in rs} == set(h["fuse_group"])
    for row in table.itertuples():
        got = list(h[h["trial_id"] == row.trial_id].sort_values("report")["test/halted_accuracy"])
        want = plain_accuracies(Path(row.checkpoint_path), int(row.iteration))
        assert got == pytest.approx(want, abs=1e-6), row.trial_id
        # the checkpoint is a plain one: a Trainer loads it where the trial stopped
        assert Trainer.from_checkpoint(Path(row.checkpoint_path) / "trainer.pt").iteration == row.iteration


def test_sigkill_of_a_fused_study_then_resume_goes_on_from_each_members_checkpoint(
    driver: Callable[..., Driver], tmp_path: Path
) -> None:
    """A killed driver takes its fusers with it; the resume's trials join new ones, each from its
    own checkpoint: no report is made twice and each trial's accuracies are still its plain run's."""
    spec = fused_spec(tmp_path)
    d = driver("run", spec, "--storage", str(tmp_path), "--quiet")
    d.wait_until(ledger_has(tmp_path, NAME, "stopped"), poll=0.01)  # ASHA's first stop, at 10
    d.kill()
    done = cli("resume", NAME, "--storage", str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    table = check_study(tmp_path)
    h = history(tmp_path, NAME)
    assert h["fuse_group"].notna().all() and h["fuse_group"].nunique() == 2  # before and after the kill
    assert set(table["fuse_group"]) <= set(h["fuse_group"])
    for row in table.itertuples():
        got = list(h[h["trial_id"] == row.trial_id].sort_values("report")["test/halted_accuracy"])
        assert got == pytest.approx(plain_accuracies(Path(row.checkpoint_path), int(row.iteration)), abs=1e-6)


_PLACE_ON_A_GPU = """
import sys, ray
from ponder.config import ParityConfig
from study.run.fused import FuserRegistry
ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
registry = FuserRegistry(capacity=2, threads=1, group_cpus=1, group_gpus=float(sys.argv[1]))
node = ray.get_runtime_context().get_node_id()
config = ParityConfig(n_elems=4, n_hidden=8, batch_size=8, eval_samples=8, device="cpu").to_dict()
fusers = []
for trial in range(5):
    answer, fuser = registry.place(f"t{trial}", node, "0", config, None)
    fusers.append(ray.get(fuser.describe.remote())[1] if fuser is not None else answer)  # its id
print("PLACED", fusers, flush=True)
"""


@pytest.mark.parametrize(("group_gpus", "groups"), [(1.0, 1), (0.5, 2)])
def test_a_gpu_holds_as_many_fused_groups_as_it_has_group_shares(group_gpus: float, groups: int) -> None:
    """``gpu = 0.5`` with ``fuse = 2``: Tune places 4 trials (1/4 GPU each) on one GPU, so the GPU
    has 2 groups of 2, not 1 group and 2 trials waiting for a slot; ``gpu = 1``: 1 group."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", _PLACE_ON_A_GPU, str(group_gpus)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=180,
    )  # fmt: skip
    placed = out.stdout.rpartition("PLACED ")[2]
    assert out.returncode == 0 and placed, out.stdout[-2000:] + out.stderr[-3000:]
    fusers = ast.literal_eval(placed)
    joined = fusers[: 2 * groups]
    assert len(set(joined)) == groups and "full" not in joined  # 2 members a group
    assert fusers[2 * groups :] == ["full"] * (5 - 2 * groups)  # no more groups than the GPU holds


_LOSE_THE_REGISTRY = """
import ray
from ponder.config import ParityConfig
from study.run.fused import FusedRun, FusionLost, start_fusion
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
fusion, registry = start_fusion(capacity=2, threads=1, group_cpus=1)
node = ray.get_runtime_context().get_node_id()
config = ParityConfig(n_elems=4, n_hidden=8, batch_size=8, eval_samples=8, device="cpu").to_dict()
run = FusedRun(fusion, "t0", config)
print("FIRST", run._place(node, None)[0], flush=True)
ray.kill(registry, no_restart=False)  # a crash: Ray restarts it, empty
print("RESTARTED", FusedRun(fusion, "t1", config)._place(node, None)[0], flush=True)
ray.kill(registry, no_restart=True)  # gone for good
try:
    FusedRun(fusion, "t2", config)._place(node, None)
except FusionLost as e:
    print("LOST", str(e).replace(chr(10), "|"), flush=True)
"""


def test_a_trial_waits_for_a_restarted_registry_and_says_in_one_line_when_it_is_gone() -> None:
    """A registry that crashes is restarted by Ray and a trial joins through it again; one that is
    gone for good fails the trial with `FusionLost`, one line saying what happened and what to do."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", _LOSE_THE_REGISTRY],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=180,
    )
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert out.returncode == 0 and "LOST" in lines, out.stdout[-2000:] + out.stderr[-3000:]
    assert lines["FIRST"] == "joined" and lines["RESTARTED"] == "joined"
    assert "|" not in lines["LOST"] and "trial t2 cannot reach the study's fuser registry" in lines["LOST"]
    assert "resume the study" in lines["LOST"]
