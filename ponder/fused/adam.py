"""Adam over the rows of a ``[K, P]`` tensor: K independent Adams, each with its own step count and
learning rate, updated by the same few elementwise ops.

Why not ``torch.optim.Adam`` over the stacked tensor: it keeps one step count per tensor, so its
bias correction 1 - beta^t would be the same for every row, and one learning rate per parameter
group. The members of a fused group joined at different times (one resumed at iteration 4000 next
to one that starts at 0) and have their own learning rates, and a member whose loss is not finite
skips its update without moving its step count. Adam is elementwise, so K Adams over K rows are
the same ops as one, with per-row scalars.

A member's row and its plain trainer's ``torch.optim.Adam`` exchange their state when it joins
(`RowAdam.load`) and when it is checkpointed or leaves (`RowAdam.store`), so its checkpoint is a
plain one.

The math is ``torch.optim.Adam(..., fused=True)``'s (what `ponder.trainer.Trainer` uses), per row
k with t its step count after this update (``amsgrad``, ``maximize`` and weight decay are off):

    m = lerp(m, g, 1 - beta1);  v = beta2 v + (1 - beta2) g^2
    theta = theta - (lr / (1 - beta1^t)) m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["RowAdam"]


class RowAdam:
    """Adam moments for ``capacity`` rows of ``size`` parameters, with a step count per row.

    Everything per row lives on the device (the step counts, the learning rates, which rows
    update), so a step reads nothing back to the host and has the same ops whatever rows update."""

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
        self.steps = torch.zeros(capacity, dtype=torch.float64, device=device)  # [K]
        """Updates made per row: t, the exponent of the bias correction (float64, as torch's
        kernel computes the bias correction in double)."""

    def step_count(self, row: int) -> int:
        """Updates made by ``row`` so far (reads the device)."""
        return int(self.steps[row])

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
    def step(self, params: torch.Tensor, grad: torch.Tensor, update: torch.Tensor, lrs: torch.Tensor) -> None:
        """One Adam step of the rows whose ``update`` ``[K]`` (bool) is True, each at its own lr
        ``[K]`` (float64); the other rows (skipped, free, finished), their moments and step counts
        do not move, whatever their gradient holds (a NaN in a skipped row is never read into an
        update)."""
        beta1, beta2 = self.betas
        mask = update[:, None]  # [K, 1]
        self.steps.add_(update)  # t after this update, for the rows that update
        t = self.steps.clamp(min=1.0)  # rows that never updated: any finite correction, unused
        # lr / (1 - beta1^t) and sqrt(1 - beta2^t) in double, then float32, as torch's kernel
        neg_step = (-lrs / (1 - beta1**t)).float()[:, None]  # [K, 1]
        bc2 = (1 - beta2**t).sqrt().float()[:, None]  # [K, 1]
        g = torch.where(mask, grad, torch.zeros_like(grad))  # rows that do not update read 0, not NaN
        m = torch.lerp(self.exp_avg, g, 1 - beta1)  # [K, P]
        v = self.exp_avg_sq * beta2 + (1 - beta2) * g * g  # [K, P]
        denom = v.sqrt() / bc2 + self.eps  # [K, P]
        new_params = params + neg_step * m / denom  # [K, P]
        params.copy_(torch.where(mask, new_params, params))
        self.exp_avg.copy_(torch.where(mask, m, self.exp_avg))
        self.exp_avg_sq.copy_(torch.where(mask, v, self.exp_avg_sq))

    def load(self, row: int, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> float:
        """Put ``optimizer``'s state of ``params`` (a checkpoint's, or none) into ``row`` and return
        its learning rate (the one the torch Adam would use: a checkpoint's own, as on load).
        ValueError where its betas or eps are not this Adam's."""
        group = optimizer.param_groups[0]
        if tuple(group["betas"]) != self.betas or group["eps"] != self.eps:
            raise ValueError(f"Adam betas {group['betas']} and eps {group['eps']} are not the defaults")
        states = [optimizer.state.get(p) for p in params]
        if all(states):
            m = torch.cat([s["exp_avg"].reshape(-1) for s in states])  # type: ignore[index]
            v = torch.cat([s["exp_avg_sq"].reshape(-1) for s in states])  # type: ignore[index]
            self.reset(row, m, v, int(states[0]["step"]))  # type: ignore[index]
        else:  # no update made yet
            self.reset(row)
        return float(group["lr"])

    def store(self, row: int, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        """Replace ``optimizer``'s state with ``row``'s, the state ``torch.optim.Adam(fused=True)``
        would hold after the same updates of ``params`` (the row's parameters, in order)."""
        optimizer.state.clear()
        step = self.step_count(row)
        if step == 0:  # no update made yet: torch's Adam has no state either
            return
        sizes = [p.numel() for p in params]
        m_rows, v_rows = torch.split(self.exp_avg[row], sizes), torch.split(self.exp_avg_sq[row], sizes)
        for p, m, v in zip(params, m_rows, v_rows, strict=True):
            optimizer.state[p] = {
                "step": torch.tensor(float(step), dtype=torch.float32, device=self.steps.device),
                "exp_avg": m.view(p.shape).clone(),
                "exp_avg_sq": v.view(p.shape).clone(),
            }
