"""A GRU unrolled N steps over one constant input, with a hand-written backward pass.

PonderNet's parity step feeds the same x to a GRU cell at every step. Autograd over N
``GRUCell`` calls records ~20 small ops per step and two weight-gradient matmuls per step;
on a 2-core CPU that overhead, not arithmetic, is most of a training iteration. Here:

- the input projection gi = x W_ih^T + b_ih is computed once, not N times;
- forward is 6 ops a step, backward 4 (the gate derivatives are precomputed for all steps
  at once), on per-step views made before the loop;
- the weight gradients are one large matmul each over all N steps.

Equations (PyTorch's gate order r, z, c -- its "n" gate, called c here; sigma = sigmoid):
    gh_n = h_n W_hh^T + b_hh                                    [B, 3H]
    r = sigma(gi_r + gh_r);  z = sigma(gi_z + gh_z)             [B, H]
    c = tanh(gi_c + r * gh_c)                                   [B, H]
    h_{n+1} = c + z * (h_n - c)        (= (1 - z) c + z h_n)    [B, H]

`gru_unroll` equals N calls of ``nn.GRUCell`` with the same weights; tests check values
and gradients against it.

`gru_unroll_plain` is the same equations in plain tensor ops, with autograd's own backward:
slower eagerly, but visible to ``torch.compile``, which cannot look inside the autograd
Function and so can fuse neither its forward nor its backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import FunctionCtx, once_differentiable

__all__ = ["gru_unroll", "gru_unroll_plain"]


class _ConstantInputGRU(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx,
        x: torch.Tensor,  # [B, I]
        h0: torch.Tensor,  # [B, H]
        w_ih: torch.Tensor,  # [3H, I]
        w_hh: torch.Tensor,  # [3H, H]
        b_ih: torch.Tensor,  # [3H]
        b_hh: torch.Tensor,  # [3H]
        n_steps: int,
    ) -> torch.Tensor:
        batch, hidden = h0.shape
        gi = torch.addmm(b_ih, x, w_ih.t())  # the same at every step                   # [B, 3H]
        # r and z read gi + gh through one matmul a step: fold gi and b_hh into its bias
        rz_bias = gi[:, : 2 * hidden] + b_hh[: 2 * hidden]  # [B, 2H]
        gi_c = gi[:, 2 * hidden :]  # [B, H]
        w_rz, w_c, b_c = w_hh[: 2 * hidden].t(), w_hh[2 * hidden :].t(), b_hh[2 * hidden :]
        out = h0.new_empty(n_steps, batch, hidden)  # h_1 .. h_N                          # [N, B, H]
        rz = h0.new_empty(n_steps, batch, 2 * hidden)  # gates r, z per step            # [N, B, 2H]
        cand = h0.new_empty(n_steps, batch, hidden)  # candidate c per step               # [N, B, H]
        gh_c = h0.new_empty(n_steps, batch, hidden)  # gh's candidate part per step       # [N, B, H]
        h = h0
        # per-step views made once: indexing in the loop costs as much as a small op
        steps = zip(
            out.unbind(0),
            rz.unbind(0),
            rz[..., :hidden].unbind(0),
            rz[..., hidden:].unbind(0),
            cand.unbind(0),
            gh_c.unbind(0),
            strict=True,
        )
        for out_n, rz_n, r_n, z_n, cand_n, gh_c_n in steps:
            torch.addmm(rz_bias, h, w_rz, out=rz_n)  # gi_rz + gh_rz
            torch.sigmoid_(rz_n)  # r, z
            torch.addmm(b_c, h, w_c, out=gh_c_n)  # gh_c
            torch.tanh(torch.addcmul(gi_c, r_n, gh_c_n), out=cand_n)  # c
            torch.lerp(cand_n, h, z_n, out=out_n)  # c + z (h - c)
            h = out_n
        ctx.save_for_backward(x, h0, w_ih, w_hh, out, rz, cand, gh_c)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, h0, w_ih, w_hh, out, rz, cand, gh_c = ctx.saved_tensors
        n_steps, batch, hidden = out.shape
        r, z = rz[..., :hidden], rz[..., hidden:]  # [N, B, H] each
        h_prev = torch.cat([h0[None], out[:-1]])  # h_n for every step                   # [N, B, H]
        # dL/d(pre-activation) = dL/dh_{n+1} * coefficient, computed for all steps at once.
        # Candidate: d h'/dc * tanh'(.) = (1 - z)(1 - c^2)                                # [N, B, H]
        one_minus_z = 1 - z
        c_c = one_minus_z * (1 - cand * cand)
        c_r = c_c * gh_c * r * (1 - r)  # reset gate, through c                       # [N, B, H]
        c_z = (h_prev - cand) * z * one_minus_z  # update gate: d h'/dz * sigma'(.)    # [N, B, H]
        coef_gh = torch.cat([c_r, c_z, c_c * r], dim=2)  # dL/dgh_n / dL/dh_{n+1}    # [N, B, 3H]

        grad_h = grad_out.new_empty(n_steps, batch, hidden)  # dL/dh_{n+1}, all paths  # [N, B, H]
        grad_gh = grad_out.new_empty(n_steps, batch, 3 * hidden)  # dL/dgh_n          # [N, B, 3H]
        grad_h[-1] = grad_out[-1]
        grad_h0 = grad_out.new_empty(batch, hidden)
        grad_h3 = grad_out.new_empty(batch, 3 * hidden)  # dL/dh_{n+1} once per gate     # [B, 3H]
        # per step n: dL/dh_{n+1}, dL/dh_n (the next one to fill), dL/dgh_n, coefficients, z_n,
        # and dL/dh_n from the output directly (zero for h_0)
        grad_h_s, grad_gh_s, coef_s, z_s = grad_h.unbind(0), grad_gh.unbind(0), coef_gh.unbind(0), z.unbind(0)
        prev_s = (grad_h0, *grad_h_s[:-1])
        direct_s = (torch.zeros_like(grad_h0), *grad_out.unbind(0)[:-1])
        for n in range(n_steps - 1, -1, -1):  # backward through time: 4 ops a step
            g = grad_h_s[n]
            torch.cat([g, g, g], dim=1, out=grad_h3)
            torch.mul(coef_s[n], grad_h3, out=grad_gh_s[n])
            # dL/dh_n = (dL/dh_n from the output) + z * dL/dh_{n+1} + dL/dgh_n W_hh
            torch.addmm(torch.addcmul(direct_s[n], g, z_s[n]), grad_gh_s[n], w_hh, out=prev_s[n])

        flat_gh = grad_gh.view(n_steps * batch, 3 * hidden)
        grad_w_hh = flat_gh.t() @ h_prev.view(n_steps * batch, hidden)  # one matmul    # [3H, H]
        grad_b_hh = flat_gh.sum(dim=0)  # [3H]
        # gi is the same at every step: its gradient is the sum over steps. Its r, z parts
        # equal gh's; its candidate part lacks gh's factor r.
        grad_gi = torch.cat([grad_gh[..., : 2 * hidden].sum(dim=0), (grad_h * c_c).sum(dim=0)], dim=1)
        grad_w_ih = grad_gi.t() @ x  # [3H, I]
        grad_b_ih = grad_gi.sum(dim=0)  # [3H]
        grad_x = grad_gi @ w_ih if ctx.needs_input_grad[0] else None  # [B, I]
        return grad_x, grad_h0, grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh, None


def gru_unroll(
    x: torch.Tensor,
    h0: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor,
    b_hh: torch.Tensor,
    n_steps: int,
) -> torch.Tensor:
    """h_1 .. h_N ``[N, B, H]`` of a GRU cell applied N times to the same ``x`` ``[B, I]``."""
    out: torch.Tensor = _ConstantInputGRU.apply(x, h0, w_ih, w_hh, b_ih, b_hh, n_steps)  # type: ignore[no-untyped-call]
    return out


def gru_unroll_plain(
    x: torch.Tensor,
    h0: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor,
    b_hh: torch.Tensor,
    n_steps: int,
) -> torch.Tensor:
    """`gru_unroll` in plain tensor ops, for the compiler to trace, fuse and differentiate."""
    gi_r, gi_z, gi_c = torch.addmm(b_ih, x, w_ih.t()).chunk(3, dim=1)  # once    # [B, H] each
    h, states = h0, []
    for _ in range(n_steps):
        gh_r, gh_z, gh_c = torch.addmm(b_hh, h, w_hh.t()).chunk(3, dim=1)  # [B, H] each
        r = torch.sigmoid(gi_r + gh_r)
        z = torch.sigmoid(gi_z + gh_z)
        c = torch.tanh(gi_c + r * gh_c)
        h = c + z * (h - c)  # (1 - z) c + z h_n
        states.append(h)
    return torch.stack(states)  # [N, B, H]
