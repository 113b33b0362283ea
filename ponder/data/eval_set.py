"""`EvalSet`: a fixed evaluation set, what every task's builder makes (`ponder.tasks.Task.eval_sets`)
and `ponder.trainer.Trainer.evaluate` reads. Torch-free at import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["EvalSet"]


@dataclass(frozen=True)
class EvalSet:
    """A fixed evaluation set: inputs ``[S, ...]``, labels ``[S]``, and (parity) the non-zero range
    it was drawn from."""

    name: str
    x: torch.Tensor
    y: torch.Tensor
    n_nonzero: tuple[int, int] | None = None
