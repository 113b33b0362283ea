"""The task registry: the built-in tasks go through it, and a task registered from outside
``ponder/`` (majority, `tests.ponder.majority`) builds, trains and reports like them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from ponder.config import CONFIGS, ConfigError, MnistConfig, ParityConfig, PonderConfig, config_from_dict
from ponder.config import resolve_config as resolve
from ponder.metrics import CHANCE, SET_LIST_METRICS, SET_METRICS, TIMING_KEYS, TRAIN_METRICS
from ponder.tasks import (
    TaskDef,
    build_task,
    canonical_sets,
    eval_set_names,
    get_task,
    register,
    registered,
    task_of,
)
from ponder.trainer import Trainer
from tests.ponder.majority import MajorityConfig, majority_task

CPU = torch.device("cpu")
SMALL = {"n_bits": 5, "max_steps": 6, "n_hidden": 16, "batch_size": 64, "eval_samples": 256, "device": "cpu"}


@pytest.fixture
def majority() -> Iterator[TaskDef[MajorityConfig]]:
    with majority_task() as task:
        yield task


def test_the_built_in_tasks_are_registered_in_order() -> None:
    assert list(registered()) == ["parity", "mnist"]
    assert dict(CONFIGS) == {"parity": ParityConfig, "mnist": MnistConfig}
    assert dict(CHANCE) == {"parity": 0.5, "mnist": 0.1}
    parity_sets = ("test", "easy", "hard", "extrapolation")
    assert canonical_sets() == (*parity_sets, "rot22.5", "rot45", "rot67.5", "rot90")
    assert task_of(ParityConfig()) is get_task("parity")


def test_a_registered_task_is_in_every_lookup_and_gone_after(majority: TaskDef[MajorityConfig]) -> None:
    assert get_task("majority") is majority and list(registered())[-1] == "majority"
    assert CONFIGS["majority"] is MajorityConfig and CHANCE["majority"] == 0.5
    assert eval_set_names(MajorityConfig()) == ["test"]
    assert config_from_dict({"task": "majority", "n_bits": 7}) == MajorityConfig(n_bits=7)
    assert resolve({"task": "majority"})["n_bits"] == 5  # its dataclass's defaults
    with pytest.raises(ConfigError, match="n_bits"):
        MajorityConfig(n_bits=4)


def test_an_unregistered_task_is_an_error_that_names_the_tasks() -> None:
    with majority_task():
        pass
    assert "majority" not in CONFIGS and CHANCE.get("majority") is None
    with pytest.raises(ConfigError, match="task must be one of parity, mnist, got 'majority'"):
        config_from_dict({"task": "majority"})
    with pytest.raises(TypeError, match="no task for config MajorityConfig"):
        build_task(MajorityConfig(), CPU)
    with pytest.raises(TypeError, match="no task for config PonderConfig"):
        eval_set_names(PonderConfig())


def test_a_name_is_registered_once(majority: TaskDef[MajorityConfig]) -> None:
    register(majority)  # the same definition again: nothing changes
    other = TaskDef(MajorityConfig, majority.build, lambda c: ["test"], 0.25, ("test",))
    with pytest.raises(ValueError, match="'majority' is registered already"):
        register(other)
    assert get_task("majority") is majority


def test_build_task_builds_a_registered_task(majority: TaskDef[MajorityConfig]) -> None:
    config = MajorityConfig(**SMALL)  # type: ignore[arg-type]
    task = build_task(config, CPU)
    assert list(task.eval_sets) == eval_set_names(config)
    x, y = task.sample_batch(torch.Generator().manual_seed(0))
    assert x.shape == (64, 5) and y.shape == (64,)
    assert torch.equal(y, (x.sum(dim=1) >= 3).float())  # the majority of 5 bits
    out = task.model(x)
    assert out.log_p.shape == out.lambda_logits.shape == out.y_hat.shape == (6, 64)
    p = out.log_p.exp()
    assert torch.allclose(p.sum(dim=0), torch.ones(64), atol=1e-5)
    # lambda_N = 1: p_N is all the mass not halted before N
    survival = torch.sigmoid(-out.lambda_logits[:-1]).prod(dim=0)
    assert torch.allclose(p[-1], survival, atol=1e-6)
    assert torch.equal(build_task(config, CPU).eval_sets["test"].x, task.eval_sets["test"].x)  # fixed


def test_trainer_trains_a_registered_task(majority: TaskDef[MajorityConfig]) -> None:
    config = MajorityConfig(**SMALL, lr=1e-2, iterations=150, eval_interval=50)  # type: ignore[arg-type]
    trainer = Trainer(config)
    history = list(trainer.run())
    assert [m["iteration"] for m in history] == [50, 100, 150] and history[-1]["outcome"] == "completed"
    declared = {f"test/{m}" for m in SET_METRICS + SET_LIST_METRICS} | {f"train/{m}" for m in TRAIN_METRICS}
    assert set(history[-1]) == declared | {"iteration", "outcome", "nan_events", *TIMING_KEYS}
    for m in history:
        assert sum(m["test/halting_distribution"]) == pytest.approx(1.0, abs=1e-5)
        assert len(m["test/per_step_accuracy"]) == config.max_steps
    assert history[-1]["test/halted_accuracy"] > 0.8  # majority is easy: far above chance (0.5)
    # a checkpoint names its task; restoring it goes through the registry too
    restored = Trainer.from_state(trainer.state_dict())
    assert isinstance(restored.config, MajorityConfig) and restored.evaluate() == trainer.evaluate()


def test_a_task_refuses_data_it_cannot_use() -> None:
    with pytest.raises(TypeError, match="parity task makes its own data"):
        build_task(ParityConfig(n_elems=3, eval_samples=8), CPU, data=object())
    with pytest.raises(TypeError, match="mnist task's data is an MnistData"):
        build_task(MnistConfig(eval_samples=8), CPU, data=object())
