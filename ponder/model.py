"""PonderNet: unroll a step function s(x, h) -> (y_hat_n, h_{n+1}, lambda_n) for up to N steps.

Training unrolls all N steps and returns every prediction and log p_n. Inference halts for
real: each sample flips a Bernoulli(lambda_n) coin after every step, and the loop runs only
the samples that have not halted, ending once all have.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from ponder.halting import log_halting_distribution

__all__ = ["HaltedOutput", "PonderNet", "PonderOutput", "StepFunction"]


class StepFunction(nn.Module, ABC):
    """A PonderNet step s(x, h) -> (y_hat, h', lambda_logit), split so the parts vectorise.

    ``encode`` runs once per forward (a CNN embedding, an input projection), ``transition``
    once per step (``unroll`` runs N of them, fused where the step allows), and ``heads``
    maps hidden states of any leading shape to predictions and lambda logits, so training
    can apply it to all N states at once.
    """

    @abstractmethod
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The per-forward context computed once from the input, ``[B, ...]``."""

    @abstractmethod
    def initial_state(self, ctx: torch.Tensor) -> torch.Tensor:
        """h_0, ``[B, H]``."""

    @abstractmethod
    def transition(self, ctx: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """h_{n+1} from the context and h_n, ``[B, H]``."""

    def unroll(
        self, ctx: torch.Tensor, h: torch.Tensor, n_steps: int, masks: torch.Tensor | None = None
    ) -> torch.Tensor:
        """h_1 .. h_N stacked, ``[N, B, H]``; override with a fused kernel where there is one.
        ``masks``: each step's dropout masks ``[N, B, H]`` drawn from the run's counter stream, for a
        step with dropout (`ponder.steps.MnistStep`; None: its own dropout, in training mode)."""
        states = []
        for _ in range(n_steps):
            h = self.transition(ctx, h)
            states.append(h)
        return torch.stack(states)

    @abstractmethod
    def heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(y_hat ``[..., C]`` or ``[...]``, lambda logit ``[...]``) from states ``[..., H]``."""

    def forward(self, ctx: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step: s(x, h_n) -> (y_hat_n, h_{n+1}, lambda_logit_n)."""
        h_next = self.transition(ctx, h)
        y_hat, lambda_logit = self.heads(h_next)
        return y_hat, h_next, lambda_logit


@dataclass
class PonderOutput:
    """A full unroll: every step's prediction and halting probability."""

    y_hat: torch.Tensor
    """Predictions per step, ``[N, B]`` (binary logits) or ``[N, B, C]`` (class logits)."""
    lambda_logits: torch.Tensor
    """Logits of lambda_n, ``[N, B]``; lambda_N is forced to 1 in ``log_p``."""
    log_p: torch.Tensor
    """log p_n, the halting distribution, ``[N, B]``."""


@dataclass
class HaltedOutput:
    """Inference with real early exit."""

    y_hat: torch.Tensor
    """The prediction at each sample's halting step, ``[B]`` or ``[B, C]``."""
    halting_step: torch.Tensor
    """Halting step per sample, counted from 1, ``[B]``."""
    steps_run: int
    """Loop iterations made: calls of the step function on the (shrinking) active batch."""
    sample_steps: int
    """Step evaluations summed over samples: sum of halting steps, the compute spent."""


class PonderNet(nn.Module):
    """Wraps any `StepFunction` with the PonderNet halting mechanism, for ``max_steps`` = N."""

    def __init__(self, step: StepFunction, max_steps: int) -> None:
        super().__init__()
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.step = step
        self.max_steps = max_steps

    def forward(self, x: torch.Tensor, masks: torch.Tensor | None = None) -> PonderOutput:
        """Unroll all N steps (training, and evaluation of every step's accuracy); ``masks``: the
        step's dropout masks ``[N, B, H]`` from the run's counter stream (`StepFunction.unroll`)."""
        ctx = self.step.encode(x)
        states = self.step.unroll(ctx, self.step.initial_state(ctx), self.max_steps, masks)  # [N, B, H]
        # the heads see all N states in one call: y_hat [N, B(, C)], lambda logits [N, B]
        y_hat, lambda_logits = self.step.heads(states)
        return PonderOutput(y_hat, lambda_logits, log_halting_distribution(lambda_logits))

    @torch.no_grad()
    def infer(self, x: torch.Tensor, generator: torch.Generator | None = None) -> HaltedOutput:
        """Predict with real early exit: halted samples leave the batch, the loop ends when all have."""
        ctx = self.step.encode(x)
        h = self.step.initial_state(ctx)
        batch = x.shape[0]
        active = torch.arange(batch, device=x.device)  # indices of samples still pondering
        halting_step = torch.full((batch,), self.max_steps, dtype=torch.long, device=x.device)
        y_out: torch.Tensor | None = None
        steps_run = sample_steps = 0
        for n in range(self.max_steps):
            y_hat, h, lambda_logit = self.step(ctx, h)  # on the active samples only
            steps_run += 1
            sample_steps += int(active.numel())
            if y_out is None:
                y_out = y_hat.new_zeros((batch, *y_hat.shape[1:]))
            if n == self.max_steps - 1:  # lambda_N = 1: everyone left halts here
                halt = torch.ones_like(lambda_logit, dtype=torch.bool)
            else:
                u = torch.rand(lambda_logit.shape, generator=generator, device=lambda_logit.device)
                halt = u < torch.sigmoid(lambda_logit)  # Bernoulli(lambda_n)
            done = active[halt]
            y_out[done] = y_hat[halt]
            halting_step[done] = n + 1
            keep = ~halt
            if not bool(keep.any()):
                break
            active, ctx, h = active[keep], ctx[keep], h[keep]
        assert y_out is not None
        return HaltedOutput(y_out, halting_step, steps_run, sample_steps)
