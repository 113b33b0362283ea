"""A fused step is built from its plain step's own layers: a layer added to a copy of each task's
plain step stops the group from being built, naming the parameter, or is followed by the fused
step (and then each member still trains as its plain run); and a third task declares its fused
step in its own module only (`tests.ponder.majority`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from ponder import steps
from ponder.config import MnistConfig, ParityConfig
from ponder.data.mnist import MnistData
from ponder.fused.key import FUSED_KEY_FIELDS, FUSED_TASKS, fusable_key
from ponder.fused.layers import Linear
from ponder.fused.layout import Params, PlainNames
from ponder.fused.mnist import FusedMnistStep
from ponder.fused.parity import FusedParityStep
from ponder.fused.trainer import FusedTrainer
from ponder.tasks import get_task, register
from ponder.trainer import Trainer
from tests.ponder.majority import FusedMajorityStep, MajorityConfig, majority_task
from tests.ponder.test_fused import _assert_same_losses, _recording, train_to_end
from tests.ponder.test_trainer import _digits

REPO = Path(__file__).resolve().parents[2]
PARITY = ParityConfig(n_elems=6, n_hidden=8, batch_size=8, eval_samples=20, device="cpu", iterations=6)
MNIST = MnistConfig(
    n_hidden=8, n_embed=8, batch_size=4, eval_samples=8, device="cpu", iterations=4, eval_rotations=()
)


def _fused_against_plain(configs: list[Any], data: object | None = None) -> None:
    """Every member's loss at every iteration is its plain run's (same weights, batches, masks)."""
    group = FusedTrainer(len(configs), "cpu")
    slots = [group.join(c, data=data) for c in configs]
    losses, _ = train_to_end(group)
    for slot, config in zip(slots, configs, strict=True):
        plain = Trainer(config, data)
        recorded = _recording(plain)
        list(plain.run())
        _assert_same_losses(losses[slot], recorded)


# -- parity: a linear layer on the input, which parity's fused step does not read ---------------------


class ParityStepWithInput(steps.ParityStep):
    """`ParityStep` with one layer added: the GRU reads W x + b, not x."""

    def __init__(self, n_elems: int, n_hidden: int) -> None:
        super().__init__(n_elems, n_hidden)
        self.project = nn.Linear(n_elems, n_elems)

    def encode(self, x: Any) -> Any:
        return self.project(x)


@dataclass(frozen=True)
class FusedParityStepWithInput(FusedParityStep):
    """Parity's fused step following the added layer: its batched twin before the GRU."""

    project: Linear

    @classmethod
    def read(cls, step: nn.Module, names: PlainNames) -> dict[str, Any]:
        return {**super().read(step, names), "project": Linear.read(step.get_submodule("project"), names)}

    def encode(self, params: Params, x: Any) -> Any:
        return self.project(x, params, x.shape[0])


@pytest.fixture
def parity_with_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "ParityStep", ParityStepWithInput)  # what the parity task builds


@pytest.fixture
def fused_parity_with_input() -> Iterator[None]:
    """The parity task, its fused step the one that follows the added layer, inside the test."""
    task = get_task("parity")
    assert task.fused is not None
    step = f"{__name__}:{FusedParityStepWithInput.__name__}"
    register(dataclasses.replace(task, fused=dataclasses.replace(task.fused, step=step)), replace=True)
    try:
        yield
    finally:
        register(task, replace=True)


@pytest.mark.usefixtures("parity_with_input")
def test_a_layer_added_to_the_parity_step_stops_its_group_naming_the_parameter() -> None:
    group = FusedTrainer(2, "cpu")
    with pytest.raises(ValueError, match=r"FusedParityStep does not read step\.project\.weight") as refused:
        group.join(PARITY)
    assert "\n" not in str(refused.value) and "set fuse = 1" in str(refused.value)
    assert group.slots == [] and group.free_slots == [0, 1]  # nothing half-joined


@pytest.mark.usefixtures("parity_with_input", "fused_parity_with_input")
def test_the_parity_group_trains_as_the_plain_runs_once_its_fused_step_follows() -> None:
    _fused_against_plain([PARITY, dataclasses.replace(PARITY, seed=1, max_steps=3, lambda_p=0.5)])


# -- MNIST: layers added, moved and removed in the CNN and the MLP -----------------------------------


def _cnn_added(step: steps.MnistStep, n_embed: int) -> None:
    step.cnn.extend([nn.Linear(n_embed, n_embed), nn.ReLU()])


def _cnn_moved(step: steps.MnistStep, n_embed: int) -> None:  # ReLU before the first max-pool
    step.cnn = nn.Sequential(*(step.cnn[i] for i in (0, 2, 1, 3, 4, 5, 6, 7, 8)))


def _cnn_removed(step: steps.MnistStep, n_embed: int) -> None:  # the embedding's last ReLU
    del step.cnn[8]


def _mix_added(step: steps.MnistStep, n_embed: int) -> None:
    step.mix.extend([nn.Tanh(), nn.Linear(step.n_hidden, step.n_hidden)])


def _cnn_norm(step: steps.MnistStep, n_embed: int) -> None:  # a layer with no batched twin
    step.cnn.append(nn.LayerNorm(n_embed))


def _beside(step: steps.MnistStep, n_embed: int) -> None:  # a layer outside cnn and mix
    step.scale = nn.Linear(step.n_hidden, step.n_hidden)


def _mnist_step(change: Any) -> type[steps.MnistStep]:
    class Changed(steps.MnistStep):
        def __init__(
            self, n_hidden: int = 64, n_embed: int = 64, n_classes: int = 10, dropout: float = 0.2
        ) -> None:
            super().__init__(n_hidden, n_embed, n_classes, dropout)
            change(self, n_embed)

    return Changed


@pytest.fixture(scope="module")
def data() -> MnistData:
    return _digits()


@pytest.mark.parametrize("change", [_cnn_added, _cnn_moved, _cnn_removed, _mix_added])
def test_the_mnist_fused_step_follows_a_layer_added_moved_or_removed(
    change: Any, data: MnistData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steps, "MnistStep", _mnist_step(change))
    plain = Trainer(MNIST, data).model.step
    fused = FusedMnistStep.of(Trainer(MNIST, data).model)
    assert len(fused.cnn) == len(plain.cnn) and len(fused.mix) == len(plain.mix) - 1  # mix's first: mix_in
    _fused_against_plain([MNIST, dataclasses.replace(MNIST, seed=1, max_steps=3, dropout=0.5)], data)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (_cnn_norm, r"step\.cnn\.9\.weight \(a LayerNorm\) has no batched twin"),
        (_beside, r"FusedMnistStep does not read step\.scale\.weight"),
    ],
)
def test_a_layer_the_mnist_fused_step_cannot_follow_stops_its_group_naming_the_parameter(
    change: Any, named: str, data: MnistData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steps, "MnistStep", _mnist_step(change))
    group = FusedTrainer(2, "cpu")
    with pytest.raises(ValueError, match=named) as refused:
        group.join(MNIST, data=data)
    assert "\n" not in str(refused.value) and group.slots == []


# -- a third fusable task, declared in its own module -----------------------------------------------


def test_a_third_task_fuses_from_its_own_module_and_its_members_train_as_their_plain_runs() -> None:
    configs = [
        MajorityConfig(
            n_bits=5, n_hidden=8, batch_size=8, eval_samples=20, device="cpu", iterations=6, seed=s
        )
        for s in (0, 1)
    ]
    configs[1] = dataclasses.replace(configs[1], max_steps=3, lambda_p=0.5)
    with majority_task():
        assert FUSED_TASKS["majority"] is FusedMajorityStep
        assert FUSED_KEY_FIELDS["majority"][:2] == ("task", "n_bits")
        for stream in ("counter", "generator"):
            _fused_against_plain([dataclasses.replace(c, data_stream=stream) for c in configs])
        group = FusedTrainer(2, "cpu")
        group.join(configs[0])
        with pytest.raises(ValueError, match="n_bits is 7 but this fused group's is 5"):
            group.join(dataclasses.replace(configs[0], n_bits=7))
        assert fusable_key(configs[0]) == fusable_key(configs[1])
    assert "majority" not in FUSED_TASKS
    # the task is its module: nothing in ponder/ names it
    assert not [p for p in (REPO / "ponder").rglob("*.py") if "majority" in p.read_text()]
