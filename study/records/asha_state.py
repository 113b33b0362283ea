"""ASHA's saved state: ``asha.json`` and, on a local disk, the changes appended since.

ASHA's state (its rungs, each trial's bracket, the trials it stopped) grows with the study, and
it changes three or four times per trial. Rewriting it whole at each change made the driver's
cost per trial grow with the study (bench/driver_scale.py, profiled: 39 s in the 4,709 saves of a
2,000-trial study, the largest cost that grew with N). So on a
local disk each change is one line appended to ``asha.json.log`` (fsynced, as the whole file
was), and the log is folded into ``asha.json`` when a driver loads the state. An object store
has no append: there each save is one small object in ``asha.json.log.d/``, and every
`FOLD_EVERY` saves the whole state is written and those objects removed, so a save costs one
small write and 1/`FOLD_EVERY` of a whole one, and a reader reads at most `FOLD_EVERY` objects.

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
    "FOLD_EVERY",
    "STATE_VERSION",
    "Change",
    "fold_log",
    "log_uri",
    "parts_dir",
    "read_state",
    "save_changes",
    "write_state",
]

STATE_VERSION = 1
FOLD_EVERY = 64
"""Saves on an object store between two whole writes of the state."""
_saved_since_fold: dict[str, int] = {}
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
    store, which has no append, as one new object, the whole state written every `FOLD_EVERY`."""
    if not changes:
        return
    if is_remote(state_uri):
        saved = _saved_since_fold.get(state_uri, 0)
        if saved + 1 >= FOLD_EVERY:
            fold_log(state_uri, state())
            return
        name = f"{time.time_ns()}-{os.getpid()}-{next(_part_numbers)}"
        write_bytes(f"{parts_dir(state_uri)}/{name}", b"".join(_encode(c) + b"\n" for c in changes))
        _saved_since_fold[state_uri] = saved + 1
        return
    with open(resolve(log_uri(state_uri))[1], "ab") as f:
        f.write(b"".join(_encode(c) + b"\n" for c in changes))
        f.flush()
        os.fsync(f.fileno())


def fold_log(state_uri: str, state: dict[str, Any]) -> None:
    """Write ``state`` (which holds every logged change) whole, then remove the log or parts."""
    write_state(state_uri, state)
    if is_remote(state_uri):
        fs, directory = resolve(parts_dir(state_uri))
        fs.delete_dir_contents(directory, missing_dir_ok=True)
        _saved_since_fold[state_uri] = 0
    else:
        Path(resolve(log_uri(state_uri))[1]).unlink(missing_ok=True)
