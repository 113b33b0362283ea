"""ASHA's saved state: ``asha.json`` and, on a local disk, the changes appended since.

ASHA's state (its rungs, each trial's bracket, the trials it stopped) grows with the study, and
it changes three or four times per trial. Rewriting it whole at each change made the driver's
cost per trial grow with the study (bench/driver_scale.py, profiled: 39 s in the 4,709 saves of a
2,000-trial study, the largest cost that grew with N). So on a
local disk each change is one line appended to ``asha.json.log`` (fsynced, as the whole file
was), and the log is folded into ``asha.json`` when a driver loads the state. An object store
has no append: there the file is still rewritten whole at each change.

Every change only adds (a trial's bracket, a rung value, a stopped trial), so applying a change
twice is harmless: a kill between writing the folded file and removing the log loses nothing.
A kill in the middle of an append leaves a torn last line, which is skipped. Reading it needs
neither Ray nor torch: ``status``, ``report`` and the trainable read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from study.storage import is_remote, read_bytes, read_json, resolve, write_bytes

__all__ = ["STATE_VERSION", "Change", "fold_log", "log_uri", "read_state", "save_changes", "write_state"]

STATE_VERSION = 1

Change = list[Any]
"""One change: ``["assign", trial_id, bracket]``, ``["rung", bracket, milestone, trial_id,
value]`` or ``["stop", trial_id]``."""


def log_uri(state_uri: str) -> str:
    """Where the changes since ``asha.json`` was written are appended."""
    return f"{state_uri}.log"


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
    data = None if is_remote(state_uri) else read_bytes(log_uri(state_uri))
    for line in (data or b"").splitlines():
        try:
            change = json.loads(line)
        except ValueError:  # a torn last line: the kill came in the middle of its append
            continue
        _apply(state, change)
    return state


def save_changes(state_uri: str, changes: list[Change], state: Callable[[], dict[str, Any]]) -> None:
    """Save ``changes``, already applied to the whole current ``state()``: appended to the log on
    a local disk (or a ``file://`` mount), after `fold_log` wrote the whole state; on an object
    store, which has no append, the whole state is written."""
    if not changes:
        return
    if is_remote(state_uri):
        write_state(state_uri, state())
        return
    with open(resolve(log_uri(state_uri))[1], "ab") as f:
        f.write(b"".join(_encode(c) + b"\n" for c in changes))
        f.flush()
        os.fsync(f.fileno())


def fold_log(state_uri: str, state: dict[str, Any]) -> None:
    """Write ``state`` (which holds every logged change) whole, then remove the log."""
    write_state(state_uri, state)
    if not is_remote(state_uri):
        Path(resolve(log_uri(state_uri))[1]).unlink(missing_ok=True)
