"""Atomic writes' temporary files get the mode a plain ``open`` gives, not mkstemp's 0600."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ponder.files import temporary_beside, umask


@pytest.fixture(params=[0o022, 0o027, 0o002, 0o077])
def process_umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_the_umask_is_read_as_set(process_umask: int) -> None:
    assert umask() == process_umask


def test_a_temporary_file_has_the_mode_open_would_give(process_umask: int, tmp_path: Path) -> None:
    fd, tmp = temporary_beside(tmp_path / "trials.parquet", suffix=".tmp")
    os.close(fd)
    with open(tmp_path / "plain", "w"):
        pass
    assert Path(tmp).parent == tmp_path and Path(tmp).name.startswith(".trials.parquet.")
    mode = stat.S_IMODE(os.stat(tmp).st_mode)
    assert mode == 0o666 & ~process_umask == stat.S_IMODE(os.stat(tmp_path / "plain").st_mode)
