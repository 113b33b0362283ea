"""Parity's fused step: `ponder.steps.ParityStep` for K members, its GRU batched over rows.

    plain `ponder.steps.ParityStep`, one run             fused `FusedParityStep`, K rows
    encode  ctx = x                       [B, I]         ctx = x                          [K, B, I]
    unroll  h_{n+1} = GRU(x, h_n)         [N, B, H]      `gru_unroll`, batched baddbmm   [K, N, B, H]
            (`ponder.gru.gru_unroll`)
    heads   y_hat = w_y . h, logit = w_l . h             both in one product (`fused_heads`)

Why: a parity trial's model is tiny (a GRU step of 64 units, batch 128), so one training iteration
is mostly per-op overhead, not arithmetic. K members stepped by one set of batched ops pay that
overhead once (``bench/fused_speed.py`` measures it).

``torch.func.vmap`` over the plain model does not fit: its GRU (`ponder.gru.gru_unroll`) is an
autograd Function writing into preallocated outputs, which vmap cannot batch. The GRU here is the
same equations in plain batched ops, differentiated by autograd and traceable by ``torch.compile``.
Its first N_k steps of member k are what its plain run computes: the GRU is causal, so the steps it
runs past N_k change nothing before (`ponder.fused.halting`).

Each row's batch comes from its counter stream, drawn for all rows inside the loss
(`FusedParityStep.stream_loss`, `ponder.data.parity.stream_batches`); a group of generator-stream
runs (made before counter streams) draws one batch a member outside it and runs
`ponder.fused.step.fused_forward_loss`.

Shapes: K members (rows), N steps, B samples, I = n_elems inputs, H hidden units.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ponder.config import KLDirection, ParityConfig, PonderConfig
from ponder.data.parity import stream_batches, stream_words_per_batch
from ponder.fused.layers import Linear
from ponder.fused.layout import Params, PlainNames
from ponder.fused.loss import Losses
from ponder.fused.step import FusedStep, fused_forward_loss, fused_heads
from ponder.streams import iteration_keys, stream_words

if TYPE_CHECKING:
    from ponder.trainer import Trainer

__all__ = ["FusedParityStep", "gru_unroll"]


def gru_unroll(
    x: torch.Tensor,  # [K, B, I]
    w_ih: torch.Tensor,  # [K, 3H, I]
    w_hh: torch.Tensor,  # [K, 3H, H]
    b_ih: torch.Tensor,  # [K, 3H]
    b_hh: torch.Tensor,  # [K, 3H]
    n_steps: int,
    active: Sequence[int] | None = None,
) -> torch.Tensor:
    """h_1 .. h_N ``[K, N, B, H]`` of K GRU cells, each applied N times to its own constant input,
    from h_0 = 0: `ponder.gru.gru_unroll`'s equations (PyTorch's gate order r, z, c), batched over K.

        gi = x W_ih^T + b_ih (once);  gh_n = h_n W_hh^T + b_hh
        r = sigma(gi_r + gh_r);  z = sigma(gi_z + gh_z);  c = tanh(gi_c + r * gh_c)
        h_{n+1} = c + z (h_n - c)

    ``active`` (``[N]``, non-increasing): step n is computed for the first ``active[n]`` rows only,
    the others keep their last state. With the rows ordered by max_steps, longest first, a member
    whose own N_k is short stops costing arithmetic after its step N_k (its later states are never
    read: p is 0 there). None: every row at every step (one shape, as ``torch.compile`` wants).
    """
    members, batch, _ = x.shape
    hidden = w_hh.shape[2]
    gi = torch.baddbmm(b_ih[:, None], x, w_ih.transpose(1, 2))  # the same at every step  # [K, B, 3H]
    # r and z read gi + gh through one matmul a step: fold gi and b_hh into its bias
    rz_bias = gi[..., : 2 * hidden] + b_hh[:, None, : 2 * hidden]  # [K, B, 2H]
    gi_c = gi[..., 2 * hidden :]  # [K, B, H]
    w_t = w_hh.transpose(1, 2).contiguous()  # W_hh^T once, not a strided read a step      # [K, H, 3H]
    w_rz, w_c, b_c = w_t[..., : 2 * hidden], w_t[..., 2 * hidden :], b_hh[:, None, 2 * hidden :]
    h = x.new_zeros(members, batch, hidden)  # h_0 of the rows still stepping  # [k, B, H]
    done = h[:0]  # the last states of the rows past their own N_k, in row order  # [K - k, B, H]
    states = []
    for n in range(n_steps):
        k = members if active is None else active[n]  # rows still inside their own max_steps
        if k < h.shape[0]:  # rows k.. end here: keep their last state, slice the rest (once)
            done = torch.cat([h[k:], done])
            h, rz_bias, gi_c, w_rz, w_c, b_c = (t[:k] for t in (h, rz_bias, gi_c, w_rz, w_c, b_c))
        r, z = torch.sigmoid(torch.baddbmm(rz_bias, h, w_rz)).chunk(2, dim=2)  # [k, B, H] each
        c = torch.tanh(torch.addcmul(gi_c, r, torch.baddbmm(b_c, h, w_c)))  # [k, B, H]
        h = torch.lerp(c, h, z)  # c + z (h - c)  # [k, B, H]
        states.append(h if k == members else torch.cat([h, done]))  # [K, B, H]
    return torch.stack(states, dim=1)  # [K, N, B, H]


@dataclass(frozen=True)
class FusedParityStep(FusedStep):
    """`ponder.steps.ParityStep` over K rows: a GRU cell fed each member's parity vector at every
    step, linear heads reading h. Draws its rows' batches from their counter streams."""

    cell: tuple[str, str, str, str]
    """The plain ``step.cell``'s (weight_ih, weight_hh, bias_ih, bias_hh)."""
    output: Linear
    halt: Linear
    inputs: int
    """I, the inputs the cell reads (n_elems)."""

    ordered = True

    @classmethod
    def read(cls, step: nn.Module, names: PlainNames) -> dict[str, Any]:
        cell = step.get_submodule("cell")
        names.layer(cell, nn.GRUCell)
        assert isinstance(cell, nn.GRUCell)
        weights = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
        return {
            "cell": tuple(names.param(w) for w in weights),
            "output": Linear.read(step.get_submodule("output"), names),
            "halt": Linear.read(step.get_submodule("halt"), names),
            "inputs": cell.input_size,
        }

    def encode(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        """The parity vectors themselves, ``[K, B, I]``."""
        return x

    def unroll(
        self,
        params: Params,
        ctx: torch.Tensor,
        n_steps: int,
        masks: torch.Tensor | None = None,
        active: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """N GRU steps on each row's input (`gru_unroll`), ``[K, N, B, H]``; no dropout."""
        w_ih, w_hh, b_ih, b_hh = (params[name] for name in self.cell)
        return gru_unroll(ctx, w_ih, w_hh, b_ih, b_hh, n_steps, active)

    def heads(self, params: Params, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(parity logits, lambda logits), each ``[K, N, B]``."""
        heads = fused_heads(params, states, self.output, self.halt)  # [K, N, B, 2]
        return heads[..., 0], heads[..., 1]

    def stream_loss(
        self,
        flat: torch.Tensor,
        base: torch.Tensor,
        k0: torch.Tensor,
        iterations: torch.Tensor,
        low: torch.Tensor,
        high: torch.Tensor,
        batch_size: int,
        log_prior: torch.Tensor,
        beta: torch.Tensor,
        max_steps: torch.Tensor,
        n_steps: int,
        kl_direction: KLDirection,
        active: Sequence[int] | None = None,
    ) -> Losses:
        """`fused_forward_loss` on each row's counter-stream batch (`FusedStep.stream_loss`);
        ``low``, ``high`` ``[R]``: each row's non-zero range."""
        words = stream_words(base, iteration_keys(k0, iterations))  # [R, W]
        x, y = stream_batches(words, batch_size, self.inputs, low, high)  # [R, B, I], [R, B]
        return fused_forward_loss(
            self, flat, x, y, None, log_prior, beta, max_steps, n_steps, kl_direction, active
        )

    @staticmethod
    def stream_width(config: PonderConfig, n_steps: int) -> int:
        assert isinstance(config, ParityConfig)
        return stream_words_per_batch(config.batch_size, config.n_elems)

    @staticmethod
    def row_data(trainers: Sequence[Trainer | None], device: torch.device) -> tuple[torch.Tensor, ...]:
        """Each row's non-zero range ``(low [R], high [R])`` (padding rows: 1, 1)."""
        ranges = [
            t.config.nonzero_range if t is not None and isinstance(t.config, ParityConfig) else (1, 1)
            for t in trainers
        ]
        low = torch.tensor([lo for lo, _ in ranges], device=device)
        return low, torch.tensor([hi for _, hi in ranges], device=device)
