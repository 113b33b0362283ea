"""A third task defined outside ``ponder/``: is the majority of ``n_bits`` random bits 1?

It shows what a new task is: a config class, a step function, a batch sampler (from a generator,
and from counter-stream words: `ponder.streams`), fixed evaluation sets, their names and a chance
level, put in the registry by `ponder.tasks.register`. Only the
tests that use it register it (`majority_task`), so the rest of the suite sees two tasks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ponder.config import ConfigError, PonderConfig
from ponder.data import EvalSet
from ponder.model import PonderNet, StepFunction
from ponder.tasks import Batch, Task, TaskDef, register, registered, unregister


@dataclass
class MajorityConfig(PonderConfig):
    """The majority of ``n_bits`` uniform random bits (odd: no ties)."""

    task: ClassVar[str] = "majority"

    n_bits: int = 5
    """Bits in an input; odd."""

    def validate(self) -> None:
        super().validate()
        if self.n_bits < 1 or self.n_bits % 2 == 0:
            raise ConfigError(f"n_bits must be odd and >= 1, got {self.n_bits!r}")


class MajorityStep(StepFunction):
    """A GRU cell fed the bits at every step, like parity's, unrolled by the generic loop.

    h_{n+1} = GRU(x, h_n);  y_hat_n = w_y . h_{n+1};  lambda_n = sigmoid(w_l . h_{n+1}).
    """

    def __init__(self, n_bits: int, n_hidden: int) -> None:
        super().__init__()
        self.n_hidden = n_hidden
        self.cell = nn.GRUCell(n_bits, n_hidden)
        self.output = nn.Linear(n_hidden, 1)  # majority logit
        self.halt = nn.Linear(n_hidden, 1)  # lambda logit

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x  # [B, n_bits]

    def initial_state(self, ctx: torch.Tensor) -> torch.Tensor:
        return ctx.new_zeros(ctx.shape[0], self.n_hidden)  # h_0 = 0  # [B, H]

    def transition(self, ctx: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h_next: torch.Tensor = self.cell(ctx, h)
        return h_next

    def heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.output(h).squeeze(-1), self.halt(h).squeeze(-1)


def majority_batch(
    batch_size: int, n_bits: int, generator: torch.Generator, device: torch.device | str = "cpu"
) -> Batch:
    """``(x [B, n_bits] float 0/1, y [B] float 0/1)`` with y = 1 iff sum(x) > n_bits / 2."""
    x = torch.randint(0, 2, (batch_size, n_bits), generator=generator, device=device).float()
    return x, (x.sum(dim=1) > n_bits / 2).float()


def build(config: MajorityConfig, device: torch.device, data: object | None = None) -> Task:
    """The model, fresh batches, and one fixed ``test`` set seeded by ``config.seed``."""
    model = PonderNet(MajorityStep(config.n_bits, config.n_hidden), config.max_steps).to(device)

    def sample_batch(gen: torch.Generator) -> Batch:
        return majority_batch(config.batch_size, config.n_bits, gen, device)

    def stream_batch(words: torch.Tensor) -> Batch:  # the counter stream: a bit a word
        x = (words & 1).view(config.batch_size, config.n_bits).float()  # [B, n_bits]
        return x, (x.sum(dim=1) > config.n_bits / 2).float()

    x, y = majority_batch(config.eval_samples, config.n_bits, torch.Generator().manual_seed(config.seed))
    test = {"test": EvalSet("test", x.to(device), y.to(device))}
    return Task(model, sample_batch, test, config.batch_size * config.n_bits, stream_batch)


TASK: TaskDef[MajorityConfig] = TaskDef(
    config=MajorityConfig,
    build=build,
    eval_set_names=lambda config: ["test"],
    chance=0.5,  # the answer is one bit, 1 half the time
    canonical_sets=("test",),
)


@contextlib.contextmanager
def majority_task() -> Iterator[TaskDef[MajorityConfig]]:
    """The majority task registered inside the block, and gone after it."""
    added = TASK.name not in registered()
    register(TASK)
    try:
        yield TASK
    finally:
        if added:
            unregister(TASK.name)
