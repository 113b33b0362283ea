"""``ponder-study submit``: a study sent to a Ray cluster's job server, as on a cluster a user
started with ``ray start`` (not from cluster.yaml).

The cluster is two real nodes started by ``ray start`` (a head with no CPUs that serves jobs, a
worker on 127.0.0.2), with token authentication on and none of moto's AWS variables: the job
reaches the study's S3 storage only through what ``submit`` carries from the test's shell.
The head's job server needs ``ray[default]``'s packages, which ``make jobserver`` puts in
``.venv/jobserver`` for this test alone (the project's own Ray stays minimal).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import pandas as pd
import pytest

from study.launchers.submit import STOP_ENV, JobServer, SubmitError, job_outcome, job_request, server_address
from study.records.records import END_OUTCOMES, read_end_records
from study.storage.storage import StudyPaths, read_study_table
from tests.study.conftest import REPO, S3, cli, free_port, processes_naming, smoke_spec

JOBSERVER = REPO / ".venv" / "jobserver"
_WRONG = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}
RAY = REPO / ".venv" / "bin" / "ray"


# -- what a submission carries, without a cluster ------------------------------------------------
def test_a_job_runs_the_command_by_its_path_and_carries_the_storage_settings(tmp_path: Path) -> None:
    spec = tmp_path / "mine.toml"
    spec.write_text("")
    environ = {
        "AWS_ENDPOINT_URL": "http://s3.lab:9000",
        "AWS_SECRET_ACCESS_KEY": "k",
        "MINE": "1",
        "HOME": "/h",
    }
    with contextlib.chdir(tmp_path):
        request = job_request(
            "run",
            ["mine.toml", "--storage", "s3://b/p"],
            python="/v/bin/python",
            extra_env=["MINE"],
            environ=environ,
        )
    assert request.entrypoint == f"/v/bin/python -m study run {spec} --storage s3://b/p --address auto"
    assert request.carried == ("AWS_ENDPOINT_URL", "AWS_SECRET_ACCESS_KEY", "MINE")  # names only: HOME is not
    assert request.runtime_env == {"env_vars": {**STOP_ENV, **{k: environ[k] for k in request.carried}}}
    shipped = job_request(
        "resume", ["s", "--address", "auto"], environ={"PONDER_STUDY_STORAGE": "file:///nfs/r"}
    )
    assert shipped.entrypoint.endswith("-m study resume s --address auto")  # not twice
    assert shipped.carried == ("PONDER_STUDY_STORAGE",)


@pytest.mark.parametrize(
    ("words", "environ", "says"),
    [
        (["parity"], {}, "needs storage every node reaches"),
        (["parity", "--storage", "results"], {}, "is a path on this machine"),
        (["parity"], {"PONDER_STUDY_STORAGE": "/home/me/results"}, "is a path on this machine"),
        (["missing.toml", "--storage", "s3://b"], {}, "missing.toml is not a file here"),
    ],
)
def test_a_job_the_cluster_could_not_run_is_refused_here(
    words: list[str], environ: dict[str, str], says: str, tmp_path: Path
) -> None:
    with contextlib.chdir(tmp_path), pytest.raises(SubmitError, match=says):
        job_request("run", words, environ=environ)
    with pytest.raises(SubmitError, match="--env NOPE: it is not set"):
        job_request("run", ["parity", "--storage", "s3://b"], extra_env=["NOPE"], environ={})


def test_the_job_server_and_the_exit_code_are_found_as_ray_job_finds_them() -> None:
    assert server_address(None, {"RAY_API_SERVER_ADDRESS": "h:8265", "RAY_ADDRESS": "x"}) == "http://h:8265"
    assert server_address("https://h", {}) == "https://h"
    with pytest.raises(SubmitError, match="--address http://HEAD:8265"):
        server_address(None, {})
    assert [
        job_outcome(s, c) for s, c in [("SUCCEEDED", 0), ("STOPPED", None), ("FAILED", 2), ("FAILED", None)]
    ] == [
        0,
        130,
        2,
        1,
    ]


def test_no_job_server_is_one_line_naming_the_address() -> None:
    port = free_port()  # nothing listens there
    done = cli("submit", "--address", f"127.0.0.1:{port}", "run", "parity", "--storage", "s3://b/p")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no Ray job server at http://127.0.0.1:{port}" in lines[0], done.stderr


# -- a real two-node cluster and its job server --------------------------------------------------
@dataclass
class RayStarted:
    server: str  # http://127.0.0.1:PORT
    env: dict[str, str]  # what the user's shell needs to reach it (its token)
    marker: str  # in the command line of every process of this cluster


@pytest.fixture(scope="module")
def ray_started() -> Iterator[RayStarted]:
    if not (JOBSERVER / "aiohttp").is_dir():
        pytest.skip(
            f"no {JOBSERVER.relative_to(REPO)} for the head's job server: `make jobserver` installs it"
        )
    where = Path(tempfile.mkdtemp(prefix="rs-"))  # short: Ray's socket paths must fit in 107 bytes
    token = secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PONDER_STUDY_", "RAY_"))}
    env.update(PYTHONPATH=str(JOBSERVER), RAY_TMPDIR=str(where), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    port, dashboard = free_port(), free_port()
    head = [f"--port={port}", "--num-cpus=0", "--include-dashboard=true", f"--dashboard-port={dashboard}"]
    started = RayStarted(
        f"http://127.0.0.1:{dashboard}", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}, str(where)
    )
    try:
        for args in (
            ["--head", *head, "--dashboard-host=127.0.0.1", "--node-ip-address=127.0.0.1"],
            [f"--address=127.0.0.1:{port}", "--num-cpus=2", "--node-ip-address=127.0.0.2"],
        ):
            done = subprocess.run(
                [str(RAY), "start", *args, "--disable-usage-stats"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr[-3000:]
        yield started
    finally:  # by pid: `ray stop` would stop every Ray on the machine, the other tests' too
        for pid in processes_naming(started.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(where, ignore_errors=True)


def _trials(storage: str, name: str) -> pd.DataFrame | None:
    table = read_study_table(StudyPaths(storage, name), "trials")
    return None if table is None else table.to_pandas()


@pytest.mark.slow
def test_a_submitted_study_stops_with_ray_job_stop_and_a_second_submission_finishes_it(
    ray_started: RayStarted, s3: S3, tmp_path: Path
) -> None:
    """The job carries the S3 settings the nodes lack; `ray job stop` (here its REST call) is a
    Ctrl-C whose resume line reaches the job's log; `submit --wait resume` from another machine
    (none of the first one's local files) finishes the study from the bucket, exiting as the job
    did; every trial once, trained on the worker node."""
    storage = f"{s3.bucket()}/ponder"
    spec = smoke_spec(tmp_path, times=3)
    for auth, says in (
        ({"RAY_AUTH_MODE": ""}, "export RAY_AUTH_MODE=token"),
        (_WRONG, "refused the token sent"),
    ):
        refused = cli("submit", "--address", ray_started.server, "run", spec, "--storage", storage, env=auth)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr  # no token, a wrong one
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr

    def submit(*args: str, machine: str) -> subprocess.CompletedProcess[str]:
        """From a machine of its own: its journal cache, carried to the job, is not the other's."""
        env = {**ray_started.env, "PONDER_STUDY_CACHE": str(tmp_path / machine)}
        return cli("submit", "--address", ray_started.server, "--env", "PONDER_STUDY_CACHE", *args, env=env)

    first = submit("run", spec, "--storage", storage, machine="first")
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.split("job ", 1)[1].split()[0]
    assert (
        "carried from this shell: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY" in first.stdout
    )
    server = JobServer(ray_started.server, ray_started.env)
    deadline = time.monotonic() + 240
    # a trial's end is its end record, at once (the Parquet follows on its refresh budget, by when
    # a loaded machine may have run the whole study)
    while not read_end_records(StudyPaths(storage, "parity-smoke")):
        assert time.monotonic() < deadline and server.info(job_id)["status"] in ("PENDING", "RUNNING"), (
            server.logs(job_id)[-3000:]
        )
        time.sleep(0.5)
    assert server.stop(job_id)
    while (info := server.info(job_id))["status"] not in ("STOPPED", "FAILED", "SUCCEEDED"):
        time.sleep(0.5)
    log = server.logs(job_id)
    assert info["status"] == "STOPPED", log[-3000:]
    assert info["runtime_env"]["env_vars"]["AWS_ENDPOINT_URL"] == s3.endpoint
    assert log.strip().splitlines()[-1].startswith("ponder-study: ") and "resume parity-smoke" in log, log[
        -3000:
    ]
    before = _trials(storage, "parity-smoke")
    assert before is not None
    ended = before[before["status"].isin(END_OUTCOMES)].set_index("trial_id")

    second = submit("--wait", "resume", "parity-smoke", "--storage", storage, machine="another")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr
    assert "study parity-smoke: 6 trials" in second.stdout and "succeeded (exit 0)" in second.stderr
    after = _trials(storage, "parity-smoke")
    assert after is not None and len(after) == 6 and after["trial_id"].is_unique
    assert after["status"].isin(END_OUTCOMES).all(), after[["trial_id", "status"]]
    after = after.set_index("trial_id")
    assert after.loc[ended.index, "reports"].equals(ended["reports"])  # not trained again
    journal = tmp_path / "another" / storage.replace("://", "/") / "parity-smoke" / "optuna.journal"
    study = optuna.load_study(
        study_name="parity-smoke",
        storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal))),
    )  # the resume's own copy of the search, from the bucket alone
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 6
    history = read_study_table(StudyPaths(storage, "parity-smoke"), "history")
    assert history is not None and set(history.column("node_ip").to_pylist()) == {"127.0.0.2"}
