"""The tasks: what is particular to each task, in one module per task, found by name.

A task (`TaskDef`, `ponder.tasks.task`) is its config class, how to build its model, training
batches and fixed evaluation sets (`Task`), the names of those sets, and its chance level. The
definitions are kept by name in `ponder.registry`, which ``ponder.config.CONFIGS`` reads too;
everything generic (`ponder.trainer.Trainer`, `ponder.metrics`, the CLI, ``study/``) dispatches
through here, so a new task is one module whose `TaskDef` is given to `register`.

Torch-free at import, the task modules too (they load torch when they build): checking a spec or
reading a study asks the registry for names and chance levels without loading torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ponder import registry
from ponder.config import ConfigError, PonderConfig, TaskView
from ponder.tasks import mnist, parity
from ponder.tasks.task import Batch, Fusion, Task, TaskDef

if TYPE_CHECKING:
    import torch

__all__ = [
    "CHANCE",
    "Batch",
    "Fusion",
    "Task",
    "TaskDef",
    "accuracy",
    "build_task",
    "canonical_sets",
    "eval_set_names",
    "get_task",
    "register",
    "registered",
    "task_of",
    "unregister",
]

C = TypeVar("C", bound=PonderConfig)


def register(task: TaskDef[C], *, replace: bool = False) -> TaskDef[C]:
    """Add ``task`` to the registry under its name (after the tasks already there); a name taken
    by another definition is an error unless ``replace``."""
    if not task.name:
        raise ValueError(f"{task.config.__name__} has no task name: set its class attribute `task`")
    registry.add(task.name, task, replace=replace)
    return task


def unregister(name: str) -> TaskDef[Any]:
    """Remove the task ``name`` and return its definition (a test's task, say)."""
    task: TaskDef[Any] = registry.remove(name)
    return task


def registered() -> Mapping[str, TaskDef[Any]]:
    """Every task by name, in registration order (read-only)."""
    return registry.definitions()


def get_task(name: str) -> TaskDef[Any]:
    """The task ``name``; `ConfigError` naming the registered tasks if there is none."""
    tasks = registered()
    if name not in tasks:
        raise ConfigError(f"task must be one of {', '.join(tasks)}, got {name!r}")
    return tasks[name]


def task_of(config: PonderConfig) -> TaskDef[Any]:
    """The task whose config ``config`` is; `TypeError` for a config of no registered task."""
    task = registered().get(config.task)
    if task is None or not isinstance(config, task.config):
        raise TypeError(f"no task for config {type(config).__name__}")
    return task


def build_task(config: PonderConfig, device: torch.device, data: object | None = None) -> Task:
    """Build the model (seeded by ``config.seed``), the data sampler and the evaluation sets;
    ``data`` goes to the task's builder (MNIST's `MnistData`; None: the task's default)."""
    import torch

    task = task_of(config)
    torch.manual_seed(config.seed)
    return task.build(config, device, data)


def eval_set_names(config: PonderConfig) -> list[str]:
    """Names of the evaluation sets `build_task` makes for this config, without building them."""
    return task_of(config).eval_set_names(config)


def canonical_sets() -> tuple[str, ...]:
    """Every registered task's canonical evaluation sets, in registration order, each once."""
    return tuple(dict.fromkeys(s for task in registered().values() for s in task.canonical_sets))


CHANCE: Mapping[str, float | None] = TaskView(lambda task: task.chance)
"""The chance level of each registered task by name."""


def accuracy(y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample correctness (float 0/1) against labels ``[B]``: class logits ``[..., B, C]``
    when the labels are class indices (int), binary logits ``[..., B]`` when they are 0./1."""
    if not y.is_floating_point():  # class indices: the arg-max class
        return (y_hat.argmax(dim=-1) == y).float()
    return ((y_hat > 0).float() == y).float()  # binary: logit > 0 means 1


# the built-in tasks, in the order the CLI, the spec schema and the Parquet list them
register(parity.TASK)
register(mnist.TASK)
