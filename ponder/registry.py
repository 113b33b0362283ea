"""The task registry: every task's definition by name, in registration order.

Below both modules that need it: `ponder.config` reads it for a config's class by its task's name
(``CONFIGS``), and `ponder.tasks` defines the tasks (`ponder.tasks.TaskDef`) and registers the
built-in ones. It imports nothing of ponder, so that neither of them imports the other back:
`ponder.tasks`' `register`, `registered` and `get_task` are the typed way in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["add", "definitions", "remove"]

_TASKS: dict[str, Any] = {}


def add(name: str, task: object, *, replace: bool = False) -> None:
    """Add ``task`` under ``name`` (after the tasks already there); a name taken by another
    definition is an error unless ``replace``."""
    if not name:
        raise ValueError(f"{task!r} has no task name: set its config class's attribute `task`")
    if name in _TASKS and _TASKS[name] != task and not replace:
        raise ValueError(f"a task named {name!r} is registered already")
    _TASKS[name] = task


def remove(name: str) -> Any:
    """Remove the task ``name`` and return its definition."""
    return _TASKS.pop(name)


def definitions() -> Mapping[str, Any]:
    """Every task's definition by name, in registration order (a copy)."""
    return dict(_TASKS)
