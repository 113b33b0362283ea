"""keep_freed_memory: freed blocks stay mapped, so reallocating them costs no page faults."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from ponder.cpu import keep_freed_memory
    assert keep_freed_memory()
x = torch.ones(512, 1024)  # 2 MB, far over glibc's default mmap threshold
for _ in range(5):
    (x * 2).sum()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    (x * 2).sum()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
"""


def _faults_per_iteration(mode: str) -> float:
    proc = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, check=True)
    return float(proc.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_page_faults() -> None:
    default = _faults_per_iteration("default")
    kept = _faults_per_iteration("keep")
    assert kept < 10 <= default  # a fresh mmap of 2 MB faults in ~500 pages
