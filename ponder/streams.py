"""Counter-based random numbers: a run's draws as a hash of (seed, iteration, position).

A `torch.Generator` is a state advanced draw by draw, one generator per call: K fused members
drawing their batches from K generators cost K calls of every random op, and a CPU generator's
stream is not a CUDA one's. Here the value at a position is a pure function of the run's seed, the
iteration and the position, so

- K members' draws are one set of tensor ops over ``[K, ...]`` whatever K (each member's own
  seed and iteration in a row), which ``torch.compile`` fuses and a CUDA graph can replay;
- they are the same bits on every device (integer ops only), and a checkpoint needs no generator
  state: the iteration is the position in the stream;
- a plain `ponder.trainer.Trainer` and a fused member of the same config draw the same batches.

The hash is Wellons' ``lowbias32`` (a bijection of 32-bit integers; bias 0.17 in his measure),
computed in int64 tensors that hold 32-bit values: every product is kept below 2^63, so nothing
relies on overflow. A stream's 64-bit key is two 32-bit words: ``k0`` from the seed and ``k1``
from (k0, iteration); the word at position j is ``mix(mix(j ^ k0) ^ k1)``. For one key the words
of distinct positions are distinct (both steps are bijections), and one member's iterations have
distinct ``k1`` (a bijection of the iteration for its ``k0``), so no batch of a run repeats.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

T = TypeVar("T", torch.Tensor, int)

__all__ = [
    "BITS",
    "iteration_keys",
    "mix32",
    "seed_keys",
    "stream_base",
    "stream_words",
    "uniform_below",
    "unit_floats",
]

BITS = 32
"""Random bits in one word of a stream (an int64 tensor element in [0, 2^32))."""
_MASK = (1 << BITS) - 1
_SEED_SALT = 0x9E3779B9  # 2^32 / golden ratio: keeps seed 0's key away from 0
_ITERATION_SALT = 0x85EBCA6B


def mix32(x: T) -> T:
    """Wellons' lowbias32 hash of each 32-bit value in ``x`` (an int64 tensor, or an int):

    x ^= x >> 16;  x *= 0x7feb352d;  x ^= x >> 15;  x *= 0x846ca68b;  x ^= x >> 16   (mod 2^32)

    0x846ca68b is above 2^31: x * 0x846ca68b = x * 0x046ca68b + (x & 1) << 31 (mod 2^32), each
    product below 2^63."""
    y: Any = x
    y = y ^ (y >> 16)
    y = (y * 0x7FEB352D) & _MASK
    y = y ^ (y >> 15)
    y = (y * 0x046CA68B + ((y & 1) << 31)) & _MASK
    out: T = y ^ (y >> 16)
    return out


def seed_keys(seeds: T) -> T:
    """k0 of each run's stream from its seed (an int64 tensor ``[K]`` or an int, >= 0; 64 bits
    are used)."""
    low: Any = seeds & _MASK
    high: Any = (seeds >> 32) & _MASK
    return mix32(mix32(low ^ _SEED_SALT) ^ high)  # type: ignore[no-any-return]


def iteration_keys(k0: T, iterations: T) -> T:
    """k1 of each run's draws at its iteration (``[K]`` tensors, or ints): a bijection of the
    iteration (mod 2^32) for a given k0, so a run's iterations never share a key."""
    it: Any = iterations & _MASK
    return mix32(it ^ mix32(k0 ^ _ITERATION_SALT))  # type: ignore[no-any-return]


def stream_base(k0: torch.Tensor | int, count: int, device: torch.device | str | None = None) -> torch.Tensor:
    """mix(j ^ k0) for positions j = 0..count-1 of each run: ``[K, count]`` int64, the part of its
    words that its iterations share (computed once a run, not once an iteration); ``k0`` a
    ``[K]`` tensor, or an int for one run (K = 1, on ``device``)."""
    dev = k0.device if isinstance(k0, torch.Tensor) else device
    position = torch.arange(count, device=dev)[None, :]  # [1, count]
    return mix32(position ^ (k0[:, None] if isinstance(k0, torch.Tensor) else k0))  # [K, count]


def stream_words(base: torch.Tensor, k1: torch.Tensor | int) -> torch.Tensor:
    """Each run's words at one iteration, mix(mix(j ^ k0) ^ k1): ``[K, count]`` int64 in
    [0, 2^32), from its `stream_base` ``[K, count]`` and its iteration's key ``k1`` (``[K]``, or
    an int for one run)."""
    return mix32(base ^ (k1[:, None] if isinstance(k1, torch.Tensor) else k1))  # [K, count]


def unit_floats(words: torch.Tensor) -> torch.Tensor:
    """Uniform floats in [0, 1) from words (same shape): the top 24 bits, exact in float32."""
    return (words >> 8).float() * 2.0**-24


def uniform_below(words: torch.Tensor, n: torch.Tensor | int) -> torch.Tensor:
    """Integers uniform in [0, n) from words, ``n`` broadcast against them (each n <= 2^31):
    floor(word * n / 2^32), exact in int64; biased by at most n / 2^32."""
    return (words * n) >> BITS
