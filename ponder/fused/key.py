"""Which runs may train in one fused group, read from the task registry: a task that fuses
declares it once, in its `ponder.tasks.TaskDef`'s ``fused`` (`ponder.tasks.Fusion`: its fused
step, its streams, its own shared fields); every list here is derived from the registered tasks.

Members of one group share every task's `SHARED_FIELDS` and their task's own
(`ponder.tasks.Fusion.fields`). The shapes (n_hidden, batch_size, a task's own) are the stacked
tensors' shapes; the KL direction is a different formula, not a masked value; the device holds
every tensor; the data stream is how the group draws its batches (counter: all at once;
generator: one draw per member, for runs made before counter streams); ``compile`` is how the
group's step runs (`ponder.compiled.should_compile` on the device, as for a plain run).
Everything else is per member: lambda_p and prior_tail (its own log prior row), beta, lr,
grad_clip, dropout (per-row scalars), seed (its own weights, data and evaluation sets), max_steps
(masked: `ponder.fused.halting`), parity's nonzero range, the evaluation sets' sizes and angles,
the budget and the NaN limit.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ponder.config import PonderConfig, TaskView
from ponder.fused.step import FusedStep
from ponder.tasks import TaskDef, task_of
from ponder.trainer import resolve_device

__all__ = [
    "FUSED_KEY_FIELDS",
    "FUSED_TASKS",
    "SHARED_FIELDS",
    "Key",
    "fusable_key",
    "fusable_mismatch",
    "fused_step",
    "key_fields",
]

Key = tuple[tuple[str, object], ...]
"""A group's key: the ``(field, value)`` pairs its members share."""

SHARED_FIELDS = ("n_hidden", "batch_size", "kl_direction", "device", "compile", "data_stream")
"""The config fields the members of any task's group share (module docstring)."""


def key_fields(task: TaskDef[Any]) -> tuple[str, ...]:
    """The config fields the members of one of ``task``'s groups share: its name, its own
    (`ponder.tasks.Fusion.fields`), every task's."""
    own = task.fused.fields if task.fused is not None else ()
    return ("task", *own, *SHARED_FIELDS)


def fused_step(task: TaskDef[Any]) -> type[FusedStep]:
    """``task``'s fused step class, imported from its `ponder.tasks.Fusion.step` (``module:Class``).
    ValueError where the task does not fuse."""
    if task.fused is None:
        raise ValueError(f"the {task.name} task has no fused training step; set fuse = 1 for {task.name}")
    module, _, name = task.fused.step.partition(":")
    step = getattr(importlib.import_module(module), name, None)
    if not (isinstance(step, type) and issubclass(step, FusedStep)):
        raise TypeError(f"the {task.name} task's fused step {task.fused.step!r} is not a FusedStep subclass")
    return step


def _fuses(task: TaskDef[Any]) -> bool:
    return task.fused is not None


FUSED_TASKS: Mapping[str, type[FusedStep]] = TaskView(fused_step, where=_fuses)
"""Each fusable task's fused step class, by task name (imported on reading)."""

FUSED_KEY_FIELDS: Mapping[str, tuple[str, ...]] = TaskView(key_fields, where=_fuses)
"""Each fusable task's `key_fields`, by task name."""


def fusable_key(config: PonderConfig) -> Key:
    """The ``(field, value)`` pairs members of one fused group must share (`key_fields`); configs
    with equal keys can train fused. ``device`` is resolved (``auto`` is what it means here).
    Raises ValueError, saying why in one line, for a task without a fused step or a data stream it
    does not fuse on (MNIST's generator stream: `ponder.tasks.TaskDef.fuse_refusal`)."""
    task = task_of(config)
    refusal = task.fuse_refusal(config.data_stream)
    if refusal is not None:
        raise ValueError(refusal)
    values = config.to_dict()
    values["device"] = str(resolve_device(config.device))
    return tuple((name, values[name]) for name in key_fields(task))


def fusable_mismatch(key: Key, config: PonderConfig) -> str | None:
    """Why ``config`` cannot join a group whose key is ``key`` (the first differing field and both
    values), or None if it can."""
    other = fusable_key(config)
    if len(other) != len(key) or other[0] != key[0]:  # another task: say so, whatever its fields
        return f"task is {config.task!r} but this fused group's is {key[0][1]!r}"
    for (name, want), (_, got) in zip(key, other, strict=True):
        if want != got:
            return f"{name} is {got!r} but this fused group's is {want!r}"
    return None
