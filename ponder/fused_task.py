"""What a fused group needs of its task: `FusedTask`, one per task that trains fused.

`ponder.fused_trainer.FusedTrainer` is the same for every task (slots, stacked weights, Adam over
rows, the counters on the device, reports); what differs is the batched forward pass and loss and
what each row's batch reads. Parity's is `ponder.fused.PARITY`, MNIST's `ponder.fused_mnist.MNIST`.

The batched loss of a counter-stream group is called as

    stream_loss(layout, flat, base, k0, iterations, *row_data, batch_size,
                log_prior, beta, max_steps, n_steps, kl_direction, active) -> (L, L_rec, L_reg), each [R]

with ``flat`` the rows' weights ``[R, P]``, ``base`` ``[R, W]``, ``k0`` and ``iterations`` ``[R]``
(each row's counter stream at its own iteration) and ``row_data`` the task's own per-row inputs
(`FusedTask.row_data`), so a compiled group's data, forward pass and loss are one graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ponder.config import PonderConfig
    from ponder.trainer import Trainer

__all__ = ["FusedTask", "LossFn"]

LossFn = Callable[..., "tuple[torch.Tensor, torch.Tensor, torch.Tensor]"]
"""A batched forward pass and loss: (L, L_rec, L_reg), each ``[R]``."""


@dataclass(frozen=True)
class FusedTask:
    """One task's batched step, as a fused group calls it."""

    name: str
    stream_loss: LossFn
    """The batched data draw, forward pass and loss of a counter-stream group (module docstring)."""
    stream_width: Callable[[PonderConfig, int], int]
    """(a member's config, N) -> the stream words a row reads an iteration when the group unrolls N."""
    row_data: Callable[[Sequence[Trainer | None], torch.device], tuple[torch.Tensor, ...]]
    """(each row's plain trainer, None for a padding row; the device) -> the task's per-row inputs of
    ``stream_loss``; rebuilt when the group's rows change."""
    forward_loss: LossFn | None = None
    """The batched forward pass and loss on batches drawn outside (``layout, flat, x, y, log_prior,
    beta, max_steps, n_steps, kl_direction, active``): groups of generator-stream runs; None where
    the task fuses on the counter stream only."""
    ordered: bool = False
    """Eager, the rows ordered by max_steps (longest first) and each step computed for the rows still
    inside their own (``active``); else every row at every step, masked."""
    shared: Callable[[Trainer], tuple[torch.Tensor, ...]] = lambda trainer: ()
    """The tensors a member's batches read that its group holds once: a member must read the same
    objects as the group's first member (`ponder.tasks.Task.stream_data`)."""
