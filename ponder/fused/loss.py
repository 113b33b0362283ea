"""PonderNet's loss for K members at once, each reading only its own row: the fused twins of
`ponder.losses.per_step_cross_entropy` and `ponder.trainer.ponder_loss`, shared by every task's
fused step.

A member's loss reads only its own rows, so a NaN in one member reaches no other member's loss or
gradient; steps past a member's own max_steps N_k (p = 0, log p = -inf:
`ponder.fused.halting.fused_log_halting_distribution`) are kept out of every term.

Shapes: K members (rows), N steps, B samples, C classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ponder.config import KLDirection

__all__ = ["Losses", "fused_halting_loss", "fused_per_step_cross_entropy", "fused_ponder_loss"]

Losses = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""(L, L_rec, L_reg), each ``[K]``."""


def fused_per_step_cross_entropy(y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """L(y, y_hat_n) for every member, step and sample, ``[K, N, B]``: binary logits ``[K, N, B]``
    against 0/1 targets ``[K, B]`` (parity), or class logits ``[K, N, B, C]`` against class indices
    ``[K, B]`` (MNIST), as `ponder.losses.per_step_cross_entropy` decides for one run."""
    if y_hat.dim() == 3:  # binary: BCE with logits, y broadcast over steps  # [K, N, B]
        return F.binary_cross_entropy_with_logits(y_hat, y[:, None, :].expand_as(y_hat), reduction="none")
    members, n_steps, batch, classes = y_hat.shape
    labels = y[:, None, :].expand(members, n_steps, batch)  # [K, N, B]
    flat = F.cross_entropy(y_hat.reshape(-1, classes), labels.reshape(-1), reduction="none")  # [K*N*B]
    return flat.view(members, n_steps, batch)


def fused_halting_loss(
    step_losses: torch.Tensor,
    log_p: torch.Tensor,
    log_prior: torch.Tensor,
    beta: torch.Tensor,
    max_steps: torch.Tensor,
    kl_direction: KLDirection,
) -> Losses:
    """(L, L_rec, L_reg), each ``[K]``, from each step's loss L(y, y_hat_n) and log p ``[K, N, B]``,
    log priors ``[K, N]`` (`ponder.fused.halting.padded_log_prior`), beta ``[K]`` and max_steps
    ``[K]``.

        L_rec = mean_b sum_{n <= N_k} p_n L(y, y_hat_n);   L = L_rec + beta L_reg
        L_reg = KL(p || p_G) = sum_{n <= N_k} p_n (log p_n - log p_G,n)          (forward)
                KL(p_G || p) = sum_{n <= N_k} p_G,n (log p_G,n - log p_n)        (reverse)
    """
    n_steps = log_p.shape[1]
    n = torch.arange(n_steps, device=log_p.device)  # [N]
    valid = (n[None, :] < max_steps[:, None])[..., None]  # steps <= N_k  # [K, N, 1]
    # log p with the -inf past N_k made 0: no 0 * -inf below; p itself is exactly 0 there
    log_p_kept = log_p.masked_fill(~valid, 0.0)  # [K, N, B]
    p = log_p.exp()  # [K, N, B]
    rec = (p * step_losses).sum(dim=1).mean(dim=1)  # [K]
    log_q = log_prior[..., None]  # [K, N, 1], broadcast over the batch
    if kl_direction == "forward":
        kl = (p * (log_p_kept - log_q)).sum(dim=1)  # [K, B]
    elif kl_direction == "reverse":
        terms = log_q.exp() * (log_q - log_p_kept)  # [K, N, B]
        kl = torch.where(valid, terms, torch.zeros_like(terms)).sum(dim=1)  # [K, B]
    else:
        raise ValueError(f"direction must be forward or reverse, got {kl_direction!r}")
    reg = kl.mean(dim=1)  # [K]
    return rec + beta * reg, rec, reg


def fused_ponder_loss(
    y_hat: torch.Tensor,
    log_p: torch.Tensor,
    y: torch.Tensor,
    log_prior: torch.Tensor,
    beta: torch.Tensor,
    max_steps: torch.Tensor,
    kl_direction: KLDirection,
) -> Losses:
    """(L, L_rec, L_reg), each ``[K]``: every member's `ponder.trainer.ponder_loss`, from its
    predictions ``[K, N, B(, C)]`` and log p ``[K, N, B]``, labels ``[K, B]``, log priors ``[K, N]``,
    beta ``[K]`` and max_steps ``[K]``."""
    step_losses = fused_per_step_cross_entropy(y_hat, y)  # L(y, y_hat_n)  # [K, N, B]
    return fused_halting_loss(step_losses, log_p, log_prior, beta, max_steps, kl_direction)
