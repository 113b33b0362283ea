"""The halting distribution of K members, each halting for sure at its own max_steps, and their
priors padded to the group's N: the fused twins of `ponder.halting.log_halting_distribution` and
`ponder.halting.log_geometric_prior`'s output, shared by every task's fused step.

Per-member ``max_steps`` N_k: the group unrolls N = max_k N_k steps. Member k's lambda is forced to
1 at its own step N_k and its p is 0 past it: log p = -inf there, kept out of every loss term
(`ponder.fused.loss`: no 0 * -inf, no NaN gradient). Its first N_k entries are what its plain run
computes; a step's states past N_k are never read.

Shapes: K members (rows), N steps, B samples.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["fused_log_halting_distribution", "padded_log_prior"]


def fused_log_halting_distribution(lambda_logits: torch.Tensor, max_steps: torch.Tensor) -> torch.Tensor:
    """log p_n ``[K, N, B]`` from lambda's logits ``[K, N, B]``, member k halting for sure at its
    own step ``max_steps[k]`` (``[K]``, each <= N) and never after (log p = -inf there).

    p_n = lambda_n prod_{j<n} (1 - lambda_j), lambda_{N_k} = 1, p_n = 0 for n > N_k: each member's
    sum_n p_n = 1, and its first N_k entries are `ponder.halting.log_halting_distribution`'s.
    """
    n_steps = lambda_logits.shape[1]
    n = torch.arange(n_steps, device=lambda_logits.device)  # 0-based step index n - 1  # [N]
    last = n[None, :] == (max_steps - 1)[:, None]  # member k's last step  # [K, N]
    after = n[None, :] >= max_steps[:, None]  # past it  # [K, N]
    # log lambda_n = logsigmoid(l_n);  log(1 - lambda_n) = log lambda_n - l_n  # [K, N, B]
    log_lambda = F.logsigmoid(lambda_logits)
    log_not_lambda = log_lambda - lambda_logits
    log_lambda = log_lambda.masked_fill(last[..., None], 0.0)  # lambda_{N_k} = 1
    # log prod_{j<n} (1 - lambda_j): an exclusive cumulative sum over steps  # [K, N, B]
    log_survival = torch.cumsum(log_not_lambda, dim=1) - log_not_lambda
    # p_n = 0 past N_k; masked_fill's gradient there is 0, so nothing flows into those steps
    return (log_lambda + log_survival).masked_fill(after[..., None], -math.inf)


def padded_log_prior(log_prior: torch.Tensor, n_steps: int) -> torch.Tensor:
    """A member's log prior ``[N_k]`` (`ponder.halting.log_geometric_prior`) padded with zeros to
    ``[N]``: the padding is never read (`ponder.fused.loss.fused_halting_loss` masks steps past N_k)."""
    return F.pad(log_prior, (0, n_steps - log_prior.shape[0]))
