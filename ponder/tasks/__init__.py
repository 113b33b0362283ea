"""The task registry: what is particular to each task, in one module per task, found by name.

A task (`TaskDef`) is its config class, how to build its model, training batches and fixed
evaluation sets (`Task`), the names of those sets, and its chance level. Everything generic
(`ponder.trainer.Trainer`, ``ponder.config.CONFIGS``, `ponder.metrics`, the CLI, ``study/``)
dispatches through here, so a new task is one module that calls `register`.

Torch-free at import, the task modules too (they load torch when they build): checking a spec or
reading a study asks the registry for names and chance levels without loading torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

from ponder.config import ConfigError, PonderConfig, TaskView

if TYPE_CHECKING:
    import torch

    from ponder.data.parity import EvalSet
    from ponder.model import PonderNet

__all__ = [
    "CHANCE",
    "Batch",
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

Batch: TypeAlias = "tuple[torch.Tensor, torch.Tensor]"
"""A training batch ``(x [B, ...], y [B])``."""

C = TypeVar("C", bound=PonderConfig)


@dataclass
class Task:
    """The model, a training-batch sampler and the fixed evaluation sets of one config."""

    model: PonderNet
    sample_batch: Callable[[torch.Generator], Batch]
    eval_sets: dict[str, EvalSet]


@dataclass(frozen=True)
class TaskDef(Generic[C]):
    """What is particular to one task; its name is its config class's ``task``."""

    config: type[C]
    """The task's config class (a `PonderConfig` with its own fields and checks)."""
    build: Callable[[C, torch.device, object | None], Task]
    """(config, device, data) -> `Task`; ``data`` is the task's own data (MNIST's `MnistData`),
    None for its default. `build_task` seeds torch with ``config.seed`` before calling it."""
    eval_set_names: Callable[[C], list[str]]
    """The names of the evaluation sets ``build`` makes for a config, without building them."""
    chance: float | None
    """The accuracy of a guess (1/2 for a bit, 1/10 for a digit); None where unknown."""
    canonical_sets: tuple[str, ...]
    """The evaluation sets a study's Parquet has as columns from the start (any other set a
    study reports adds its columns when it appears)."""

    @property
    def name(self) -> str:
        """The task's name: ``--task``, a spec's ``task``, the Parquet's ``task`` column."""
        return self.config.task


_TASKS: dict[str, TaskDef[Any]] = {}


def register(task: TaskDef[C], *, replace: bool = False) -> TaskDef[C]:
    """Add ``task`` to the registry under its name (after the tasks already there); a name taken
    by another definition is an error unless ``replace``."""
    name = task.name
    if not name:
        raise ValueError(f"{task.config.__name__} has no task name: set its class attribute `task`")
    if name in _TASKS and _TASKS[name] != task and not replace:
        raise ValueError(f"a task named {name!r} is registered already")
    _TASKS[name] = task
    return task


def unregister(name: str) -> TaskDef[Any]:
    """Remove the task ``name`` and return its definition (a test's task, say)."""
    return _TASKS.pop(name)


def registered() -> Mapping[str, TaskDef[Any]]:
    """Every task by name, in registration order (read-only)."""
    return dict(_TASKS)


def get_task(name: str) -> TaskDef[Any]:
    """The task ``name``; `ConfigError` naming the registered tasks if there is none."""
    task = _TASKS.get(name)
    if task is None:
        raise ConfigError(f"task must be one of {', '.join(_TASKS)}, got {name!r}")
    return task


def task_of(config: PonderConfig) -> TaskDef[Any]:
    """The task whose config ``config`` is; `TypeError` for a config of no registered task."""
    task = _TASKS.get(config.task)
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
    return tuple(dict.fromkeys(s for task in _TASKS.values() for s in task.canonical_sets))


CHANCE: Mapping[str, float | None] = TaskView(lambda task: task.chance)
"""The chance level of each registered task by name."""


def accuracy(y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample correctness (float 0/1) against labels ``[B]``: class logits ``[..., B, C]``
    when the labels are class indices (int), binary logits ``[..., B]`` when they are 0./1."""
    if not y.is_floating_point():  # class indices: the arg-max class
        return (y_hat.argmax(dim=-1) == y).float()
    return ((y_hat > 0).float() == y).float()  # binary: logit > 0 means 1


# the built-in tasks, in the order the CLI, the spec schema and the Parquet list them
from ponder.tasks import mnist, parity  # noqa: E402  (they import the names above)

register(parity.TASK)
register(mnist.TASK)
