"""One driver per study: the lease on a local disk and on S3 (moto), and two real drivers at once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from study.run.lease import LeaseHeld, hold_lease
from study.search.journal import optuna_storage
from study.storage.storage import StudyPaths, read_bytes
from tests.study.conftest import REPO, S3, Driver, cli, smoke_spec, trials

HOLD = textwrap.dedent(
    """
    import sys, time
    from study.run.lease import hold_lease
    from study.storage.storage import StudyPaths
    with hold_lease(StudyPaths(sys.argv[1], "s"), "run", ttl_s=float(sys.argv[2])):
        print("held", flush=True)
        time.sleep(600)
    """
)


def _holder(root: str, ttl_s: float = 30.0) -> subprocess.Popen[str]:
    """Another process holding study ``s``'s lease under ``root`` until it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, root, str(ttl_s)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held", proc.stderr.read() if proc.stderr else ""
    return proc


def _refused(paths: StudyPaths, pid: int) -> str:
    with pytest.raises(LeaseHeld) as e, hold_lease(paths, "resume"):
        pass
    message = str(e.value)
    assert f"pid {pid} on host {socket.gethostname()}" in message, message
    assert "\n" not in message
    return message


def test_a_local_lease_refuses_a_second_driver_and_frees_at_a_sigkill(tmp_path: Path) -> None:
    paths = StudyPaths(str(tmp_path), "s")
    holder = _holder(str(tmp_path))
    try:
        message = _refused(paths, holder.pid)
        assert "`run`" in message and " s)" in message  # who holds it, for how long
        assert json.loads(read_bytes(paths.lease) or b"{}")["pid"] == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the kernel dropped the dead holder's lock: the next driver gets it at once, whatever the file says
    assert json.loads(read_bytes(paths.lease) or b"{}")["pid"] == holder.pid
    with hold_lease(paths, "resume") as lease:
        assert json.loads(read_bytes(paths.lease) or b"{}")["uuid"] == lease.uuid
    assert read_bytes(paths.lease) is None  # released


def test_a_refused_twin_run_is_told_to_follow_or_resume_the_study(tmp_path: Path) -> None:
    """A second `run` of one name must not be told to run again (the name is the first one's
    study by then: "already exists"): it is told the `status` and `resume` of that study. A
    refused `resume` is still told to run itself again."""
    paths = StudyPaths(str(tmp_path), "twin")
    with hold_lease(paths, "run"):  # flock: a second open file of this process conflicts too
        with pytest.raises(LeaseHeld) as run, hold_lease(paths, "run"):
            pass
        with pytest.raises(LeaseHeld) as resume, hold_lease(paths, "resume"):
            pass
    message = str(run.value)
    assert "\n" not in message and "run this again" not in message, message
    assert f"`ponder-study resume twin --storage {tmp_path}`" in message, message
    assert f"`ponder-study status twin --storage {tmp_path}`" in message, message
    assert str(resume.value).endswith("stop it (Ctrl-C) and run this again"), resume.value


def test_a_refused_run_of_a_new_name_leaves_no_folder(tmp_path: Path) -> None:
    """A lease taken for a name that never got a study (the run stopped before writing its spec)
    leaves nothing behind."""
    paths = StudyPaths(str(tmp_path / "results"), "new")
    with hold_lease(paths, "run"):
        assert Path(paths.study_dir).is_dir()
    assert list(tmp_path.iterdir()) == []  # not even the storage root it had to make


@pytest.mark.slow
def test_an_s3_lease_is_conditional_renewed_and_taken_over_when_stale(s3: S3) -> None:
    root = s3.bucket()
    paths = StudyPaths(root, "s")
    holder = _holder(root, ttl_s=3.0)
    try:
        _refused(paths, holder.pid)
        time.sleep(4.0)  # renewed every second: still held past its TTL
        _refused(paths, holder.pid)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # a dead holder on this host is taken over at once (its pid is gone)
    with hold_lease(paths, "resume") as lease:
        assert json.loads(read_bytes(paths.lease) or b"{}")["uuid"] == lease.uuid
    assert read_bytes(paths.lease) is None
    # a holder on another host that stopped renewing: refused until its TTL passes, then taken over
    other = {"uuid": "x", "host": "elsewhere", "pid": 1, "command": "run", "acquired_at": 0, "ttl_s": 2.0}
    with s3.fs().open_output_stream(paths.lease.removeprefix("s3://")) as f:
        f.write(json.dumps(other).encode())
    with pytest.raises(LeaseHeld, match="host elsewhere"), hold_lease(paths, "resume"):
        pass
    time.sleep(3.0)
    with hold_lease(paths, "resume") as lease:
        assert json.loads(read_bytes(paths.lease) or b"{}")["uuid"] == lease.uuid


@pytest.mark.slow
def test_a_driver_whose_s3_lease_was_taken_over_stops_at_once(s3: S3) -> None:
    """A driver suspended (Ctrl-Z) past its lease's TTL, and a resume meanwhile took the study
    over: when it runs again, its next renewal is refused, and it ends at once, exit 1, one line
    naming the new holder (it went on before, and two drivers wrote one study)."""
    root = s3.bucket()
    paths = StudyPaths(root, "s")
    holder = _holder(root, ttl_s=1.5)
    try:
        holder.send_signal(signal.SIGSTOP)  # Ctrl-Z
        time.sleep(3.0)  # past its TTL by the store's clock, which counts whole seconds
        with hold_lease(paths, "resume") as lease:
            holder.send_signal(signal.SIGCONT)  # `fg`: it renews within a third of its TTL
            assert holder.wait(timeout=10) == 1
            assert json.loads(read_bytes(paths.lease) or b"{}")["uuid"] == lease.uuid  # untouched
    finally:
        holder.kill()
    assert holder.stderr is not None
    err = holder.stderr.read()
    assert err.count("\n") == 1, err
    assert f"study 's' was taken over by `resume` (pid {os.getpid()} on host " in err, err
    assert "this driver stopped, writing nothing more" in err, err


@pytest.mark.slow
def test_a_renewal_whose_answer_was_lost_keeps_the_lease(s3: S3) -> None:
    """A renewal can reach the store and its answer be lost (a timeout): the lease's ETag then
    changed under the driver, and its next renewal is refused. The lease still names this driver,
    so it keeps it and goes on renewing, never stopping a healthy study as taken over."""
    root = s3.bucket()
    paths = StudyPaths(root, "s")
    holder = _holder(root, ttl_s=1.5)
    try:
        mine = read_bytes(paths.lease)
        assert mine is not None
        with s3.fs().open_output_stream(paths.lease.removeprefix("s3://")) as f:
            f.write(mine)  # the same lease, a new ETag, as that lost renewal leaves it
        info = s3.fs().get_file_info(paths.lease.removeprefix("s3://"))
        time.sleep(2.5)  # renewals every 0.5 s: the first refused, the next ones made
        assert holder.poll() is None, holder.stderr.read() if holder.stderr else ""
        assert read_bytes(paths.lease) == mine
        assert s3.fs().get_file_info(paths.lease.removeprefix("s3://")).mtime > info.mtime  # renewed
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_two_drivers_of_one_study_at_once_one_is_refused(
    driver: Callable[..., Driver], tmp_path: Path
) -> None:
    """Two `run` of one name started together (issue 10: both ran to the end, the journal held
    twice the trials): one is refused in one line before Ray starts, exit 2; the study has
    exactly its trials. While it runs, `resume` and `export` of it are refused the same way."""
    spec = smoke_spec(tmp_path, at_once=1)
    args = ("run", spec, "--name", "same", "--num-samples", "3", "--storage", str(tmp_path))
    first, second = driver(*args), driver(*args)
    refused = None
    deadline = time.monotonic() + 60
    while refused is None and time.monotonic() < deadline:
        for d in (first, second):
            if d.proc.poll() is not None:
                refused = d
        time.sleep(0.05)
    assert refused is not None, "neither driver was refused"
    winner = second if refused is first else first
    assert refused.finish() == 2, refused.output()
    lines = refused.output().strip().splitlines()
    assert len(lines) == 1 and "is in use by `run` (pid" in lines[0], lines
    assert str(winner.proc.pid) in lines[0]
    for verb in ("resume", "export"):
        if winner.proc.poll() is None:
            done = cli(verb, "same", "--storage", str(tmp_path))
            if winner.proc.poll() is not None:  # it finished meanwhile: nothing held to refuse
                break
            assert done.returncode == 2, done.stdout + done.stderr
            assert done.stderr.count("\n") == 1 and "is in use by `run`" in done.stderr, done.stderr
    assert winner.finish() == 0, winner.output()[-3000:]
    assert len(trials(tmp_path, "same")) == 3
    study = optuna.load_study(study_name="same", storage=optuna_storage(StudyPaths(str(tmp_path), "same")))
    assert len(study.trials) == 3
    assert len([p for p in (tmp_path / "tune" / "same").iterdir() if p.is_dir()]) == 3
