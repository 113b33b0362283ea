"""ASHA's saved state: ``asha.json`` and, on a local disk, the changes appended since.

ASHA's state (its rungs, each trial's bracket, the trials it stopped) grows with the study, and
it changes three or four times per trial. Rewriting it whole at each change made the driver's
cost per trial grow with the study (bench/driver_scale.py, profiled: 39 s in the 4,709 saves of a
2,000-trial study, the largest cost that grew with N). So on a
local disk each change is one line appended to ``asha.json.log``, and the log is folded into
``asha.json`` when a driver loads the state. An object store has no append: there the changes
saved within `FLUSH_S` of the last write are kept and written together as one small object in
``asha.json.log.d/``, and every `FOLD_EVERY` objects the whole state is written and those objects
removed, so a reader reads at most `FOLD_EVERY` objects.

Neither is synced to the disk nor written at once on an object store: each trial's end record
carries the trial's own state in ASHA (its bracket, rung values and stop) and is synced, and a
resume replays it (`study.run.replay`). What a crash of the machine, or a kill on an object store,
can cost is the rung values of trials still running, which their reports after the resume give
ASHA again, or not (a trial resumed past a rung): ASHA then judges a few later trials against
fewer values. ``flush`` writes what is kept, as a driver's run ends.

Every change only adds (a trial's bracket, a rung value, a stopped trial), so applying a change
twice is harmless: a kill between writing the folded file and removing the log loses nothing.
A kill in the middle of an append leaves a torn last line, which is skipped. Reading it needs
neither Ray nor torch: ``status``, ``report`` and the trainable read it.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from study.storage.storage import is_remote, read_bytes, read_json, resolve, write_bytes

__all__ = [
    "FLUSH_S",
    "FOLD_EVERY",
    "STATE_VERSION",
    "Change",
    "flush",
    "fold_log",
    "log_uri",
    "parts_dir",
    "read_state",
    "save_changes",
    "write_state",
]

STATE_VERSION = 1
FOLD_EVERY = 64
"""Objects written on an object store between two whole writes of the state."""
FLUSH_S = 5.0
"""On an object store, changes saved within this many seconds of the last write are written with
the next one."""
_saved_since_fold: dict[str, int] = {}
_kept: dict[str, tuple[float, list[Change], Callable[[], dict[str, Any]]]] = {}
"""On an object store, per state: when it was last written, the changes kept since, the state."""
_part_numbers = itertools.count()

Change = list[Any]
"""One change: ``["assign", trial_id, bracket]``, ``["rung", bracket, milestone, trial_id,
value]`` or ``["stop", trial_id]``."""


def log_uri(state_uri: str) -> str:
    """Where the changes since ``asha.json`` was written are appended (a local disk)."""
    return f"{state_uri}.log"


def parts_dir(state_uri: str) -> str:
    """Where each save since ``asha.json`` was written is one object (an object store)."""
    return f"{state_uri}.log.d"


def _logged(state_uri: str) -> bytes:
    """The changes saved since the whole state, as lines: the log, or every part's lines."""
    if not is_remote(state_uri):
        return read_bytes(log_uri(state_uri)) or b""
    fs, directory = resolve(parts_dir(state_uri))
    data = []
    for info in fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as f:
                data.append(f.readall())
    return b"".join(data)


def _encode(obj: Any) -> bytes:
    # compact separators: json's C encoder (indent falls back to its pure-Python one, 2x slower)
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_state(state_uri: str, state: dict[str, Any]) -> None:
    """Write the whole state, atomically."""
    write_bytes(state_uri, _encode(state))


def _apply(state: dict[str, Any], change: Change) -> None:
    kind = change[0]
    if kind == "assign":
        state["assigned"][change[1]] = change[2]
    elif kind == "rung":
        _, bracket, milestone, trial_id, value = change
        for m, recorded in state["brackets"][bracket]:
            if m == milestone:
                recorded[trial_id] = value
                break
    elif kind == "stop" and change[1] not in state["stopped"]:
        state["stopped"].append(change[1])


def read_state(state_uri: str) -> dict[str, Any] | None:
    """``asha.json`` with the logged changes applied (None when there is none)."""
    state: dict[str, Any] | None = read_json(state_uri)
    if not state:  # a driver writes the whole file before it logs any change
        return None
    for line in _logged(state_uri).splitlines():  # in any order: every change only adds
        try:
            change = json.loads(line)
        except ValueError:  # a torn last line: the kill came in the middle of its append
            continue
        _apply(state, change)
    return state


def save_changes(state_uri: str, changes: list[Change], state: Callable[[], dict[str, Any]]) -> None:
    """Save ``changes``, already applied to the whole current ``state()``: appended to the log on
    a local disk (or a ``file://`` mount), after `fold_log` wrote the whole state; on an object
    store, which has no append, kept and written with the others of the last `FLUSH_S` seconds as
    one new object, the whole state written every `FOLD_EVERY` objects. Not synced to the disk
    (see the module docstring)."""
    if not changes:
        return
    if is_remote(state_uri):
        last, kept, _ = _kept.get(state_uri, (0.0, [], state))
        kept = [*kept, *changes]
        if time.monotonic() - last < FLUSH_S:
            _kept[state_uri] = (last, kept, state)
            return
        _write_part(state_uri, kept, state)
        return
    with open(resolve(log_uri(state_uri))[1], "ab") as f:
        f.write(b"".join(_encode(c) + b"\n" for c in changes))


def _write_part(state_uri: str, changes: list[Change], state: Callable[[], dict[str, Any]]) -> None:
    """Write the changes kept for a state on an object store as one object (or, every
    `FOLD_EVERY`, the whole state)."""
    _kept[state_uri] = (time.monotonic(), [], state)
    saved = _saved_since_fold.get(state_uri, 0)
    if saved + 1 >= FOLD_EVERY:
        fold_log(state_uri, state())
        return
    name = f"{time.time_ns()}-{os.getpid()}-{next(_part_numbers)}"
    write_bytes(f"{parts_dir(state_uri)}/{name}", b"".join(_encode(c) + b"\n" for c in changes))
    _saved_since_fold[state_uri] = saved + 1


def flush(state_uri: str | None = None) -> None:
    """Write the changes kept on an object store (of ``state_uri``, or of every state)."""
    for uri in [state_uri] if state_uri is not None else list(_kept):
        _, kept, state = _kept.get(uri, (0.0, [], dict))
        if kept:
            _write_part(uri, kept, state)


def fold_log(state_uri: str, state: dict[str, Any]) -> None:
    """Write ``state`` (which holds every logged change) whole, then remove the log or parts."""
    write_state(state_uri, state)
    if is_remote(state_uri):
        fs, directory = resolve(parts_dir(state_uri))
        fs.delete_dir_contents(directory, missing_dir_ok=True)
        _saved_since_fold[state_uri] = 0
        _kept.pop(state_uri, None)  # the whole state holds them
    else:
        Path(resolve(log_uri(state_uri))[1]).unlink(missing_ok=True)
