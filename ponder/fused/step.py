"""`FusedStep`: the twin of a plain `ponder.model.StepFunction` over K members, and
`fused_forward_loss`, the twin of `ponder.trainer.forward_loss`.

A plain PonderNet unrolls one run's step; a fused step unrolls K members' in one set of ops, each
member's weights a row of the group's ``[K, P]`` tensor (`ponder.fused.layout.ParamLayout`), in
the same words:

    plain, one run (`ponder.model.PonderNet.forward`)      fused, K rows (`FusedStep.forward`)
    ctx = step.encode(x)                      [B, ...]     ctx = encode(params, x)         [K, B, ...]
    h_1..h_N = step.unroll(ctx, h_0, N)       [N, B, H]    states = unroll(params, ctx, N) [K, N, B, H]
    y_hat, lambda logits = step.heads(h)      [N, B(, C)]  heads(params, states)           [K, N, B(, C)]

A task's fused step is a subclass (`ponder.fused.parity`, `ponder.fused.mnist`), built from the
plain model (`FusedStep.of`), which reads every plain layer through `ponder.fused.layout.PlainNames`:
the parameters' names are the model's own, and a plain parameter or layer the fused step does not
read stops the group from being built. The subclass also says how its members' batches are drawn
from their counter streams (`FusedStep.stream_loss`, `stream_width`, `row_data`, `shared`); a task
names it in its `ponder.tasks.TaskDef`'s ``fused``.

Shapes: K members (rows), N steps, B samples, H hidden units, C classes, P parameters a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

import torch

from ponder.config import KLDirection, PonderConfig
from ponder.fused.halting import fused_log_halting_distribution
from ponder.fused.layers import Linear
from ponder.fused.layout import ParamLayout, Params, PlainNames
from ponder.fused.loss import Losses, fused_ponder_loss

if TYPE_CHECKING:
    from torch import nn

    from ponder.trainer import Trainer

__all__ = ["FusedStep", "fused_forward_loss", "fused_heads"]


@dataclass(frozen=True)
class FusedStep:
    """K members' `ponder.model.StepFunction` as one batched step: its fields are what it read of
    the plain step (names of the plain parameters, shapes), so that ``torch.compile`` sees
    constants and two groups of the same plain model share one compiled graph."""

    layout: ParamLayout
    """Each member's parameters in its row: the plain model's ``named_parameters()``."""

    ordered: ClassVar[bool] = False
    """Whether `unroll` honours ``active``: eager, a group orders its rows by max_steps (longest
    first) and step n computes the first ``active[n]`` rows only; else every row at every step."""

    @classmethod
    def of(cls, model: nn.Module) -> Self:
        """The fused step of ``model``'s (a `ponder.model.PonderNet`) step. ValueError, in one line
        naming it, for a plain parameter or layer this fused step does not read."""
        names = PlainNames(model, f"{cls.__module__}.{cls.__qualname__}")
        fused = cls(ParamLayout.of(model), **cls.read(model.get_submodule("step"), names))
        names.check()
        return fused

    @classmethod
    def read(cls, step: nn.Module, names: PlainNames) -> dict[str, Any]:
        """The fields of this fused step (besides `layout`) read from the plain ``step``'s layers."""
        raise NotImplementedError

    def encode(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        """Each member's context from its inputs ``x`` ``[K, B, ...]``, once a forward."""
        raise NotImplementedError

    def unroll(
        self,
        params: Params,
        ctx: torch.Tensor,
        n_steps: int,
        masks: torch.Tensor | None = None,
        active: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """h_1 .. h_N ``[K, N, B, H]`` from h_0 = 0; ``masks`` ``[K, N, B, H]``: each step's dropout
        from the counter stream; ``active``: as `ordered` says."""
        raise NotImplementedError

    def heads(self, params: Params, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(y_hat ``[K, N, B(, C)]``, lambda logits ``[K, N, B]``) from the states ``[K, N, B, H]``."""
        raise NotImplementedError

    def forward(
        self,
        params: Params,
        x: torch.Tensor,
        n_steps: int,
        masks: torch.Tensor | None = None,
        active: Sequence[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(y_hat, lambda logits) of K PonderNets unrolled N steps: `ponder.model.PonderNet.forward`."""
        ctx = self.encode(params, x)
        return self.heads(params, self.unroll(params, ctx, n_steps, masks, active))

    # -- how a group draws its rows' batches (the task's counter stream) ---------------------------
    def stream_loss(self, flat: torch.Tensor, *inputs: Any) -> Losses:
        """`fused_forward_loss` on each row's batch drawn from its counter stream at its own
        iteration, every row's by one set of ops, inside what a group compiles:

            stream_loss(flat, base, k0, iterations, *row_data, batch_size,
                        log_prior, beta, max_steps, n_steps, kl_direction, active)

        ``flat`` the rows' weights ``[R, P]``; ``base`` ``[R, W]``, ``k0`` and ``iterations``
        ``[R]``: each row's `ponder.streams.stream_base`, seed key and iteration; ``row_data``:
        this task's per-row inputs (`row_data`)."""
        raise NotImplementedError

    @staticmethod
    def stream_width(config: PonderConfig, n_steps: int) -> int:
        """The stream words a row reads an iteration when the group unrolls ``n_steps``."""
        raise NotImplementedError

    @staticmethod
    def row_data(trainers: Sequence[Trainer | None], device: torch.device) -> tuple[torch.Tensor, ...]:
        """The task's per-row inputs of `stream_loss`, from each row's plain trainer (None: a
        padding row); rebuilt when the group's rows change."""
        return ()

    @staticmethod
    def shared(trainer: Trainer) -> tuple[torch.Tensor, ...]:
        """The tensors a member's batches read that its group holds once: a member must read the
        same objects as the group's first member (`ponder.tasks.Task.stream_data`)."""
        return ()


def fused_heads(params: Params, states: torch.Tensor, output: Linear, halt: Linear) -> torch.Tensor:
    """Both heads of every state in one product, ``[K, N, B, C + 1]`` (the lambda logit last):

    [y_hat, lambda logit] = h [W_y; w_l]^T + [b_y, b_l]"""
    assert output.bias is not None and halt.bias is not None
    members, n_steps, batch, hidden = states.shape
    w_heads = torch.cat([params[output.weight], params[halt.weight]], dim=1)  # [K, C+1, H]
    b_heads = torch.cat([params[output.bias], params[halt.bias]], dim=1)  # [K, C+1]
    flat_states = states.view(members, n_steps * batch, hidden)  # [K, N*B, H]
    heads = torch.baddbmm(b_heads[:, None], flat_states, w_heads.transpose(1, 2))  # [K, N*B, C+1]
    return heads.view(members, n_steps, batch, -1)


def fused_forward_loss(
    step: FusedStep,
    flat: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    masks: torch.Tensor | None,
    log_prior: torch.Tensor,
    beta: torch.Tensor,
    max_steps: torch.Tensor,
    n_steps: int,
    kl_direction: KLDirection,
    active: Sequence[int] | None = None,
) -> Losses:
    """The training forward pass and loss of the rows ``flat`` ``[K, P]`` on their batches ``x``
    ``[K, B, ...]``, ``y`` ``[K, B]`` (``masks``: each step's dropout, `FusedStep.unroll`),
    unrolled ``n_steps`` = N: (L, L_rec, L_reg), each ``[K]``, each member's
    `ponder.trainer.forward_loss` with its own max_steps masked. What a group of generator-stream
    runs compiles; `FusedStep.stream_loss` calls it on counter-stream batches."""
    y_hat, lambda_logits = step.forward(step.layout.unflatten(flat), x, n_steps, masks, active)
    log_p = fused_log_halting_distribution(lambda_logits, max_steps)  # [K, N, B]
    return fused_ponder_loss(y_hat, log_p, y, log_prior, beta, max_steps, kl_direction)
