"""Counter-based streams: a pure function of (seed, iteration, position), the same as ints and as
tensors, a bijection where the design says so, and uniform bits."""

from __future__ import annotations

import random

import torch

from ponder.streams import (
    BITS,
    iteration_keys,
    mix32,
    seed_keys,
    stream_base,
    stream_words,
    uniform_below,
    unit_floats,
)


def _lowbias32(x: int) -> int:
    """Wellons' lowbias32 in Python's unbounded ints, the obvious way (mod 2^32 at each product)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_mix32_is_lowbias32_on_ints_and_tensors_alike() -> None:
    values = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, *random.Random(0).sample(range(2**32), 200)]
    want = [_lowbias32(v) for v in values]
    assert [mix32(v) for v in values] == want
    assert mix32(torch.tensor(values)).tolist() == want


def test_mix32_is_a_bijection_of_32_bit_values() -> None:
    """On a 2^20 slice of the inputs: no two collide (a bijection has no collisions anywhere)."""
    x = torch.arange(2**20) * 4093 + 17  # spread over the 32-bit range
    out = mix32(x & (2**BITS - 1))
    assert out.unique().numel() == out.numel() and int(out.min()) >= 0 and int(out.max()) < 2**BITS


def test_a_runs_words_are_distinct_and_its_iterations_have_distinct_keys() -> None:
    key = seed_keys(12345)
    words = stream_words(stream_base(key, 5000), iteration_keys(key, 3))
    assert words.unique().numel() == 5000  # the parity batch's keys rely on it
    keys = iteration_keys(torch.full((100_000,), key), torch.arange(100_000))
    assert keys.unique().numel() == 100_000  # no batch of a run repeats


def test_ints_and_tensors_give_the_same_keys_and_words() -> None:
    seeds = [0, 1, 2**40 + 3, 2**62]
    k0 = seed_keys(torch.tensor(seeds))
    assert k0.tolist() == [seed_keys(s) for s in seeds]
    k1 = iteration_keys(k0, torch.tensor([0, 5, 5, 2**33 + 5]))
    assert k1.tolist() == [
        iteration_keys(a, i) for a, i in zip(k0.tolist(), [0, 5, 5, 2**33 + 5], strict=True)
    ]
    words = stream_words(stream_base(k0, 64), k1)
    for row, (a, b) in enumerate(zip(k0.tolist(), k1.tolist(), strict=True)):
        assert torch.equal(words[row], stream_words(stream_base(a, 64), b)[0])


def test_bits_floats_and_integers_are_uniform() -> None:
    key = seed_keys(7)
    words = stream_words(stream_base(key, 200_000), iteration_keys(key, 0))[0]  # [N]
    bits = (words[:, None] >> torch.arange(BITS)) & 1  # [N, 32]
    assert torch.allclose(bits.float().mean(dim=0), torch.full((BITS,), 0.5), atol=0.005)
    u = unit_floats(words)
    assert float(u.min()) >= 0 and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.005
    counts = torch.bincount(uniform_below(words, 7), minlength=7).float() / len(words)
    assert counts.numel() == 7 and torch.allclose(counts, torch.full((7,), 1 / 7), atol=0.005)
    # neighbouring positions and neighbouring iterations are uncorrelated
    v = u - 0.5
    assert abs(float((v[1:] * v[:-1]).mean())) < 0.002
    other = unit_floats(stream_words(stream_base(key, 200_000), iteration_keys(key, 1))[0]) - 0.5
    assert abs(float((v * other).mean())) < 0.002
