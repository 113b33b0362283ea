"""The fused constant-input GRU equals N GRUCell calls, in values and in gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ponder.gru import gru_unroll


def _cell_loop(cell: nn.GRUCell, x: torch.Tensor, h0: torch.Tensor, n_steps: int) -> torch.Tensor:
    h, states = h0, []
    for _ in range(n_steps):
        h = cell(x, h)
        states.append(h)
    return torch.stack(states)


@pytest.mark.parametrize("n_steps", [1, 2, 9])
def test_values_and_gradients_equal_grucell(n_steps: int) -> None:
    torch.manual_seed(n_steps)
    cell = nn.GRUCell(7, 5).double()
    x = torch.randn(4, 7, dtype=torch.double, requires_grad=True)
    h0 = torch.randn(4, 5, dtype=torch.double, requires_grad=True)
    weights = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
    ref = _cell_loop(cell, x, h0, n_steps)
    fused = gru_unroll(x, h0, *weights, n_steps)
    assert torch.allclose(fused, ref, atol=1e-12)
    g = torch.randn_like(ref)
    grads_ref = torch.autograd.grad((ref * g).sum(), [x, h0, *weights])
    grads_fused = torch.autograd.grad((fused * g).sum(), [x, h0, *weights])
    for a, b in zip(grads_ref, grads_fused, strict=True):
        assert torch.allclose(a, b, atol=1e-10)


def test_gradcheck() -> None:
    torch.manual_seed(0)
    cell = nn.GRUCell(3, 4).double()
    inputs = (
        torch.randn(2, 3, dtype=torch.double, requires_grad=True),
        torch.randn(2, 4, dtype=torch.double, requires_grad=True),
        cell.weight_ih,
        cell.weight_hh,
        cell.bias_ih,
        cell.bias_hh,
    )
    assert torch.autograd.gradcheck(lambda *a: gru_unroll(*a, 4), inputs)
