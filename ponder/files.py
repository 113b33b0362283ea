"""Temporary files for atomic writes, with the permissions a plain ``open`` would give them.

A file written whole to a temporary name and renamed into place is never seen torn. But
``tempfile.mkstemp`` creates its file readable by its owner alone (0600), and the rename keeps
that mode; `temporary_beside` gives it the mode ``open`` would (0666 less the umask), so a
study's Parquet, spec and checkpoints on a shared disk stay readable by its group.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["temporary_beside", "umask"]


def umask() -> int:
    """The process's umask, read without setting it (``os.umask`` can only read by writing, which
    would race with other threads' file creation); Linux's /proc, else the usual 0o022."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def temporary_beside(path: str | os.PathLike[str], suffix: str = "") -> tuple[int, str]:
    """A new empty file in ``path``'s directory, hidden (``.name.XXXX``), open for writing:
    ``(fd, its path)``, with the mode ``open`` gives a new file (0666 less the umask)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    try:
        os.fchmod(fd, 0o666 & ~umask())
    except BaseException:
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
    return fd, tmp
