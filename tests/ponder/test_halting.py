"""The halting distribution in log space, its sampling, the geometric prior, and the accuracies
measured at the halting step."""

from __future__ import annotations

import math

import pytest
import torch

from ponder.halting import (
    NO_STEP,
    expected_steps,
    halting_accuracies,
    halting_distribution,
    log_geometric_prior,
    log_halting_distribution,
    sample_halting_step,
)


def product_formula(lambda_logits: torch.Tensor) -> torch.Tensor:
    """p_n = lambda_n prod_{j<n} (1 - lambda_j), lambda_N = 1: the reference code's way, step by step."""
    lam = torch.sigmoid(lambda_logits)
    lam[-1] = 1.0
    p, not_halted = [], torch.ones_like(lam[0])
    for n in range(lam.shape[0]):
        p.append(not_halted * lam[n])
        not_halted = not_halted * (1 - lam[n])
    return torch.stack(p)


def test_log_space_equals_product_formula_where_finite() -> None:
    torch.manual_seed(0)
    logits = torch.randn(12, 64, dtype=torch.double) * 3  # product formula in float64: exact
    assert torch.allclose(halting_distribution(logits), product_formula(logits), atol=1e-12)


@pytest.mark.parametrize("n_steps", [1, 2, 20])
def test_sums_to_one_and_last_step_halts(n_steps: int) -> None:
    logits = torch.randn(n_steps, 32) * 5
    p = halting_distribution(logits)
    assert torch.allclose(p.sum(dim=0), torch.ones(32), atol=1e-5)
    # the last step's lambda is 1 whatever its logit: p_N is all the mass left
    survival = torch.sigmoid(-logits[:-1]).prod(dim=0)
    assert torch.allclose(p[-1], survival, atol=1e-6)


@pytest.mark.parametrize("saturation", [60.0, -60.0, "mixed"])
def test_saturated_logits_stay_finite_with_finite_gradients(saturation: float | str) -> None:
    if saturation == "mixed":  # +-60 alternating over steps and samples
        signs = torch.tensor([1.0, -1.0]).repeat(10)[:, None] * torch.tensor([1.0, -1.0]).repeat(4)
        logits = (60.0 * signs).requires_grad_()
    else:
        logits = torch.full((20, 8), float(saturation), requires_grad=True)
    log_p = log_halting_distribution(logits)
    p_plain = product_formula(logits.detach())  # float32, as in training
    if saturation != -60.0:  # lambda = 1.0 exactly: the product underflows to 0, log to -inf
        assert (p_plain == 0).any() and torch.isinf(p_plain.log()).any()
    assert torch.isfinite(log_p).all()
    # where the product formula is finite and not underflowed, both agree
    ok = p_plain > 1e-30
    assert torch.allclose(log_p[ok].exp(), p_plain[ok], rtol=1e-4)
    prior = log_geometric_prior(0.2, 20)
    kl = (log_p.exp() * (log_p - prior[:, None])).sum(0).mean()
    kl.backward()
    assert torch.isfinite(kl) and logits.grad is not None and torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("tail", ["renormalise", "last_step"])
@pytest.mark.parametrize("lambda_p", [0.05, 0.2, 0.5, 1.0])
def test_proper_prior_tails_sum_to_one(tail: str, lambda_p: float) -> None:
    prior = log_geometric_prior(lambda_p, 20, tail).exp()  # type: ignore[arg-type]
    assert prior.sum().item() == pytest.approx(1.0, abs=1e-6)


def test_truncated_prior_is_the_references_and_loses_its_tail() -> None:
    prior = log_geometric_prior(0.2, 20, "truncate").exp()
    assert prior.sum().item() == pytest.approx(1 - 0.8**20, abs=1e-6)  # 0.988, as NOTES.md says
    assert prior[0].item() == pytest.approx(0.2) and prior[1].item() == pytest.approx(0.16)


def test_renormalised_prior_keeps_the_geometric_ratio() -> None:
    prior = log_geometric_prior(0.3, 10, "renormalise").exp()
    assert torch.allclose(prior[1:] / prior[:-1], torch.full((9,), 0.7), atol=1e-6)


def test_last_step_prior_is_the_constant_rate_halting_process() -> None:
    # a model whose lambda_n = lambda_p at every step matches this prior exactly
    logit = math.log(0.3 / 0.7)
    model_p = halting_distribution(torch.full((10, 1), logit))[:, 0]
    assert torch.allclose(model_p, log_geometric_prior(0.3, 10, "last_step").exp(), atol=1e-6)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_prior_rejects_lambda_p_outside_unit_interval(bad: float) -> None:
    with pytest.raises(ValueError, match="lambda_p"):
        log_geometric_prior(bad, 10)


def test_sampled_halting_steps_follow_p() -> None:
    p = torch.tensor([0.1, 0.6, 0.3])
    log_p = p.log()[:, None].expand(3, 40_000)
    steps = sample_halting_step(log_p, torch.Generator().manual_seed(0))
    freq = torch.bincount(steps, minlength=3).float() / steps.numel()
    assert torch.allclose(freq, p, atol=0.01)


def test_expected_steps_counts_from_one() -> None:
    p = torch.tensor([[0.5], [0.25], [0.25]])
    assert expected_steps(p.log()).item() == pytest.approx(0.5 + 0.5 + 0.75)


def test_a_nan_distribution_never_halts_at_step_1() -> None:
    """An arg-max over NaN picks index 0: a diverged model would look like a one-step ponderer."""
    log_p = torch.tensor([[math.nan, -0.1, -math.inf], [math.nan, -2.0, -math.inf]])  # [N=2, B=3]
    steps = sample_halting_step(log_p, torch.Generator().manual_seed(0))
    assert steps[0] == NO_STEP and steps[2] == NO_STEP  # NaN; no step with p > 0
    assert steps[1] in (0, 1)


# -- halted, best-step and stable accuracy ------------------------------------------------------


def _halting_at(steps: list[int], n_steps: int) -> torch.Tensor:
    """The steps (1-based) drawn from a hand-built p that puts all its mass on them: log p [N, B]."""
    log_p = torch.full((n_steps, len(steps)), -math.inf)
    log_p[torch.tensor(steps) - 1, torch.arange(len(steps))] = 0.0
    drawn = sample_halting_step(log_p, torch.Generator().manual_seed(0))
    assert drawn.tolist() == [s - 1 for s in steps]
    return drawn


def _correct(bits: list[list[int]], labels: list[int]) -> torch.Tensor:
    """Per-step correctness [N, B] of parity predictions ``bits`` [N][B] (the bit each step
    answers) against ``labels`` [B], as the trainer scores them (logit > 0 means 1)."""
    from ponder.tasks import accuracy

    logits = torch.tensor(bits, dtype=torch.float32) * 2 - 1  # 1 -> +1, 0 -> -1     # [N, B]
    return accuracy(logits, torch.tensor(labels, dtype=torch.float32))


def test_every_step_right_is_right_on_all_three() -> None:
    labels = [0, 1, 1, 0]
    correct = _correct([labels, labels, labels], labels)
    acc = halting_accuracies(correct, _halting_at([1, 3, 2, 3], 3))
    assert acc == (1.0, 1.0, 1.0)


def test_the_shortcut_is_right_by_where_it_halts_and_only_there() -> None:
    """Every step answers the same bit for every input (step 1 says 0, step 2 says 1, step 3 says
    0), and the network halts at step 1 on inputs whose parity is 0, at step 2 on the others:
    halted accuracy 1, while no step is right on more than half, and none stays right."""
    labels = [0, 1, 0, 1]
    correct = _correct([[0] * 4, [1] * 4, [0] * 4], labels)
    acc = halting_accuracies(correct, _halting_at([1, 2, 1, 2], 3))
    assert acc.halted == 1.0
    assert acc.best_step == 0.5  # each step is right on half the inputs
    assert acc.stable == 0.0  # step 1's right answers are wrong at step 2, step 2's at step 3


def test_right_at_the_halting_step_but_wrong_later_is_halted_not_stable() -> None:
    """Sample a: right at its halting step 1 and at step 2, wrong at step 3 (halted, not stable).
    Sample b: wrong at step 1, right at its halting step 2 and after (both). Sample c: wrong at its
    halting step 1, right after (neither)."""
    labels = [1, 1, 1]
    correct = _correct([[1, 0, 0], [1, 1, 1], [0, 1, 1]], labels)
    acc = halting_accuracies(correct, _halting_at([1, 2, 1], 3))
    assert acc.halted == pytest.approx(2 / 3)
    assert acc.stable == pytest.approx(1 / 3)
    assert acc.best_step == 1.0  # step 2 is right on all three


def test_no_halting_step_or_no_answer_is_nan_never_a_number() -> None:
    """The halted-accuracy rule: a sample whose p is not a distribution (`NO_STEP`) leaves halted
    and stable accuracy NaN; a NaN answer at a step they count does too."""
    labels = [1, 0]
    correct = _correct([[1, 0], [1, 0]], labels)
    acc = halting_accuracies(correct, torch.tensor([0, NO_STEP]))
    assert math.isnan(acc.halted) and math.isnan(acc.stable)
    assert acc.best_step == 1.0  # the steps' answers do not depend on p
    correct[1, 0] = math.nan  # sample 0 gives no answer at step 2, after its halting step 1
    acc = halting_accuracies(correct, torch.tensor([0, 0]))
    assert acc.halted == 1.0  # halted accuracy does not look at step 2
    assert math.isnan(acc.stable) and math.isnan(acc.best_step)


def _reference(correct: torch.Tensor, step: torch.Tensor) -> tuple[float, float, float]:
    """The three accuracies sample by sample and step by step, as written in words."""
    n_steps, batch = correct.shape
    halted = sum(float(correct[step[b], b]) for b in range(batch)) / batch
    best = max(sum(float(correct[n, b]) for b in range(batch)) / batch for n in range(n_steps))
    stable = sum(all(correct[n, b] == 1 for n in range(int(step[b]), n_steps)) for b in range(batch)) / batch
    return halted, best, stable


@pytest.mark.parametrize("seed", range(20))
def test_stable_never_above_halted_or_best_step_on_random_inputs(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    n_steps, batch = (
        int(torch.randint(1, 8, (1,), generator=gen)),
        int(torch.randint(1, 40, (1,), generator=gen)),
    )
    correct = (torch.rand(n_steps, batch, generator=gen) < torch.rand(1, generator=gen)).float()  # [N, B]
    log_p = torch.log_softmax(torch.randn(n_steps, batch, generator=gen) * 3, dim=0)  # [N, B]
    step = sample_halting_step(log_p, gen)
    acc = halting_accuracies(correct, step)
    assert all(0.0 <= a <= 1.0 for a in acc)
    assert acc.stable <= acc.halted
    assert acc.stable <= float(correct[-1].mean()) <= acc.best_step  # stable ones are right at step N
    assert acc == pytest.approx(_reference(correct, step))
