"""Parity batches and the fixed evaluation sets."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from ponder.data.parity import parity_batch, parity_eval_sets, stream_batches, stream_words_per_batch
from ponder.streams import iteration_keys, seed_keys, stream_base, stream_words

Batch = tuple[torch.Tensor, torch.Tensor]
Draw = Callable[[int, int, tuple[int, int], int], Batch]


def _from_generator(
    batch: int, n: int, nonzero: tuple[int, int], seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    return parity_batch(batch, n, nonzero, torch.Generator().manual_seed(seed))


def _from_stream(
    batch: int, n: int, nonzero: tuple[int, int], seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    key = seed_keys(seed)
    words = stream_words(stream_base(key, stream_words_per_batch(batch, n)), iteration_keys(key, 0))
    x, y = stream_batches(words, batch, n, *nonzero)
    return x[0], y[0]


STREAMS = pytest.mark.parametrize("draw", [_from_generator, _from_stream], ids=["generator", "counter"])
"""Both data streams draw from one distribution: every property below holds for each."""


@STREAMS
def test_labels_are_the_parity_of_the_plus_ones(draw: Draw) -> None:
    x, y = draw(2000, 12, (1, 12), 0)
    assert set(x.unique().tolist()) <= {-1.0, 0.0, 1.0}
    assert torch.equal(y, ((x == 1).sum(dim=1) % 2).float())
    # and by a slow, obviously right count for a few rows
    for row, label in zip(x[:50].tolist(), y[:50].tolist(), strict=True):
        assert label == sum(v == 1.0 for v in row) % 2


@STREAMS
@pytest.mark.parametrize("lo,hi", [(1, 4), (3, 3), (11, 15), (1, 15), (30, 33)])
def test_non_zero_counts_cover_the_range_and_stay_in_it(draw: Draw, lo: int, hi: int) -> None:
    n = max(15, hi)  # 33 elements: more than one word of signs a sample
    x, _ = draw(4000, n, (lo, hi), 1)
    counts = (x != 0).sum(dim=1)
    assert counts.min().item() == lo and counts.max().item() == hi
    assert set(counts.tolist()) == set(range(lo, hi + 1))
    share = torch.bincount(counts - lo).float() / len(counts)  # uniform over the range
    assert torch.allclose(share, torch.full_like(share, 1 / (hi - lo + 1)), atol=0.03)


def test_no_non_zero_at_all_when_the_range_is_zero() -> None:
    x, y = _from_generator(100, 15, (0, 0), 1)
    assert not x.any() and not y.any()


@STREAMS
def test_non_zero_positions_are_spread_over_the_vector(draw: Draw) -> None:
    x, _ = draw(5000, 10, (1, 3), 2)
    per_position = (x != 0).float().mean(dim=0)
    assert torch.allclose(per_position, per_position.mean().expand(10), atol=0.03)
    signs = x[x != 0]
    assert abs(signs.mean().item()) < 0.05  # +1 and -1 equally likely
    # a sign is independent of its position and of the sample's count
    for position in range(10):
        assert abs(x[:, position][x[:, position] != 0].mean().item()) < 0.1, position


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


def test_a_groups_streams_are_each_members_own_drawn_at_once() -> None:
    """K runs' batches drawn together are the batches each draws alone (its own seed, iteration and
    non-zero range), and differ between runs and between iterations."""
    seeds, iterations, ranges = [0, 1, 2, 3], [0, 7, 7, 123456], [(1, 15), (1, 4), (11, 15), (1, 15)]
    k0 = seed_keys(torch.tensor(seeds))
    base = stream_base(k0, stream_words_per_batch(32, 15))
    low, high = (torch.tensor(v) for v in zip(*ranges, strict=True))
    x, y = stream_batches(stream_words(base, iteration_keys(k0, torch.tensor(iterations))), 32, 15, low, high)
    for k, (seed, it, (lo, hi)) in enumerate(zip(seeds, iterations, ranges, strict=True)):
        key = seed_keys(seed)
        alone = stream_words(stream_base(key, stream_words_per_batch(32, 15)), iteration_keys(key, it))
        want = stream_batches(alone, 32, 15, lo, hi)
        assert torch.equal(x[k], want[0][0]) and torch.equal(y[k], want[1][0]), k
    assert not torch.equal(x[0], x[3])  # two seeds, two iterations
    assert not torch.equal(x[1], x[2])  # two seeds at the same iteration
    key = seed_keys(0)
    base0 = stream_base(key, stream_words_per_batch(32, 15))
    next_one = stream_batches(stream_words(base0, iteration_keys(key, 1)), 32, 15, 1, 15)[0][0]
    assert not torch.equal(x[0], next_one)  # one seed, its next iteration
