"""PonderNet's loss: L = L_rec + beta * L_reg.

L_rec = sum_n p_n L(y, y_hat_n)          (reconstruction, weighted by the halting distribution)
L_reg = KL(p || p_G(lambda_p))           (regularisation towards the geometric prior)

Both are vectorised over steps and samples and take log p, never p.log().
Shapes: N = max_steps, B = batch size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ponder.config import KLDirection

__all__ = [
    "KLDirection",
    "kl_to_prior",
    "per_step_cross_entropy",
    "reconstruction_loss",
]


def per_step_cross_entropy(y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """L(y, y_hat_n) for every step and sample, ``[N, B]``.

    ``y_hat`` ``[N, B]`` holds binary logits (parity) and ``y`` ``[B]`` 0/1 targets, or
    ``y_hat`` ``[N, B, C]`` holds class logits (MNIST) and ``y`` ``[B]`` class indices.
    """
    n_steps = y_hat.shape[0]
    if y_hat.dim() == 2:  # binary: BCE with logits, y broadcast over steps            # [N, B]
        return F.binary_cross_entropy_with_logits(
            y_hat, y.to(y_hat.dtype).expand(n_steps, -1), reduction="none"
        )
    # multi-class: flatten steps into the batch, cross-entropy, unflatten               # [N, B]
    flat = F.cross_entropy(y_hat.flatten(0, 1), y.repeat(n_steps), reduction="none")
    return flat.view(n_steps, -1)


def reconstruction_loss(log_p: torch.Tensor, step_losses: torch.Tensor) -> torch.Tensor:
    """L_rec = mean_b sum_n p_n,b L_n,b, from ``log_p`` and ``step_losses``, both ``[N, B]``."""
    # weight each step's loss by the probability of halting there, sum steps, mean batch
    return (log_p.exp() * step_losses).sum(dim=0).mean()


def kl_to_prior(
    log_p: torch.Tensor, log_prior: torch.Tensor, direction: KLDirection = "forward"
) -> torch.Tensor:
    """L_reg: the KL divergence between p ``[N, B]`` and the prior ``[N]``, mean over batch.

    forward: KL(p || p_G) = sum_n p_n (log p_n - log p_G,n)       (the paper)
    reverse: KL(p_G || p) = sum_n p_G,n (log p_G,n - log p_n)     (the reference KLDivLoss(p.log(), p_g))
    """
    log_q = log_prior.to(log_p.dtype)[:, None]  # [N, 1], broadcast over the batch
    if direction == "forward":
        kl = (log_p.exp() * (log_p - log_q)).sum(dim=0)  # [B]
    elif direction == "reverse":
        kl = (log_q.exp() * (log_q - log_p)).sum(dim=0)  # [B]
    else:
        raise ValueError(f"direction must be forward or reverse, got {direction!r}")
    return kl.mean()
