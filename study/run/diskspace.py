"""Whether an error came from a full disk: the driver's one error line then says so, whatever
error a library raised once the disk was full."""

from __future__ import annotations

import errno
import os

from study.storage.storage import has_scheme, nearest_existing

__all__ = ["full_disk"]

_NEARLY_FULL = 1 << 20
"""Free bytes under which a local storage's disk is taken as full, whatever the error said."""


def full_disk(error: BaseException, storage: str | None) -> tuple[str, str] | None:
    """(where, how much is free) if ``error`` came from a full disk: an ENOSPC in the error or
    one it was raised from (free then ""), or a local storage left with under 1 MiB free."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return str(seen.filename or storage or "the storage"), ""
        seen = seen.__cause__ or seen.__context__
    if storage is None or has_scheme(storage):
        return None
    try:
        fs = os.statvfs(nearest_existing(storage))
    except OSError:
        return None
    if fs.f_blocks == 0:  # a pseudo filesystem (/proc, /sys) has no blocks at all: not a full one
        return None
    free = fs.f_bavail * fs.f_frsize
    return (storage, f"{free // 1024} KiB free") if free < _NEARLY_FULL else None
