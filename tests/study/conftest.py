"""Helpers for the study tests: the real CLI in a subprocess, its Parquet read back with pandas."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.fs as pafs
import pytest

from study.records.records import EndRecord, ended_trial_ids
from study.spec.spec import load_spec, parse_spec
from study.storage.storage import StudyPaths, read_table

CLI = [sys.executable, "-m", "study"]
REPO = Path(__file__).resolve().parents[2]

# Ray runs its workers at niceness 15, so that its own daemons stay responsive. The suite runs on
# two processes (`make test`): beside a test that trains in its own process at niceness 0, a Ray
# test's trials, fusers and registry got a few percent of a core and its study timed out. Every
# Ray instance and driver the tests start reads this, so Ray's workers compete as equals here.
os.environ.setdefault("RAY_worker_niceness", "0")


# -- one Ray instance for the drivers of a test process ------------------------------------------
# Starting a local Ray instance (GCS, raylet, two agents, prestarted workers) costs a driver about
# 5 s and more CPU than the smoke study's training. `run` and `resume` drivers of the tests join
# one instance per test process instead, as drivers join a cluster (`RAY_ADDRESS`), and each
# test keeps its own storage and study name. Tests of what a driver's *own* instance does (its
# processes stop with it, signals while it starts, the kill campaign's process-group kills) and
# tests whose trials read the test's environment (moto's AWS variables, the fault drill) pass
# `own_ray=True`. A caller's own `RAY_ADDRESS` always wins (`make test-fast` sets an unusable one).
_SHARED_RAY = """
import os, sys, time, ray
ray.init(
    address="local", include_dashboard=False, log_to_driver=False, num_cpus=2,
    _system_config={"prestart_worker_first_driver": False},  # as the CLI's own instance (runner)
)
print(ray.get_runtime_context().gcs_address, flush=True)
while os.getppid() == int(sys.argv[1]):  # ends with the test process, however that ends
    time.sleep(1)
"""
"""(Without the prestart setting this instance starts a worker per CPU for its own driver, which
no study uses: a smoke study joined to it started two workers of its own, and the two ``ray::IDLE``
ones, about 4 s of CPU each to start and 1 % of a core each while they waited, went when those
came. Seen here, in every test process.)"""
_TOKEN_AUTH = {"RAY_AUTH_MODE": "token"}
"""Ray's token authentication (the token in ~/.ray/auth_token), which a driver joining by an
explicit address only uses when told to, as users joining a local cluster are."""
_shared_ray: tuple[subprocess.Popen[str], str] | None = None


def shared_ray() -> str:
    """The address of this test process's Ray instance, started on first use."""
    global _shared_ray
    if _shared_ray is not None and (code := _shared_ray[0].poll()) is not None:
        # a test stopped it (seen: a process sweep over this process's children): say so here,
        # not as a driver's 300-s wait for a GCS that is gone
        pytest.fail(f"the tests' shared Ray instance was stopped by an earlier test (exit {code})")
    if _shared_ray is None:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SHARED_RAY, str(os.getpid())],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # stopped whole at the end of the session
            env={**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **_TOKEN_AUTH},
        )
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address, f"the tests' Ray instance did not start (exit {proc.wait()})"
        _shared_ray = proc, address
    return _shared_ray[1]


def stop_shared_ray() -> None:
    global _shared_ray
    if _shared_ray is not None:
        proc, _ = _shared_ray
        _shared_ray = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.fixture(scope="session", autouse=True)
def _stop_the_shared_ray_at_the_end() -> Iterator[None]:
    yield
    stop_shared_ray()


def driver_env(
    args: Sequence[str], env: Mapping[str, str] | None = None, own_ray: bool = False
) -> dict[str, str]:
    """The environment of a ``ponder-study ARGS`` subprocess: the test's, with ``env`` over it,
    joined to the shared Ray instance when it is a `run` or `resume` that may join one."""
    full = {**os.environ, **(env or {})}
    joins = bool(args) and args[0] in ("run", "resume") and "--address" not in args and "--help" not in args
    if joins and not own_ray and "RAY_ADDRESS" not in full:
        full.update(RAY_ADDRESS=shared_ray(), **_TOKEN_AUTH)
    return full


def cli(
    *args: str,
    timeout: float = 300,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
    own_ray: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``ponder-study ARGS`` to the end (in ``cwd``, the repository by default)."""
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=driver_env(args, env, own_ray),
    )


class Driver:
    """``ponder-study ARGS`` running in its own process group, as in a terminal."""

    def __init__(
        self,
        *args: str,
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path = REPO,
        own_ray: bool = False,
    ) -> None:
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            [*CLI, *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            env=driver_env(args, env, own_ray),
        )

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 240, poll: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"driver exited ({self.proc.returncode}) first:\n{self.log.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting:\n{self.log.read_text()[-3000:]}")
            time.sleep(poll)

    def interrupt(self, timeout: float = 120) -> int:
        """Ctrl-C: SIGINT to the driver; returns its exit code."""
        self.proc.send_signal(signal.SIGINT)
        return self.finish(timeout)

    def kill(self) -> None:
        """A killed terminal: SIGKILL to the driver and everything it started."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._out.close()

    def finish(self, timeout: float = 300) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired as e:
            tail = self.log.read_text()[-3000:]
            raise AssertionError(f"driver still running after {timeout} s:\n{tail}") from e
        finally:
            self._out.close()
        return rc

    def output(self) -> str:
        return self.log.read_text()


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    started: list[Driver] = []

    def start(
        *args: str, env: dict[str, str] | None = None, cwd: Path = REPO, own_ray: bool = False
    ) -> Driver:
        d = Driver(*args, log=tmp_path / f"driver-{len(started)}.log", env=env, cwd=cwd, own_ray=own_ray)
        started.append(d)
        return d

    yield start
    for d in started:  # never leave a study running behind a failed test
        if d.proc.poll() is None:
            os.killpg(d.proc.pid, signal.SIGKILL)
            d.proc.wait(30)


def ledger_has(storage: Path, name: str, how: str) -> Callable[[], bool]:
    """True the instant the study's end records hold a trial that ended ``how``: ``"completed"``
    (it reached its budget) or ``"stopped"`` (ASHA stopped it). A record is written the moment
    a trial ends, before the Parquet is rewritten and before Tune saves its state."""
    ended = Path(StudyPaths(str(storage), name).ended_dir)
    outcome = {"completed": "completed", "stopped": "early_stopped"}[how]

    def check() -> bool:
        try:
            for path in ended.glob("*.json"):
                if EndRecord.from_json(path.read_bytes()).outcome == outcome:
                    return True
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return False
        return False

    return check


def trials(storage: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(storage / "trials" / f"study={name}")


def history(storage: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(storage / "history" / f"study={name}")


def read_live(uri: str) -> pd.DataFrame | None:
    """A Parquet file a running study may be rewriting, read whole in one go (None if absent).

    The study replaces it atomically, but ``pd.read_parquet(path)`` opens a file twice (footer,
    then pages): a replacement in between reads one file's footer against the other's pages."""
    table = read_table(uri)
    return None if table is None else table.to_pandas()


def finished(storage: Path, name: str, at_least: int) -> Callable[[], bool]:
    """True once ``at_least`` of the study's trials have ended (their end records: the Parquet
    shows them at its next refresh)."""

    def check() -> bool:
        return len(ended_trial_ids(StudyPaths(str(storage), name))) >= at_least

    return check


def smoke_source(times: int = 1, at_once: int = 2, fuse: int = 1) -> str:
    """The text of ``parity-smoke`` with trials ``times`` longer (rungs to match), ``at_once``
    trials at a time (the shipped spec's 2 by default) and, with ``fuse`` above 1, trained in
    fused groups of ``fuse`` on the machine's two CPUs.

    ``times``: for a Ctrl-C after some trials ended, which the smoke study's 60-iteration trials
    can all beat (seen: the study finished first and exited 0). ``at_once=1``: for a test whose
    subject is not trials running side by side. Each trial at once is a Ray worker process, and
    each costs about 4 s of CPU to start (Ray, Tune, torch). A smoke study used 14-18 s of CPU
    with two at once and 10 s with one, in about the same wall time."""
    source = (
        load_spec("parity-smoke")
        .source.replace("iterations = 60", f"iterations = {60 * times}")
        .replace("eval_interval = 10", f"eval_interval = {10 * times}")
        .replace("grace_period = 10", f"grace_period = {10 * times}")
        .replace("max_concurrent = 2", f"max_concurrent = {at_once}")
        .replace("\ntensorboard = true", "\n# tensorboard: the default, off")  # the studies users run
    )
    if fuse > 1:
        source = source.replace("cpu = 1\n", "cpu = 2\n").replace("gpu = 0\n", f"gpu = 0\nfuse = {fuse}\n")
    made = parse_spec(source, "parity-smoke")  # the shipped lines this rewrites are still there
    got = (made.iterations, made.eval_interval, made.scheduler.grace_period, made.search.max_concurrent)
    assert got == (60 * times, 10 * times, 10 * times, at_once), source
    assert made.resources.fuse == fuse, source
    assert not made.run.tensorboard, source
    return source


def smoke_spec(where: Path, times: int = 1, at_once: int = 2, fuse: int = 1) -> str:
    """``smoke_source(times, at_once, fuse)`` saved as ``parity-smoke.toml`` in ``where``, so the
    study is still named ``parity-smoke``; returns the file's path for ``run``."""
    spec = where / "parity-smoke.toml"
    spec.write_text(smoke_source(times, at_once, fuse))
    return str(spec)


@pytest.fixture(scope="session")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The ``parity-smoke`` study run once to the end by the real CLI: (storage, its output)."""
    storage = tmp_path_factory.mktemp("smoke")
    done = cli("run", "parity-smoke", "--storage", str(storage), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    return storage, done


@dataclass
class S3:
    """A real S3 API (moto's server on loopback) that pyarrow, Ray and the CLI reach through the
    standard AWS environment variables, as they would reach AWS."""

    endpoint: str

    def bucket(self) -> str:
        """A new, empty bucket; returns its ``s3://`` URI."""
        name = f"ponder-{uuid.uuid4().hex[:12]}"
        self.fs().create_dir(name)
        return f"s3://{name}"

    def fs(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(endpoint_override=self.endpoint, allow_bucket_creation=True)

    def files(self, uri: str) -> list[str]:
        """Every object under ``uri`` (``s3://bucket/prefix``), as bucket/key paths."""
        selector = pafs.FileSelector(uri.removeprefix("s3://"), recursive=True, allow_not_found=True)
        return [i.path for i in self.fs().get_file_info(selector) if i.type == pafs.FileType.File]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """moto's S3 server for this module; the AWS variables are set for this process and so for
    the Ray nodes and CLI drivers it starts."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            # the driver's copies of remote studies' Optuna journals
            "PONDER_STUDY_CACHE": str(tmp_path_factory.mktemp("journal-cache")),
        }.items():
            mp.setenv(key, value)
        yield S3(endpoint)
    server.stop()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (for a daemon the test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def processes_naming(marker: str, where: str = "cmdline") -> list[int]:
    """Processes (not this one) whose command line (or, with ``where="environ"``, environment)
    names ``marker``: what a test's own daemons left, found by the folder they were started in or
    a variable the test set, never by a name other tests' processes share."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker in (entry / where).read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
    return pids
