"""The parity task: is the number of +1s in a vector of 0, +1 and -1 odd? A GRU step.

Evaluation sets: ``test`` (the training range of non-zero counts), ``easy``, ``hard``, and
``extrapolation`` (more non-zero entries than training saw) when the range stops short of
``n_elems`` (`ponder.data.parity.parity_eval_sets`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ponder.config import ParityConfig
from ponder.tasks.task import Batch, Fusion, Task, TaskDef

if TYPE_CHECKING:
    import torch

__all__ = ["TASK", "build", "eval_set_names"]


def eval_set_names(config: ParityConfig) -> list[str]:
    """test, easy, hard, and extrapolation where training stops short of ``n_elems`` non-zeros."""
    names = ["test", "easy", "hard"]
    return [*names, "extrapolation"] if config.nonzero_range[1] < config.n_elems else names


def build(config: ParityConfig, device: torch.device, data: object | None = None) -> Task:
    """A `ParityStep` PonderNet, fresh batches of ``batch_size`` vectors, the seeded sets; no data."""
    from ponder.data.parity import (  # torch: loaded to build, not to import
        parity_batch,
        parity_eval_sets,
        stream_batches,
        stream_words_per_batch,
    )
    from ponder.model import PonderNet
    from ponder.steps import ParityStep

    if data is not None:
        raise TypeError(f"the parity task makes its own data, got {type(data).__name__}")
    model = PonderNet(ParityStep(config.n_elems, config.n_hidden), config.max_steps).to(device)

    def sample_batch(gen: torch.Generator) -> Batch:
        return parity_batch(config.batch_size, config.n_elems, config.nonzero_range, gen, device)

    def stream_batch(words: torch.Tensor) -> Batch:
        x, y = stream_batches(words, config.batch_size, config.n_elems, *config.nonzero_range)
        return x[0], y[0]

    sets = parity_eval_sets(config.n_elems, config.nonzero_range, config.eval_samples, config.seed, device)
    words = stream_words_per_batch(config.batch_size, config.n_elems)
    return Task(model, sample_batch, sets, words, stream_batch)


TASK: TaskDef[ParityConfig] = TaskDef(
    config=ParityConfig,
    build=build,
    eval_set_names=eval_set_names,
    chance=0.5,  # the answer is one bit
    canonical_sets=("test", "easy", "hard", "extrapolation"),
    fused=Fusion(
        step="ponder.fused.parity:FusedParityStep",
        streams=("counter", "generator"),
        fields=("n_elems",),  # the width of the stacked inputs and of the cell's W_ih
    ),
)
