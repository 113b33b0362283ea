"""The driver's hold on the processes it started: subreaper on while Ray runs, off after, and
the caller's own children never touched."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from study.run.processes import Reaper, descendants, is_subreaper, set_subreaper

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's prctl and /proc")


def _orphan_a_grandchild() -> None:
    """A child that starts a grandchild and exits, as a raylet stopped while its agent starts."""
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.Popen(['sleep', '60']); sys.exit(0)"]
    )
    parent.wait(30)


def test_a_reaper_stops_the_orphans_below_it_and_spares_the_callers_children() -> None:
    """The orphaned grandchild is re-parented here, listed and stopped; a child this process had
    before (in the tests: the shared Ray instance; for a user: a notebook's own subprocess) is not."""
    mine = subprocess.Popen(["sleep", "60"])
    try:
        assert not is_subreaper()
        reaper = Reaper()
        assert is_subreaper()
        _orphan_a_grandchild()
        deadline = time.monotonic() + 10
        while not (orphans := reaper.started()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orphans, "the orphaned grandchild is not below this process"
        assert mine.pid not in {pid for pid, _ in orphans}
        assert reaper.close(grace_s=0.1) == len(orphans)
        assert not is_subreaper()  # a study run from Python leaves the caller's process as it was
        assert not reaper.started()
        assert mine.poll() is None, "the caller's own child was stopped"
        assert mine.pid in {pid for pid, _ in descendants(os.getpid())}
    finally:
        mine.kill()
        mine.wait()


def test_a_reaper_stops_what_a_process_starts_as_it_is_stopped() -> None:
    """A raylet stopped while its agents start can start one more as it goes: that orphan,
    which appears after the reaper listed the processes, is stopped too, not left to init."""
    reaper = Reaper()
    try:
        raylet = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import signal, subprocess, sys, time\n"
                "def going(*_):\n"
                "    print(subprocess.Popen(['sleep', '60']).pid, flush=True)\n"
                "    sys.exit(0)\n"
                "signal.signal(signal.SIGTERM, going)\n"
                "print('up', flush=True)\n"
                "time.sleep(60)\n",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert raylet.stdout is not None and raylet.stdout.readline() == "up\n"
        assert reaper.close(grace_s=0.1) == 2  # the raylet, then the agent it started on SIGTERM
        agent = int(raylet.stdout.readline())
        raylet.wait(10)
        # orphaned to this process (the subreaper), it has ended: waitpid collects it at once
        assert os.waitpid(agent, os.WNOHANG)[0] == agent, "the agent started on SIGTERM still runs"
    finally:
        reaper.close(grace_s=0)


def test_a_reaper_leaves_a_subreaper_caller_a_subreaper() -> None:
    assert set_subreaper(True)
    try:
        Reaper().close()
        assert is_subreaper()
    finally:
        assert set_subreaper(False)
    assert not is_subreaper()
