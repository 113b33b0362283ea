"""The halting distribution p_n, its sampling, and the geometric prior p_G.

Everything is computed in log space from lambda's *logits*: a saturated lambda (logit +-60)
gives p_n = 0 in the product formula and log(0) = -inf, but log-sigmoid stays finite, so the
losses and their gradients stay finite too.

Shapes: N = max_steps, B = batch size. Step tensors are step-major, ``[N, B]``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ponder.config import PriorTail

__all__ = [
    "NO_STEP",
    "HaltingAccuracies",
    "PriorTail",
    "expected_steps",
    "halting_accuracies",
    "halting_distribution",
    "log_geometric_prior",
    "log_halting_distribution",
    "sample_halting_step",
]


def log_halting_distribution(lambda_logits: torch.Tensor) -> torch.Tensor:
    """log p_n for every step from lambda's logits ``[N, B]``; the last step halts for sure.

    p_n = lambda_n * prod_{j<n} (1 - lambda_j), with lambda_N = 1, so sum_n p_n = 1 exactly.
    """
    n_steps = lambda_logits.shape[0]
    # log lambda_n = logsigmoid(l_n);  log(1 - lambda_n) = logsigmoid(-l_n) = log lambda_n - l_n
    log_lambda = F.logsigmoid(lambda_logits)  # [N, B]
    log_not_lambda = log_lambda - lambda_logits  # [N, B]
    # lambda_N = 1: the last step halts whatever its logit says
    last = torch.arange(n_steps, device=lambda_logits.device) == n_steps - 1  # [N]
    log_lambda = log_lambda.masked_fill(last[:, None], 0.0)
    # log prod_{j<n} (1 - lambda_j): an exclusive cumulative sum over steps          # [N, B]
    log_survival = torch.cumsum(log_not_lambda, dim=0) - log_not_lambda
    # log p_n = log lambda_n + sum_{j<n} log(1 - lambda_j)                          # [N, B]
    return log_lambda + log_survival


def halting_distribution(lambda_logits: torch.Tensor) -> torch.Tensor:
    """p_n ``[N, B]`` from lambda's logits; sums to 1 over steps for every sample."""
    return log_halting_distribution(lambda_logits).exp()


def log_geometric_prior(lambda_p: float, max_steps: int, tail: PriorTail = "renormalise") -> torch.Tensor:
    """log p_G(n; lambda_p) for n = 1..N, shape ``[N]``.

    p_G(n) = lambda_p (1 - lambda_p)^(n-1) has infinite support; at N steps a mass of
    (1 - lambda_p)^N lies beyond step N (0.012 for lambda_p 0.2, N 20). ``tail`` says where it goes:

    - ``renormalise`` (default): divide by 1 - (1 - lambda_p)^N. The prior stays a proper
      distribution and keeps the geometric shape (every step less likely than the one before),
      so KL(p || p_G) >= 0 with equality only at p = p_G.
    - ``last_step``: give the tail to step N, i.e. the prior is the halting process with
      lambda_n = lambda_p and lambda_N = 1 -- the same constraint the model has. Proper too.
    - ``truncate``: drop it (the reference code's choice). Sums to less than 1, so the "KL" can be
      negative; kept only to reproduce the reference curves.
    """
    if not 0.0 < lambda_p <= 1.0:
        raise ValueError(f"lambda_p must be in (0, 1], got {lambda_p}")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    n = torch.arange(max_steps, dtype=torch.float64)  # n - 1 = 0 .. N-1              # [N]
    log_stay = math.log1p(-lambda_p) if lambda_p < 1.0 else -math.inf
    # log p_G(n) = log lambda_p + (n - 1) log(1 - lambda_p); 0 * -inf is 0 at n = 1   # [N]
    log_p = math.log(lambda_p) + torch.where(n > 0, n * log_stay, torch.zeros_like(n))
    if tail == "renormalise":
        # divide by the mass kept: 1 - (1 - lambda_p)^N
        log_p = log_p - math.log(-math.expm1(max_steps * log_stay)) if lambda_p < 1.0 else log_p
    elif tail == "last_step":
        # p_G(N) = (1 - lambda_p)^(N-1): the probability of reaching step N at all
        log_p[-1] = (max_steps - 1) * log_stay if max_steps > 1 else 0.0
    elif tail != "truncate":
        raise ValueError(f"tail must be renormalise, last_step or truncate, got {tail!r}")
    return log_p.float()


NO_STEP = -1
"""What `sample_halting_step` returns for a sample whose p is not a distribution (NaN in it)."""


def sample_halting_step(log_p: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw a halting step n ~ p per sample; returns 0-based step indices ``[B]``, or `NO_STEP`
    for a sample whose log p has a NaN, a +inf or no finite entry (a diverged model's).

    Sampling n from the categorical p is the same law as flipping Bernoulli(lambda_n) coins
    step by step until one lands, which is what `PonderNet.infer` does with real early exit.
    An arg-max over NaN picks index 0: without the check a diverged model would "halt at step 1"
    and look like the most frugal ponderer there is.
    """
    # Gumbel-max: argmax_n (log p_n + g_n), g ~ Gumbel(0, 1)                           # [N, B]
    u = torch.rand(log_p.shape, generator=generator, device=log_p.device, dtype=log_p.dtype)
    gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
    step = torch.argmax(log_p + gumbel, dim=0)  # [B]
    # a distribution: no NaN, no +inf, some step with p_n > 0                               # [B]
    ok = ~(torch.isnan(log_p) | (log_p == math.inf)).any(dim=0) & torch.isfinite(log_p).any(dim=0)
    return torch.where(ok, step, torch.full_like(step, NO_STEP))


def expected_steps(log_p: torch.Tensor) -> torch.Tensor:
    """E[n] = sum_n n p_n per sample ``[B]``, steps counted from 1."""
    n = torch.arange(1, log_p.shape[0] + 1, device=log_p.device, dtype=log_p.dtype)  # [N]
    return (log_p.exp() * n[:, None]).sum(dim=0)


class HaltingAccuracies(NamedTuple):
    """Three accuracies of one evaluation set; NaN where the model gave no answer (see
    `halting_accuracies`)."""

    halted: float
    """Right at the halting step drawn from p: what the model answers when it ponders."""
    best_step: float
    """The best per-step accuracy over n = 1..N: what the network knows without choosing a step."""
    stable: float
    """Right at the drawn halting step and at every later step up to N."""


def halting_accuracies(correct: torch.Tensor, step: torch.Tensor) -> HaltingAccuracies:
    """Halted, best-step and stable accuracy from per-step correctness ``[N, B]`` (1. right, 0.
    wrong, NaN no answer) and the drawn halting steps ``[B]`` (0-based, `NO_STEP` allowed).

    Why all three: a network can be right at its halting step because of *where* it halts (hard
    inputs stopped at the one step whose answer happens to be right) while no step's answer is
    right on its own. Then halted accuracy is far above both best-step accuracy (no single step
    knows the answer) and stable accuracy (the answer degrades if it ponders on). Honest
    pondering has all three close: stable <= halted always (the same drawn step, and more to be
    right at), and stable <= the last step's accuracy <= best-step accuracy.

    NaN rules, as for halted accuracy: halted and stable accuracy are NaN when some sample has no
    halting step (its p is not a distribution) or a NaN answer at a step they count; best-step
    accuracy is NaN when some step's accuracy is (a non-finite prediction is no answer, and the
    best of the steps that do answer would hide it).
    """
    # best_step = max_n 1/B sum_b c[n, b]; amax keeps a NaN step's NaN
    best_step = float(correct.mean(dim=1).amax())
    if not bool((step >= 0).all()):  # a p that is not a distribution: no halting step to judge
        return HaltingAccuracies(math.nan, best_step, math.nan)
    # halted = 1/B sum_b c[s_b, b]
    halted = correct.gather(0, step[None]).squeeze(0)  # [B]
    # stable = 1/B sum_b prod_{n >= s_b} c[n, b] = 1/B sum_b min_{n >= s_b} c[n, b]: the steps
    # before s_b count as right, and amin keeps a NaN
    later = torch.arange(correct.shape[0], device=correct.device)[:, None] >= step[None, :]  # [N, B]
    stable = torch.where(later, correct, torch.ones_like(correct)).amin(dim=0)  # [B]
    return HaltingAccuracies(float(halted.mean()), best_step, float(stable.mean()))
