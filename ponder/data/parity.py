"""The parity task: vectors of 0, +1 and -1; the label is the parity of the number of +1s.

Difficulty is the number of non-zero elements. Batches are made with a handful of tensor
ops on the training device, never one sample at a time: from a `torch.Generator`
(`parity_batch`, the ``generator`` data stream) or from counter-based words (`stream_batches`,
the ``counter`` stream, `ponder.streams`), where K runs' batches are one set of ops.
"""

from __future__ import annotations

import math

import torch

from ponder.data.eval_set import EvalSet
from ponder.streams import uniform_below

__all__ = ["parity_batch", "parity_eval_sets", "stream_batches", "stream_words_per_batch"]


def parity_batch(
    batch_size: int,
    n_elems: int,
    n_nonzero: tuple[int, int],
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch ``(x [B, n_elems] float, y [B] float 0/1)``; each x has k non-zero elements,
    k uniform in the inclusive range ``n_nonzero``, at uniformly random positions."""
    lo, hi = n_nonzero
    if not 0 <= lo <= hi <= n_elems:
        raise ValueError(f"n_nonzero range must satisfy 0 <= lo <= hi <= n_elems={n_elems}, got {n_nonzero}")
    g, dev = generator, device
    k = torch.randint(lo, hi + 1, (batch_size, 1), generator=g, device=dev)  # non-zero count  # [B, 1]
    # the k positions with the smallest uniform keys are the non-zero ones
    u = torch.rand(batch_size, n_elems, generator=g, device=dev)  # [B, n]
    kth = u.sort(dim=1).values.gather(1, (k - 1).clamp(min=0))  # k-th smallest key  # [B, 1]
    nonzero = (u <= kth) & (k > 0)  # [B, n]
    signs = torch.randint(0, 2, (batch_size, n_elems), generator=g, device=dev) * 2 - 1  # +-1  # [B, n]
    x = torch.where(nonzero, signs, 0).float()  # [B, n]
    y = ((x == 1).sum(dim=1) % 2).float()  # parity of the +1 count                  # [B]
    return x, y


def _sign_words(n_elems: int) -> int:
    return -(-n_elems // 32)


def stream_words_per_batch(batch_size: int, n_elems: int) -> int:
    """Stream words one batch reads: per sample, n_elems position keys, its non-zero count, and
    one word per 32 signs."""
    return batch_size * (n_elems + 1 + _sign_words(n_elems))


def stream_batches(
    words: torch.Tensor, batch_size: int, n_elems: int, low: torch.Tensor | int, high: torch.Tensor | int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K runs' batches ``(x [K, B, n], y [K, B])`` from their counter streams' words at this
    iteration (``[K, stream_words_per_batch]``, `ponder.streams.stream_words`): each x with k
    non-zero elements, k uniform in run k's inclusive range ``low``..``high`` (``[K]`` tensors, or
    ints shared by all; low >= 1), at uniformly random positions, each +1 or -1 with probability
    1/2: `parity_batch`'s distribution, by one set of ops whatever K.

    Per sample the words are n position keys (distinct: a stream's words are), its count's word
    and one word per 32 signs; the non-zero positions are those of the k smallest keys."""
    n, signs = n_elems, _sign_words(n_elems)
    words = words.view(words.shape[0], batch_size, n + 1 + signs)  # [K, B, W]
    low_, high_ = (v[:, None] if isinstance(v, torch.Tensor) else v for v in (low, high))
    k = uniform_below(words[..., n], high_ - low_ + 1) + low_  # non-zero count  # [K, B]
    keys = words[..., :n]  # [K, B, n]
    kth = keys.sort(dim=2).values.gather(2, (k - 1)[..., None])  # k-th smallest key  # [K, B, 1]
    bits = (words[..., n + 1 :, None] >> torch.arange(32, device=words.device)) & 1  # [K, B, S, 32]
    sign = bits.view(*bits.shape[:2], signs * 32)[..., :n] * 2 - 1  # +-1  # [K, B, n]
    x = sign * (keys <= kth)  # [K, B, n]
    y = (x == 1).sum(dim=2) % 2  # parity of the +1 count  # [K, B]
    return x.float(), y.float()


def parity_eval_sets(
    n_elems: int,
    n_nonzero: tuple[int, int],
    n_samples: int = 1000,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> dict[str, EvalSet]:
    """Fixed, seeded evaluation sets, the same at every call for the same arguments.

    - ``test``: the training range.
    - ``easy``: the lowest quarter of the training range (1-4 non-zero of 1-15, as the reference code).
    - ``hard``: the highest third (11-15 of 1-15).
    - ``extrapolation``: more non-zero elements than training ever saw (26-30 when trained on
      at most 25 of 30); present only when the training range stops short of ``n_elems``.
    """
    lo, hi = n_nonzero
    width = hi - lo + 1
    ranges = {
        "test": (lo, hi),
        "easy": (lo, lo + math.ceil(width / 4) - 1),
        "hard": (hi - math.ceil(width / 3) + 1, hi),
    }
    if hi < n_elems:
        ranges["extrapolation"] = (hi + 1, n_elems)
    sets = {}
    for i, (name, rng) in enumerate(ranges.items()):
        # one generator per set, so adding a set never changes the others
        gen = torch.Generator().manual_seed(seed * 1000 + i)
        x, y = parity_batch(n_samples, n_elems, rng, generator=gen)
        sets[name] = EvalSet(name, x.to(device), y.to(device), rng)
    return sets
