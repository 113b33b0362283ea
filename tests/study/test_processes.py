"""The driver's hold on the processes it started: subreaper on while Ray runs, off after."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

import pytest

from study.processes import descendants, set_subreaper, stop

PR_GET_CHILD_SUBREAPER = 37

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's prctl and /proc")


def _is_subreaper() -> bool:
    flag = ctypes.c_int()
    ctypes.CDLL(None).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return bool(flag.value)


def test_an_orphan_below_a_subreaper_stays_its_descendant_and_is_stopped() -> None:
    """A child that starts a grandchild and exits (as a raylet stopped while its agent starts):
    with the subreaper on, the grandchild is re-parented here, found and stopped."""
    assert set_subreaper(True) and _is_subreaper()
    try:
        parent = subprocess.Popen(
            [sys.executable, "-c", "import subprocess, sys; subprocess.Popen(['sleep', '60']); sys.exit(0)"]
        )
        parent.wait(30)
        deadline = time.monotonic() + 10
        while not (orphans := descendants(os.getpid())) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orphans, "the orphaned grandchild is not below this process"
        assert stop(orphans, grace_s=0.1) == len(orphans)
    finally:
        assert set_subreaper(False)
    assert not _is_subreaper()  # a study run from Python leaves the caller's process as it was
