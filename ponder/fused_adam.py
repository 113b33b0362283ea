"""Adam over the rows of a ``[K, P]`` tensor: K independent Adams, each with its own step count and
learning rate, updated by the same few elementwise ops.

Why not ``torch.optim.Adam`` over the stacked tensor: it keeps one step count per tensor, so its
bias correction 1 - beta^t would be the same for every row, and one learning rate per parameter
group. The members of a fused group joined at different times (one resumed at iteration 4000 next
to one that starts at 0) and have their own learning rates, and a member whose loss is not finite
skips its update without moving its step count. Adam is elementwise, so K Adams over K rows are
the same ops as one, with per-row scalars.

The math is ``torch.optim.Adam(..., fused=True)``'s (what `ponder.trainer.Trainer` uses), per row
k with t its step count after this update (``amsgrad``, ``maximize`` and weight decay are off):

    m = lerp(m, g, 1 - beta1);  v = beta2 v + (1 - beta2) g^2
    theta = theta - (lr / (1 - beta1^t)) m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
"""

from __future__ import annotations

import math

import torch

__all__ = ["RowAdam"]


class RowAdam:
    """Adam moments for ``capacity`` rows of ``size`` parameters, with a step count per row."""

    def __init__(
        self,
        capacity: int,
        size: int,
        device: torch.device,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.betas = betas
        self.eps = eps
        self.exp_avg = torch.zeros(capacity, size, device=device)  # m  # [K, P]
        self.exp_avg_sq = torch.zeros(capacity, size, device=device)  # v  # [K, P]
        self.steps = [0] * capacity
        """Updates made per row: t, the exponent of the bias correction."""

    def reset(
        self,
        row: int,
        exp_avg: torch.Tensor | None = None,
        exp_avg_sq: torch.Tensor | None = None,
        step: int = 0,
    ) -> None:
        """Give ``row`` a fresh Adam (zero moments, step 0) or the moments ``[P]`` and step count
        of one restored from a checkpoint."""
        self.exp_avg[row] = 0.0 if exp_avg is None else exp_avg
        self.exp_avg_sq[row] = 0.0 if exp_avg_sq is None else exp_avg_sq
        self.steps[row] = step

    @torch.no_grad()
    def step(self, params: torch.Tensor, grad: torch.Tensor, update: list[bool], lrs: list[float]) -> None:
        """One Adam step of the rows whose ``update`` is True, each at its own lr; the other rows
        (skipped, free, finished), their moments and step counts do not move, whatever their
        gradient holds (a NaN in a skipped row is never read into an update)."""
        beta1, beta2 = self.betas
        rows = [k for k, u in enumerate(update) if u]
        if not rows:
            return
        step_size, bc2_sqrt = [0.0] * len(update), [1.0] * len(update)
        for k in rows:
            self.steps[k] += 1
            t = self.steps[k]
            step_size[k] = lrs[k] / (1 - beta1**t)  # lr / (1 - beta1^t), in double as torch's kernel
            bc2_sqrt[k] = math.sqrt(1 - beta2**t)
        dev = params.device
        mask = torch.tensor(update, device=dev)[:, None]  # [K, 1]
        neg_step = torch.tensor([-s for s in step_size], device=dev)[:, None]  # [K, 1]
        bc2 = torch.tensor(bc2_sqrt, device=dev)[:, None]  # [K, 1]
        g = torch.where(mask, grad, torch.zeros_like(grad))  # rows that do not update read 0, not NaN
        m = torch.lerp(self.exp_avg, g, 1 - beta1)  # [K, P]
        v = self.exp_avg_sq * beta2 + (1 - beta2) * g * g  # [K, P]
        denom = v.sqrt() / bc2 + self.eps  # [K, P]
        new_params = params + neg_step * m / denom  # [K, P]
        params.copy_(torch.where(mask, new_params, params))
        self.exp_avg.copy_(torch.where(mask, m, self.exp_avg))
        self.exp_avg_sq.copy_(torch.where(mask, v, self.exp_avg_sq))
