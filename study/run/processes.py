"""The processes a command started, so none outlives it.

A local Ray instance is a tree under the driver: GCS, raylet, the raylet's agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) and workers. ``ray.shutdown()`` stops the
ones Ray tracks, but an agent whose raylet is stopped while Ray is still starting (a Ctrl-C in
the first seconds) can outlive the driver, holding memory and the terminal's process group.
Linux only (``/proc``); elsewhere nothing is found and nothing is stopped.

Such an agent can also be started by its raylet a moment after the driver listed its processes,
and then orphaned when the raylet stops: `set_subreaper` makes the driver the parent of every
orphan below it while Ray runs, so a second listing after ``ray.shutdown()`` still finds it.
`Reaper` holds the two together and spares what was below the driver before (a study run from
Python, in a process that has children of its own).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = ["Reaper", "descendants", "set_subreaper", "stop"]

Process = tuple[int, str]
"""(pid, start time in clock ticks since boot): a pid reused by another process never matches."""


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process; None if it is gone or a zombie (it ran out)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and ')'
    if fields[0] in ("Z", "X"):  # fields: state (3rd of stat), ppid (4th), ..., starttime (22nd)
        return None
    return int(fields[1]), fields[19]


_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_PR_GET_CHILD_SUBREAPER = 37


def set_subreaper(on: bool) -> bool:
    """Make this process the one that orphans below it are re-parented to (Linux's
    ``PR_SET_CHILD_SUBREAPER``), not init, so they stay its `descendants`; ``on=False`` undoes it
    (a study run from Python leaves the caller's process as it was). Returns whether it took."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def is_subreaper() -> bool:
    """Whether this process is a subreaper now (False where that cannot be asked)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        flag = ctypes.c_int()
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and bool(flag.value)
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[Process]:
    """Every process below ``pid`` (children, their children, ...), as they are now."""
    children: dict[int, list[Process]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found: list[Process] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def _alive(processes: list[Process]) -> list[Process]:
    return [(pid, start) for pid, start in processes if (s := _stat(pid)) is not None and s[1] == start]


def stop(processes: list[Process], grace_s: float = 1.0) -> int:
    """Let ``processes`` exit for ``grace_s``, then SIGTERM what is left, then SIGKILL; returns
    how many had to be signalled."""
    deadline = time.monotonic() + grace_s
    while (left := _alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for sig, wait_s in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 0.0)):
        for pid, _ in _alive(left):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while _alive(left) and time.monotonic() < deadline:
            time.sleep(0.05)
    return len(left)


_ROUNDS = 5
"""`Reaper.close` stops what it lists at most this many times: a tree that keeps starting
processes as it is stopped is not waited on for ever."""


class Reaper:
    """The processes this process starts from now on, orphans included: `started` lists them,
    `close` stops them and puts the subreaper flag back as it was. Children that were already
    there when the reaper was made are never listed (they are not the reaper's to stop)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._before = set(descendants(self._pid))
        self._was_subreaper = is_subreaper()
        set_subreaper(True)

    def started(self) -> list[Process]:
        """The descendants that were not there when the reaper was made, as they are now."""
        return [p for p in descendants(self._pid) if p not in self._before]

    def close(self, also: list[Process] | None = None, grace_s: float = 1.0) -> int:
        """Stop ``also`` (an earlier `started` list) and what `started` lists now, then what
        appeared meanwhile (a raylet may start an agent as it stops, orphaned here), until
        nothing new does; returns how many had to be signalled."""
        try:
            signalled, seen = 0, set[Process]()
            todo = [*(also or []), *self.started()]
            for _ in range(_ROUNDS):
                signalled += stop(todo, grace_s)
                seen.update(todo)
                if not (todo := [p for p in self.started() if p not in seen]):
                    break
            return signalled
        finally:
            if not self._was_subreaper:
                set_subreaper(False)
