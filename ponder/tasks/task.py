"""What a task is: its definition (`TaskDef`), registered by name in `ponder.registry`, and what
it builds for one config (`Task`: the model, a training-batch sampler, the evaluation sets).

Each task module (`ponder.tasks.parity`, `ponder.tasks.mnist`) makes one `TaskDef`; `ponder.tasks`
registers them. A task that trains fused says so in its `TaskDef` (`Fusion`): everything that
reads which tasks fuse, on which streams and with which shared fields reads it there. Torch-free
at import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeAlias, TypeVar

from ponder.config import PonderConfig

if TYPE_CHECKING:
    import torch

    from ponder.data.eval_set import EvalSet
    from ponder.model import PonderNet

__all__ = ["Batch", "Fusion", "Task", "TaskDef"]

Batch: TypeAlias = "tuple[torch.Tensor, ...]"
"""A training batch ``(x [B, ...], y [B])``; a counter-stream batch of a step with noise of its own
(MNIST's dropout) also carries that noise, ``(x, y, masks [N, B, H])``, for the model's forward."""

C = TypeVar("C", bound=PonderConfig)


@dataclass
class Task:
    """The model, a training-batch sampler and the fixed evaluation sets of one config."""

    model: PonderNet
    sample_batch: Callable[[torch.Generator], Batch]
    """A batch from a generator (``data_stream = "generator"``)."""
    eval_sets: dict[str, EvalSet]
    stream_words: int = 0
    """Counter-stream words one batch reads (`ponder.streams`); 0 where the task has no counter stream."""
    stream_batch: Callable[[torch.Tensor], Batch] | None = None
    """A batch from one iteration's stream words ``[1, stream_words]`` (``data_stream = "counter"``)."""
    stream_data: dict[str, torch.Tensor] = field(default_factory=dict)
    """What ``stream_batch`` reads besides the words, by name (MNIST: the image pool, its labels, the
    run's training rows): a fused group reads its members' batches from the same tensors."""


@dataclass(frozen=True)
class Fusion:
    """How a task's runs train as one model (a spec's ``fuse > 1``,
    `ponder.fused.trainer.FusedTrainer`): its fused step and what the members of one group share.
    Torch-free, so that a spec is checked against it without loading torch."""

    step: str
    """Its fused step, a `ponder.fused.step.FusedStep` subclass, as ``"module:Class"``
    (``"ponder.fused.parity:FusedParityStep"``): imported when a group is built, by
    `ponder.fused.key.fused_step`. A name, not an import, so that ``ponder.tasks`` (below the
    trainers) never imports ``ponder.fused`` (above them)."""
    streams: tuple[str, ...]
    """The data streams on which it fuses. A task whose step draws noise of its own (MNIST's
    dropout) fuses on the counter stream only."""
    fields: tuple[str, ...] = ()
    """Its own config fields that the members of one group share, besides every task's
    (`ponder.fused.key.SHARED_FIELDS`): the stacked tensors' shapes (parity's ``n_elems``), the
    data a group holds once (MNIST's ``data_dir`` and ``train_rotation``)."""


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
    fused: Fusion | None = None
    """How its runs train as one model; None where they cannot (``fuse = 1`` only)."""

    @property
    def fused_streams(self) -> tuple[str, ...]:
        """The data streams on which its runs train fused; () where they cannot."""
        return self.fused.streams if self.fused is not None else ()

    def fuse_refusal(self, *data_streams: str) -> str | None:
        """Why runs of this task on these data streams cannot train fused, in one line naming the
        fix; None where they can."""
        if not self.fused_streams:
            return f"the {self.name} task has no fused training step; set fuse = 1 for {self.name}"
        if not set(data_streams) <= set(self.fused_streams):
            return (
                f"fused {self.name} draws every member's randomness from its counter stream: set "
                'data_stream = "counter", or fuse = 1 (a run made before counter streams draws its '
                "dropout from torch's global generator)"
            )
        return None

    @property
    def name(self) -> str:
        """The task's name: ``--task``, a spec's ``task``, the Parquet's ``task`` column."""
        return self.config.task
