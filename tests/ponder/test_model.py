"""Properties every step function must have inside a PonderNet; one parametrised suite."""

from __future__ import annotations

import torch
from torch import nn

from ponder.model import PonderNet, StepFunction
from tests.conftest import StepCase


def test_shapes(step_case: StepCase) -> None:
    net = PonderNet(step_case.make_step(), max_steps=7)
    out = net(step_case.make_input(5))
    assert out.log_p.shape == (7, 5)
    assert out.lambda_logits.shape == (7, 5)
    assert out.y_hat.shape[:2] == (7, 5)


def test_p_sums_to_one_per_sample(step_case: StepCase) -> None:
    net = PonderNet(step_case.make_step(), max_steps=9)
    p = net(step_case.make_input(16)).log_p.exp()
    assert torch.allclose(p.sum(dim=0), torch.ones(16), atol=1e-5)
    assert (p >= 0).all()


def test_last_lambda_is_one(step_case: StepCase) -> None:
    net = PonderNet(step_case.make_step(), max_steps=6)
    out = net(step_case.make_input(8))
    # lambda_N = 1 means p_N is exactly the probability of not having halted before N
    survival = torch.sigmoid(-out.lambda_logits[:-1]).prod(dim=0)
    assert torch.allclose(out.log_p[-1].exp(), survival, atol=1e-6)


def test_fused_unroll_equals_stepping(step_case: StepCase) -> None:
    step = step_case.make_step().double().eval()
    x = step_case.make_input(4).double()
    ctx = step.encode(x)
    h0 = step.initial_state(ctx)
    fused = step.unroll(ctx, h0, 5)
    looped = StepFunction.unroll(step, ctx, h0, 5)  # the generic loop of transitions
    assert torch.allclose(fused, looped, atol=1e-10)


def test_one_step_is_transition_then_heads(step_case: StepCase) -> None:
    step = step_case.make_step().eval()
    x = step_case.make_input(3)
    ctx = step.encode(x)
    y_hat, h1, lam = step(ctx, step.initial_state(ctx))
    out = PonderNet(step, max_steps=1)(x)
    assert torch.allclose(out.y_hat[0], y_hat, atol=1e-6)
    assert torch.allclose(out.lambda_logits[0], lam, atol=1e-6)
    assert h1.shape == (3, step.initial_state(ctx).shape[1])


class CountingStep(StepFunction):
    """Wraps a step function and counts its calls and the samples it saw."""

    def __init__(self, inner: StepFunction) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0
        self.samples = 0

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.encode(x)

    def initial_state(self, ctx: torch.Tensor) -> torch.Tensor:
        return self.inner.initial_state(ctx)

    def transition(self, ctx: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.samples += h.shape[0]
        return self.inner.transition(ctx, h)

    def heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.heads(h)


def _bias_halting(step: StepFunction, logit: float) -> None:
    halt = step.halt
    assert isinstance(halt, nn.Linear)
    with torch.no_grad():
        halt.weight.zero_()
        halt.bias.fill_(logit)


def test_early_exit_makes_fewer_step_calls_than_max_steps(step_case: StepCase) -> None:
    inner = step_case.make_step().eval()
    _bias_halting(inner, 0.0)  # lambda = 0.5 at every step: mean halting step about 2
    counting = CountingStep(inner)
    net = PonderNet(counting, max_steps=20)
    out = net.infer(step_case.make_input(64), torch.Generator().manual_seed(0))
    assert counting.calls == out.steps_run < 20
    assert counting.samples == out.sample_steps == int(out.halting_step.sum())
    # compute follows the mean halting step, not the batch's longest
    assert out.sample_steps / 64 < 3.0
    assert out.halting_step.min() >= 1 and out.halting_step.max() == out.steps_run


def test_early_exit_predictions_are_those_of_the_halting_step(step_case: StepCase) -> None:
    inner = step_case.make_step().eval()
    _bias_halting(inner, -1.0)
    net = PonderNet(inner, max_steps=8)
    x = step_case.make_input(32)
    out = net.infer(x, torch.Generator().manual_seed(1))
    full = net(x)
    picked = full.y_hat[out.halting_step - 1, torch.arange(32)]
    assert torch.allclose(out.y_hat, picked, atol=1e-5)


def test_early_exit_never_halts_when_lambda_is_zero_until_the_last_step(step_case: StepCase) -> None:
    inner = step_case.make_step().eval()
    _bias_halting(inner, -60.0)
    out = PonderNet(inner, max_steps=5).infer(step_case.make_input(10), torch.Generator().manual_seed(0))
    assert (out.halting_step == 5).all() and out.steps_run == 5
