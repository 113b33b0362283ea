"""Studies on a multi-node Ray cluster: placement over nodes, S3 storage, and a lost node.

The cluster is real Ray (``ray.cluster_utils.Cluster``): a head node without CPUs (it runs only
the driver) and two worker nodes that declare 2 GPUs each, on loopback addresses of their own
(127.0.0.2, 127.0.0.3) so the ``node_ip`` column tells them apart. Torch sees no CUDA here, so
the trials, placed as on a GPU cluster with half a GPU each, train on the CPU. The storage is
S3 (moto's server), reached by Ray, pyarrow and the CLI through the standard AWS variables.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest

from study.records.records import ended_trial_ids, read_reports
from study.run.export import EMPTIED_NOTE
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths
from tests.study.conftest import S3, Driver, cli

# one test process holds the cluster for the module (`make test` spreads the rest over processes)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster")]
WORKER_IPS = ("127.0.0.2", "127.0.0.3")
FINAL = {"completed", "early_stopped"}


@dataclass
class LocalCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    workers: list[Any]  # its worker nodes, in WORKER_IPS order
    startup_s: float

    @property
    def address(self) -> str:
        return str(self.cluster.address)


@pytest.fixture(scope="module")
def cluster(s3: S3) -> Iterator[LocalCluster]:
    """Head + two 2-CPU, 2-GPU workers; started after `s3` so every node has the AWS variables."""
    from ray.cluster_utils import Cluster

    start = time.monotonic()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    workers = [c.add_node(num_cpus=2, num_gpus=2, node_ip_address=ip) for ip in WORKER_IPS]
    c.wait_for_nodes()
    yield LocalCluster(c, workers, time.monotonic() - start)
    c.shutdown()


def _spec(tmp_path: Path, *, iterations: int, eval_interval: int, grace: int, num_samples: int) -> Path:
    """parity-smoke's model with half a GPU per trial and this test's budget."""
    source = load_spec("parity-smoke").source
    spec = tmp_path / "cluster.toml"
    spec.write_text(
        source.replace("iterations = 60", f"iterations = {iterations}")
        .replace("eval_interval = 10", f"eval_interval = {eval_interval}")
        .replace("grace_period = 10", f"grace_period = {grace}")
        .replace("num_samples = 6", f"num_samples = {num_samples}")
        .replace("max_concurrent = 2", "max_concurrent = 4")
        .replace("gpu = 0\n", "gpu = 0.5\n")
    )
    return spec


def _read(s3: S3, uri: str) -> pd.DataFrame:
    """A Parquet dataset on S3 read with pandas, as a user would (see docs/cluster.md)."""
    return pd.read_parquet(uri.removeprefix("s3://"), filesystem=s3.fs())


@pytest.mark.parametrize("join", ["--address ADDRESS", "--address auto", "RAY_ADDRESS"])
def test_local_storage_is_refused_on_a_multi_node_cluster(
    join: str, cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each way of joining the cluster finds its 3 nodes, and a local --storage is refused."""
    local = tmp_path / "results"
    args = ["run", "parity-smoke", "--storage", str(local)]
    if join == "RAY_ADDRESS":
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    else:
        args += ["--address", cluster.address if join.endswith("ADDRESS") else "auto"]
    if join == "--address auto":
        # `auto` joins the instance this machine's Ray last started, named in
        # $RAY_TMPDIR/ray/ray_current_cluster (/tmp/ray/... by default). The other test processes
        # start Ray instances of their own, each rewriting /tmp's file (the driver met a 1-node
        # instance: seen in CI, then in a fresh-clone run here), so this driver reads a file of its own
        from ray._private.utils import write_ray_address

        ray_tmp = tmp_path / "ray-tmp"
        (ray_tmp / "ray").mkdir(parents=True)
        write_ray_address(cluster.address, str(ray_tmp / "ray"))
        monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))
    done = cli(*args)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "3 nodes" in lines[0] and "s3://" in lines[0] and "file://" in lines[0]
    assert not local.exists()  # refused before anything was written


def test_trials_spread_over_worker_nodes_and_land_in_s3(
    cluster: LocalCluster, s3: S3, tmp_path: Path
) -> None:
    bucket = s3.bucket()
    storage = f"{bucket}/ponder"
    spec = _spec(tmp_path, iterations=400, eval_interval=50, grace=100, num_samples=4)
    done = cli("run", str(spec), "--name", "spread", "--address", cluster.address, "--storage", storage)
    assert done.returncode == 0, done.stderr[-3000:]

    df = _read(s3, f"{storage}/trials/study=spread")
    assert len(df) == 4 and set(df["status"]) <= FINAL
    h = _read(s3, f"{storage}/history/study=spread")
    assert set(h["node_ip"]) == set(WORKER_IPS)  # both workers trained; the CPU-only head none
    assert h["node_id"].nunique() == 2
    assert (df["nodes"] == 1).all() and (df["retries"] == 0).all()
    assert df["gpu_ids"].isin(["0", "1"]).all()  # a GPU Tune assigned; torch sees none: CPU
    assert (df["device"] == "cpu").all()
    objects = set(s3.files(storage))
    for path in df["checkpoint_path"]:  # a URI, and the weights are there
        assert path.startswith(f"{storage}/tune/spread/")
        assert f"{path.removeprefix('s3://')}/trainer.pt" in objects
    # each trial's earlier checkpoints were emptied as it ended, each left with a note
    for trial_id, kept, reports in df[["trial_id", "checkpoint_path", "reports"]].itertuples(index=False):
        trial_dir = kept.removeprefix("s3://").rsplit("/", 1)[0]
        mine = [o for o in objects if o.startswith(f"{trial_dir}/checkpoint_")]
        assert [o for o in mine if o.endswith("/trainer.pt")] == [f"{kept.removeprefix('s3://')}/trainer.pt"]
        assert sum(o.endswith(f"/{EMPTIED_NOTE}") for o in mine) == reports - 1, trial_id

    # the Optuna journal is copied next to the study: a resume elsewhere has the search history
    journal = tmp_path / "optuna.journal"
    journal.write_bytes(s3.fs().open_input_stream(f"{storage[5:]}/studies/spread/optuna.journal").readall())
    study = optuna.load_study(
        study_name="spread",
        storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal))),
    )
    assert [t.state for t in study.trials].count(optuna.trial.TrialState.COMPLETE) == 4

    status = cli("status", "spread", "--storage", storage)
    assert status.returncode == 0 and "4 trials" in status.stdout, status.stderr
    listing = cli("list", "--storage", storage)
    assert listing.returncode == 0 and "spread" in listing.stdout.split("studies under", 1)[1]


def test_a_lost_node_costs_only_the_work_since_the_last_checkpoint(
    cluster: LocalCluster, s3: S3, tmp_path: Path
) -> None:
    bucket = s3.bucket()
    storage = f"{bucket}/ponder"
    budget, every = 800, 100
    spec = _spec(tmp_path, iterations=budget, eval_interval=every, grace=budget, num_samples=4)
    run = Driver(
        "run", str(spec), "--name", "lost", "--address", cluster.address, "--storage", storage, "--quiet",
        log=tmp_path / "driver.log",
    )  # fmt: skip
    tune_dir = f"{storage}/tune/lost/".removeprefix("s3://")

    def every_trial_checkpointed() -> bool:  # 4 trials on 2 CPUs a node: two run on each worker
        # two checkpoints each: the last one in S3 may still be in flight to the driver when the
        # node dies (Tune then restarts from the one before), the first is registered by then
        files = s3.files(f"{storage}/tune/lost")
        checkpoints = Counter(
            f.removeprefix(tune_dir).split("/")[0] for f in files if f.endswith("/trainer.pt")
        )
        return len(checkpoints) == 4 and min(checkpoints.values()) >= 2

    try:
        run.wait_until(every_trial_checkpointed, timeout=240)
        lost = cluster.workers[1]
        cluster.cluster.remove_node(lost)  # a spot instance reclaimed, with its two trials
        assert run.finish(timeout=480) == 0, run.output()[-3000:]
    finally:
        if run.proc.poll() is None:
            run.kill()
        if cluster.workers[1] not in cluster.cluster.list_all_nodes():  # the next tests' cluster has two
            worker = cluster.cluster.add_node(num_cpus=2, num_gpus=2, node_ip_address=WORKER_IPS[1])
            cluster.workers[1] = worker
            cluster.cluster.wait_for_nodes()

    df = _read(s3, f"{storage}/trials/study=lost").set_index("trial_id")
    assert len(df) == 4
    assert (df["status"] == "completed").all(), df[["status", "error"]]  # none errored
    assert (df["iteration"] == budget).all()
    moved = df[df["retries"] >= 1]
    assert len(moved) >= 1  # the lost node's trials were retried ...
    assert (moved["nodes"] == 2).all() and (moved["node_ip"] == WORKER_IPS[0]).all()  # ... on the survivor
    h = _read(s3, f"{storage}/history/study=lost")
    for trial_id in moved.index:
        rows = h[h["trial_id"] == trial_id].sort_values("report")
        assert list(rows["iteration"]) == list(range(every, budget + 1, every))  # one row per report
        assert rows["node_ip"].iloc[0] == WORKER_IPS[1] and rows["node_ip"].iloc[-1] == WORKER_IPS[0]
        # Tune's own log of the trial: the retry went on from a checkpoint, it did not start over
        result = next(
            f for f in s3.files(f"{storage}/tune/lost") if f"_{trial_id}_" in f and f.endswith("/result.json")
        )
        lines = [json.loads(x) for x in s3.fs().open_input_stream(result).readall().splitlines()]
        restart = next(
            i for i, x in enumerate(lines) if x["iterations_since_restore"] < x["training_iteration"]
        )
        before, after = [x["iteration"] for x in lines[:restart]], [x["iteration"] for x in lines[restart:]]
        assert before == sorted(set(before)) and after == sorted(set(after)), (before, after)
        assert after[0] > every  # it went on from a checkpoint, it did not start over;
        # at most the report in flight when the node died is made again: Tune may restart from
        # the checkpoint before it (seen once: 100, 200, 300, then 300 again from 200's)
        assert after[0] >= before[-1], (before, after)
    print(f"\ncluster start-up {cluster.startup_s:.1f} s; retries {moved['retries'].tolist()}")


def _actor_nodes(address: str, class_name: str) -> set[str]:
    """The node ids of the live actors of ``class_name`` on the cluster (read from its GCS by a
    short-lived driver of its own, so this test process never joins the cluster)."""
    script = (
        "import json, sys, ray; from ray._private import state\n"
        f"ray.init(address={address!r}, include_dashboard=False, log_to_driver=False)\n"
        "print(json.dumps([a['Address']['NodeID'] for a in state.actors().values()"
        f" if a['ActorClassName'] == {class_name!r} and a['State'] == 'ALIVE']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_fused_trials_train_one_group_per_node_and_gpu_and_survive_a_lost_node(
    cluster: LocalCluster, s3: S3, tmp_path: Path
) -> None:
    """``fuse = 2`` on the two GPU workers: each trial reserves half a group's CPUs and GPU, so a
    worker's 2 CPUs hold 2 trials and the 8 trials wanted at once need both workers; each node and
    GPU trains its trials as one group (never a group across two), and every trial is still its
    own row, reports and checkpoint, on S3. The fusers' registry lives on the driver's node (the
    head), so when a worker is removed mid-study (the registry's, if Ray had put it on one) only
    that worker's trials move, from their checkpoints, and the study finishes whole."""
    bucket = s3.bucket()
    storage = f"{bucket}/ponder"
    every = 50
    spec = _spec(tmp_path, iterations=300, eval_interval=every, grace=100, num_samples=8)
    spec.write_text(
        spec.read_text()
        .replace("gpu = 0.5\n", "gpu = 1\nfuse = 2\n")
        .replace("cpu = 1\n", "cpu = 2\n")
        .replace("max_concurrent = 4", "max_concurrent = 8")
    )
    run = Driver(
        "run",
        str(spec),
        "--name",
        "fused",
        "--address",
        cluster.address,
        "--storage",
        storage,
        log=tmp_path / "driver.log",
    )  # fmt: skip  (the progress table on, as a user runs it)
    tune_dir = f"{storage}/tune/fused/".removeprefix("s3://")
    worker_ids = {w.node_id: w for w in cluster.workers}

    def both_workers_checkpointed() -> bool:  # a trial on each worker has a checkpoint to go on from
        files = s3.files(f"{storage}/tune/fused")
        trials = {f.removeprefix(tune_dir).split("/")[0] for f in files if f.endswith("/trainer.pt")}
        return len(trials) >= 4

    try:
        run.wait_until(both_workers_checkpointed, timeout=240)
        registry = _actor_nodes(cluster.address, "FuserRegistry")
        assert registry == {cluster.cluster.head_node.node_id}, (registry, list(worker_ids))
        # the worker to lose: the registry's, had it been on one; else the second
        lost = next((worker_ids[n] for n in registry if n in worker_ids), cluster.workers[1])
        cluster.cluster.remove_node(lost)
        assert run.finish(timeout=480) == 0, run.output()[-3000:]
    finally:
        if run.proc.poll() is None:
            run.kill()
        for i, worker in enumerate(cluster.workers):  # the module's cluster keeps two workers
            if worker not in cluster.cluster.list_all_nodes():
                cluster.workers[i] = cluster.cluster.add_node(
                    num_cpus=2, num_gpus=2, node_ip_address=WORKER_IPS[i]
                )
        cluster.cluster.wait_for_nodes()

    df = _read(s3, f"{storage}/trials/study=fused")
    assert len(df) == 8 and df["trial_id"].is_unique and set(df["status"]) <= FINAL, df[["status", "error"]]
    assert (df["device"] == "cpu").all() and df["gpu_ids"].isin(["0", "1"]).all()
    assert (df["retries"] >= 1).any()  # the lost worker's trials were retried elsewhere
    h = _read(s3, f"{storage}/history/study=fused")
    for trial_id, rows in h.groupby("trial_id"):  # every report once, none missing
        last = int(df.set_index("trial_id").at[trial_id, "iteration"])
        assert sorted(rows["iteration"]) == list(range(every, last + 1, every)), trial_id
    where: dict[str, set[tuple[str, str]]] = {}  # fused group -> the (node, GPU) of its reports
    members = 0
    paths = StudyPaths(storage, "fused")
    for trial_id in ended_trial_ids(paths):  # the reports each trial's end record keeps
        for report in read_reports(paths, trial_id):
            where.setdefault(report["fuse_group"], set()).add((report["node_id"], report["gpu_ids"]))
            members = max(members, report["fuse_members"])
    assert all(len(places) == 1 for places in where.values()), where  # a group is one node's GPU
    assert len({node for places in where.values() for node, _ in places}) == 2  # both workers trained
    assert members >= 2  # trials were trained together

    journal = tmp_path / "optuna.journal"
    journal.write_bytes(s3.fs().open_input_stream(f"{storage[5:]}/studies/fused/optuna.journal").readall())
    study = optuna.load_study(
        study_name="fused",
        storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal))),
    )
    states = Counter(t.state for t in study.trials)
    assert states[optuna.trial.TrialState.RUNNING] == 0 and sum(states.values()) == 8, states
