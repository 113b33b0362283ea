"""Helpers for the study tests: the real CLI in a subprocess, its Parquet read back with pandas."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.fs as pafs
import pytest

from study.storage import StudyPaths, read_table

CLI = [sys.executable, "-m", "study"]
REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 300, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run ``ponder-study ARGS`` to the end (in ``cwd``, the repository by default)."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


class Driver:
    """``ponder-study ARGS`` running in its own process group, as in a terminal."""

    def __init__(self, *args: str, log: Path, env: dict[str, str] | None = None, cwd: Path = REPO) -> None:
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            [*CLI, *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            env={**os.environ, **(env or {})},
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
        finally:
            self._out.close()
        return rc

    def output(self) -> str:
        return self.log.read_text()


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    started: list[Driver] = []

    def start(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> Driver:
        d = Driver(*args, log=tmp_path / f"driver-{len(started)}.log", env=env, cwd=cwd)
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
                if json.loads(path.read_text())["outcome"] == outcome:
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
    """True once the study's Parquet shows ``at_least`` trials that ended."""

    def check() -> bool:
        df = read_live(str(storage / "trials" / f"study={name}" / "trials.parquet"))
        if df is None:
            return False
        return int(df["status"].isin(["completed", "early_stopped", "diverged"]).sum()) >= at_least

    return check


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
