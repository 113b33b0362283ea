"""A third task defined outside ``ponder/``: is the majority of ``n_bits`` random bits 1?

It shows what a new task is: a config class, a step function, a batch sampler (from a generator,
and from counter-stream words: `ponder.streams`), fixed evaluation sets, their names and a chance
level, put in the registry by `ponder.tasks.register`. Only the
tests that use it register it (`majority_task`), so the rest of the suite sees two tasks.

It trains fused too, declared in this module only: its fused step (`FusedMajorityStep`, parity's
GRU twin with its own counter-stream batches) named in its `TaskDef`'s ``fused``, with the field
its groups share besides every task's (``n_bits``). Nothing in ``ponder/`` names it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ponder.config import ConfigError, KLDirection, PonderConfig
from ponder.data import EvalSet
from ponder.fused.loss import Losses
from ponder.fused.parity import FusedParityStep
from ponder.fused.step import fused_forward_loss
from ponder.model import PonderNet, StepFunction
from ponder.streams import iteration_keys, stream_words
from ponder.tasks import Batch, Fusion, Task, TaskDef, register, registered, unregister


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

    def stream_batch(words: torch.Tensor) -> Batch:  # the counter stream: a bit a word  # [1, W]
        x, y = stream_bits(words, config.batch_size, config.n_bits)
        return x[0], y[0]  # [B, n_bits], [B]

    x, y = majority_batch(config.eval_samples, config.n_bits, torch.Generator().manual_seed(config.seed))
    test = {"test": EvalSet("test", x.to(device), y.to(device))}
    return Task(model, sample_batch, test, config.batch_size * config.n_bits, stream_batch)


def stream_bits(words: torch.Tensor, batch_size: int, n_bits: int) -> Batch:
    """K runs' batches ``(x [K, B, n_bits], y [K, B])`` from their words ``[K, B * n_bits]``: a bit a word."""
    x = (words & 1).view(words.shape[0], batch_size, n_bits).float()  # [K, B, n_bits]
    return x, (x.sum(dim=2) > n_bits / 2).float()


@dataclass(frozen=True)
class FusedMajorityStep(FusedParityStep):
    """`MajorityStep` over K rows: the same layers as parity's step (a GRU cell, two linear
    heads), so parity's twin; each row's batch drawn from its counter stream as `build`'s is."""

    def stream_loss(
        self,
        flat: torch.Tensor,
        base: torch.Tensor,
        k0: torch.Tensor,
        iterations: torch.Tensor,
        batch_size: int,
        log_prior: torch.Tensor,
        beta: torch.Tensor,
        max_steps: torch.Tensor,
        n_steps: int,
        kl_direction: KLDirection,
        active: Sequence[int] | None = None,
    ) -> Losses:
        words = stream_words(base, iteration_keys(k0, iterations))  # [K, B * n_bits]
        x, y = stream_bits(words, batch_size, self.inputs)  # [K, B, n_bits], [K, B]
        return fused_forward_loss(
            self, flat, x, y, None, log_prior, beta, max_steps, n_steps, kl_direction, active
        )

    @staticmethod
    def stream_width(config: PonderConfig, n_steps: int) -> int:
        assert isinstance(config, MajorityConfig)
        return config.batch_size * config.n_bits

    @staticmethod
    def row_data(trainers: Sequence[object], device: torch.device) -> tuple[torch.Tensor, ...]:
        return ()  # a batch reads its words only (parity's reads each row's non-zero range)


TASK: TaskDef[MajorityConfig] = TaskDef(
    config=MajorityConfig,
    build=build,
    eval_set_names=lambda config: ["test"],
    chance=0.5,  # the answer is one bit, 1 half the time
    canonical_sets=("test",),
    fused=Fusion(
        step="tests.ponder.majority:FusedMajorityStep",
        streams=("counter", "generator"),
        fields=("n_bits",),  # the width of the stacked inputs
    ),
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
