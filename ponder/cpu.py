"""Keep freed CPU memory in the process instead of handing it back to the OS every iteration.

A training iteration allocates and frees the same few-MB tensors again and again. glibc serves
blocks over its mmap threshold (128 KB at start) with fresh ``mmap`` pages and trims freed heap
back to the OS, so every iteration page-faults its working set in again: about 1,200 faults
per parity iteration here, which on a virtual machine cost more than the arithmetic (15.9 ms
against 7.7 ms per GRU forward and backward at the benchmark's shapes, 2 threads). Raising
both thresholds keeps those pages mapped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["keep_freed_memory"]

# mallopt parameters, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_done = False


def keep_freed_memory(mmap_threshold: int = 64 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Raise glibc's mmap and trim thresholds (once per process); False where there is no glibc."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )
    return _done
