"""The MNIST task's counter stream: each run's batch and dropout masks at an iteration, K runs at once.

A run's words at an iteration (`ponder.streams.stream_words`, ``[K, W]``) are read as

    [0, B)                          the batch: sample b is training image uniform_below(word_b, T)
    [B + n M, B + (n + 1) M)        step n's dropout mask (n = 0 .. N - 1), M = ceil(B H / 2)
                                    words, two 16-bit halves a word, one half a unit of ``[B, H]``

A word's position depends on (b) or (n, b, h) only, never on N: a run of N_k steps reads the first
N_k steps' masks of the words a group unrolling N >= N_k steps draws, so a fused member's masks
are its plain run's; and no mask shares a position with the batch.

A unit is dropped when its half is below t = round(p 2^16): with probability t / 2^16, within
2^-17 of the configured p (torch's own dropout draws a float against p); a kept unit is scaled by
1 / (1 - p), as torch's dropout scales it. Everything is a fixed set of tensor ops over ``[K, ...]``
whatever K (per-run thresholds and scales as ``[K]`` tensors).

Shapes: K runs, B samples, N steps, H hidden units, T training images, W words.
"""

from __future__ import annotations

import torch

from ponder.streams import uniform_below

__all__ = [
    "MASK_BITS",
    "dropout_scale",
    "dropout_threshold",
    "mask_words",
    "stream_indices",
    "stream_masks",
    "stream_words_per_batch",
]

MASK_BITS = 16
"""Random bits a dropout unit reads: two units a 32-bit word."""
_HALF = (1 << MASK_BITS) - 1


def mask_words(batch_size: int, n_hidden: int) -> int:
    """M, the words one step's dropout mask ``[B, H]`` reads."""
    return -(-batch_size * n_hidden // 2)


def stream_words_per_batch(batch_size: int, n_hidden: int, max_steps: int) -> int:
    """W, the words a run of ``max_steps`` steps reads an iteration: B indices, N masks of M words."""
    return batch_size + max_steps * mask_words(batch_size, n_hidden)


def dropout_threshold(p: float) -> int:
    """t = round(p 2^16): a unit whose 16-bit half is below t is dropped."""
    return round(p * (1 << MASK_BITS))


def dropout_scale(p: float) -> float:
    """1 / (1 - p), what a kept unit is multiplied by (torch's dropout's scale)."""
    return 1.0 / (1.0 - p)


def stream_indices(words: torch.Tensor, batch_size: int, n_train: int) -> torch.Tensor:
    """Each run's batch: B indices uniform in [0, T) from its words ``[K, W]``: ``[K, B]`` int64."""
    return uniform_below(words[:, :batch_size], n_train)


def stream_masks(
    words: torch.Tensor,
    batch_size: int,
    n_hidden: int,
    n_steps: int,
    threshold: torch.Tensor,
    scale: torch.Tensor,
) -> torch.Tensor:
    """Each run's dropout masks for steps 0 .. N-1 from its words ``[K, W]`` (W >= B + N M): 0 for a
    dropped unit, ``scale`` for a kept one, ``[K, N, B, H]`` in ``scale``'s dtype; ``threshold``
    ``[K]`` int64 (`dropout_threshold`), ``scale`` ``[K]`` float (`dropout_scale`)."""
    runs, m = words.shape[0], mask_words(batch_size, n_hidden)
    units = batch_size * n_hidden
    w = words[:, batch_size : batch_size + n_steps * m].reshape(runs, n_steps, m)  # [K, N, M]
    t = threshold[:, None, None]  # [K, 1, 1]
    # unit 2i of a step reads its word i's low half, unit 2i + 1 the high half     # [K, N, M, 2]
    keep = torch.stack([(w & _HALF) >= t, (w >> MASK_BITS) >= t], dim=3)
    keep = keep.view(runs, n_steps, 2 * m)[..., :units]  # [K, N, B H]
    masks = keep.to(scale.dtype) * scale[:, None, None]  # [K, N, B H]
    return masks.view(runs, n_steps, batch_size, n_hidden)
