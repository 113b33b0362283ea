"""The reconstruction loss and the KL regulariser."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ponder.halting import log_geometric_prior, log_halting_distribution
from ponder.losses import kl_to_prior, per_step_cross_entropy, reconstruction_loss


@pytest.mark.parametrize("classes", [None, 10])
def test_vectorised_reconstruction_equals_a_loop_over_steps(classes: int | None) -> None:
    torch.manual_seed(0)
    n_steps, batch = 7, 33
    log_p = log_halting_distribution(torch.randn(n_steps, batch))
    if classes is None:
        y_hat, y = torch.randn(n_steps, batch), torch.randint(0, 2, (batch,)).float()
        loss_fn = lambda yh, t: F.binary_cross_entropy_with_logits(yh, t, reduction="none")  # noqa: E731
    else:
        y_hat, y = torch.randn(n_steps, batch, classes), torch.randint(0, classes, (batch,))
        loss_fn = lambda yh, t: F.cross_entropy(yh, t, reduction="none")  # noqa: E731
    looped = sum((log_p[n].exp() * loss_fn(y_hat[n], y)).mean() for n in range(n_steps))
    vectorised = reconstruction_loss(log_p, per_step_cross_entropy(y_hat, y))
    assert vectorised.item() == pytest.approx(float(looped), rel=1e-6)


def test_kl_is_zero_at_the_prior_and_positive_elsewhere() -> None:
    prior = log_geometric_prior(0.3, 8)
    at_prior = prior[:, None].expand(8, 4)
    assert kl_to_prior(at_prior, prior).item() == pytest.approx(0.0, abs=1e-6)
    assert kl_to_prior(at_prior, prior, "reverse").item() == pytest.approx(0.0, abs=1e-6)
    other = log_halting_distribution(torch.randn(8, 4))
    assert kl_to_prior(other, prior).item() > 1e-3
    assert kl_to_prior(other, prior, "reverse").item() > 1e-3


def test_kl_matches_a_value_worked_by_hand() -> None:
    # p = (0.5, 0.5); prior lambda_p 0.5, N 2, renormalised: (0.5/0.75, 0.25/0.75) = (2/3, 1/3)
    log_p = torch.tensor([[math.log(0.5)], [math.log(0.5)]])
    prior = log_geometric_prior(0.5, 2)
    assert torch.allclose(prior.exp(), torch.tensor([2 / 3, 1 / 3]))
    forward = 0.5 * math.log(0.5 / (2 / 3)) + 0.5 * math.log(0.5 / (1 / 3))  # KL(p || p_G) = 0.0589
    reverse = (2 / 3) * math.log((2 / 3) / 0.5) + (1 / 3) * math.log((1 / 3) / 0.5)  # KL(p_G || p) = 0.0566
    assert kl_to_prior(log_p, prior).item() == pytest.approx(forward, rel=1e-5)
    assert kl_to_prior(log_p, prior, "reverse").item() == pytest.approx(reverse, rel=1e-5)
    assert forward != pytest.approx(reverse, rel=1e-3)  # the direction matters


def test_reverse_direction_reproduces_the_reference_kldivloss() -> None:
    torch.manual_seed(1)
    log_p = log_halting_distribution(torch.randn(20, 16))
    prior = log_geometric_prior(0.2, 20, "truncate")
    reference = torch.nn.KLDivLoss(reduction="batchmean")(log_p.exp().t().log(), prior.exp().expand(16, 20))
    assert kl_to_prior(log_p, prior, "reverse").item() == pytest.approx(reference.item(), rel=1e-5)


def test_kl_gradient_is_finite_where_p_underflows() -> None:
    logits = torch.full((20, 4), 60.0, requires_grad=True)  # halts at step 1: p_2.. underflow to 0
    for direction in ("forward", "reverse"):
        loss = kl_to_prior(log_halting_distribution(logits), log_geometric_prior(0.2, 20), direction)  # type: ignore[arg-type]
        (grad,) = torch.autograd.grad(loss, logits)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
