"""Parity batches and the fixed evaluation sets."""

from __future__ import annotations

import pytest
import torch

from ponder.data.parity import parity_batch, parity_eval_sets


def test_labels_are_the_parity_of_the_plus_ones() -> None:
    x, y = parity_batch(2000, 12, (0, 12), torch.Generator().manual_seed(0))
    assert set(x.unique().tolist()) <= {-1.0, 0.0, 1.0}
    assert torch.equal(y, ((x == 1).sum(dim=1) % 2).float())
    # and by a slow, obviously right count for a few rows
    for row, label in zip(x[:50].tolist(), y[:50].tolist(), strict=True):
        assert label == sum(v == 1.0 for v in row) % 2


@pytest.mark.parametrize("lo,hi", [(0, 0), (1, 4), (3, 3), (11, 15), (1, 15)])
def test_non_zero_counts_cover_the_range_and_stay_in_it(lo: int, hi: int) -> None:
    x, _ = parity_batch(4000, 15, (lo, hi), torch.Generator().manual_seed(1))
    counts = (x != 0).sum(dim=1)
    assert counts.min().item() == lo and counts.max().item() == hi
    assert set(counts.tolist()) == set(range(lo, hi + 1))


def test_non_zero_positions_are_spread_over_the_vector() -> None:
    x, _ = parity_batch(5000, 10, (1, 3), torch.Generator().manual_seed(2))
    per_position = (x != 0).float().mean(dim=0)
    assert torch.allclose(per_position, per_position.mean().expand(10), atol=0.03)
    signs = x[x != 0]
    assert abs(signs.mean().item()) < 0.05  # +1 and -1 equally likely


def test_a_generator_makes_batches_reproducible() -> None:
    a = parity_batch(64, 15, (1, 15), torch.Generator().manual_seed(3))
    b = parity_batch(64, 15, (1, 15), torch.Generator().manual_seed(3))
    c = parity_batch(64, 15, (1, 15), torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_bad_range_is_refused() -> None:
    with pytest.raises(ValueError, match="n_nonzero"):
        parity_batch(4, 5, (2, 6))


def test_eval_sets_are_fixed_and_cover_their_ranges() -> None:
    sets = parity_eval_sets(15, (1, 15), n_samples=500, seed=0)
    again = parity_eval_sets(15, (1, 15), n_samples=500, seed=0)
    assert list(sets) == ["test", "easy", "hard"]  # no extrapolation when training saw all counts
    assert sets["easy"].n_nonzero == (1, 4) and sets["hard"].n_nonzero == (11, 15)  # as the reference code
    for name, s in sets.items():
        assert torch.equal(s.x, again[name].x) and torch.equal(s.y, again[name].y)
        counts = (s.x != 0).sum(dim=1)
        assert s.n_nonzero is not None
        assert counts.min() >= s.n_nonzero[0] and counts.max() <= s.n_nonzero[1]
    assert not torch.equal(parity_eval_sets(15, (1, 15), 500, seed=1)["test"].x, sets["test"].x)


def test_extrapolation_set_has_more_non_zero_elements_than_training() -> None:
    sets = parity_eval_sets(30, (1, 25), n_samples=300, seed=0)
    extra = sets["extrapolation"]
    assert extra.n_nonzero == (26, 30)
    counts = (extra.x != 0).sum(dim=1)
    assert counts.min() == 26 and counts.max() == 30
    assert (sets["test"].x != 0).sum(dim=1).max() <= 25
