"""The compiled training step: when it is chosen, where its cache lives, and that it computes what
eager does (losses, gradients, checkpoints, resume) for both step functions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ponder.compiled import (
    compile_cache_dir,
    forget_compiled,
    share_compile_cache,
    should_compile,
)
from ponder.config import ConfigError, MnistConfig, ParityConfig, config_from_dict
from ponder.data.mnist import MnistData
from ponder.gru import gru_unroll, gru_unroll_plain
from ponder.trainer import Trainer
from tests.ponder.test_trainer import _digits

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_compiles_on_cuda_only_whatever_the_budget() -> None:
    assert should_compile("auto", CUDA) and not should_compile("auto", CPU)
    assert should_compile("on", CPU) and not should_compile("off", CUDA)
    # a run and its resume to another budget compute the same numbers: eager on the CPU either way
    assert not Trainer(ParityConfig(device="cpu", iterations=10**6, eval_samples=8)).compiled


def test_compile_is_a_config_field_with_three_values() -> None:
    assert ParityConfig().compile == MnistConfig().compile == "auto"
    assert config_from_dict({"task": "parity", "compile": "off"}).compile == "off"
    with pytest.raises(ConfigError, match="compile"):
        ParityConfig(compile="yes")  # type: ignore[arg-type]
    assert not Trainer(ParityConfig(device="cpu", compile="auto", iterations=100, eval_samples=8)).compiled


def test_the_cache_is_under_ponder_study_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PONDER_STUDY_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert compile_cache_dir() == tmp_path / "inductor"
    assert share_compile_cache() == tmp_path / "inductor"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    monkeypatch.delenv("PONDER_STUDY_CACHE")
    assert compile_cache_dir() == Path.home() / ".cache" / "ponder-study" / "inductor"


def test_a_cache_dir_set_by_hand_wins_but_inductors_default_does_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("PONDER_STUDY_CACHE", str(tmp_path / "ours"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert share_compile_cache() == tmp_path / "mine"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what torch writes itself
    assert share_compile_cache() == tmp_path / "ours" / "inductor"


@pytest.mark.xdist_group("compile")  # before the compiling tests (`COMPILES`), never between them
def test_forget_compiled_lets_a_process_compile_past_the_recompile_limit() -> None:
    """A reused Tune actor's next trial compiles its own shape, not falls back to eager silently."""
    import torch._dynamo

    # the config's own patch: monkeypatch's undo left recompile_limit missing for later compiles
    with torch._dynamo.config.patch(recompile_limit=2):
        _compile_shapes_past_the_limit()


def _compile_shapes_past_the_limit() -> None:
    forget_compiled()
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        graphs.append(len(inputs))
        return gm.forward

    def run(n: int) -> None:  # one "trial": a new compiled step, a shape of its own
        torch.compile(lambda x: x * 2 + 1, backend=backend, dynamic=False)(torch.ones(n))

    for n in range(1, 5):
        run(n)
    assert len(graphs) == 2  # shapes 3 and 4 ran eagerly: the limit
    for n in range(5, 9):
        forget_compiled()  # what study.run.trainable does at each trial's start
        run(n)
    assert len(graphs) == 6


@pytest.mark.parametrize("n_steps", [1, 4])
def test_the_plain_unroll_equals_the_fused_one(n_steps: int) -> None:
    torch.manual_seed(n_steps)
    x = torch.randn(3, 5, dtype=torch.double, requires_grad=True)
    h0 = torch.randn(3, 4, dtype=torch.double, requires_grad=True)
    weights = [
        torch.randn(12, 5, dtype=torch.double, requires_grad=True),
        torch.randn(12, 4, dtype=torch.double, requires_grad=True),
        torch.randn(12, dtype=torch.double, requires_grad=True),
        torch.randn(12, dtype=torch.double, requires_grad=True),
    ]
    fused, plain = gru_unroll(x, h0, *weights, n_steps), gru_unroll_plain(x, h0, *weights, n_steps)
    assert torch.allclose(fused, plain, atol=1e-12)
    g = torch.randn_like(fused)
    for a, b in zip(
        torch.autograd.grad((fused * g).sum(), [x, h0, *weights]),
        torch.autograd.grad((plain * g).sum(), [x, h0, *weights]),
        strict=True,
    ):
        assert torch.allclose(a, b, atol=1e-10)


# -- compiled against eager (each compiles: slow on a CPU) ---------------------------------------

PARITY = {"n_elems": 6, "n_hidden": 16, "max_steps": 5, "batch_size": 8, "eval_samples": 16, "device": "cpu"}
MNIST = {"max_steps": 3, "n_hidden": 8, "n_embed": 8, "batch_size": 8, "eval_samples": 16, "device": "cpu"}


def _trainer(task: str, compile: str, **overrides: object) -> Trainer:
    if task == "parity":
        return Trainer(ParityConfig(**PARITY, compile=compile, **overrides))  # type: ignore[arg-type]
    # no dropout: Inductor draws its random numbers its own way, so only a dropout-free MNIST
    # step can equal eager number for number
    config = MnistConfig(**MNIST, dropout=0.0, eval_rotations=(), compile=compile, **overrides)  # type: ignore[arg-type]
    return Trainer(config, _digits())


COMPILES = pytest.mark.xdist_group("compile")
"""The compiling tests run in one test process, in file order, parity before MNIST: the parity step
compiled by the first is reused by the next (measured alone here: 20 s cold, under 0.1 s after
it; the MNIST step's other shapes in between made the next parity compile start over)."""


@pytest.fixture
def shared_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """One compile cache for these tests (a later test loads what an earlier one compiled: they
    share a test process, `COMPILES`, as a study's trials share a machine)."""
    monkeypatch.setenv("PONDER_STUDY_CACHE", str(tmp_path_factory.getbasetemp() / "ponder-study-cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)


@pytest.mark.slow
@COMPILES
@pytest.mark.usefixtures("shared_cache")
def test_a_compiled_run_resumes_exactly(tmp_path: Path) -> None:
    straight = _trainer("parity", "on")
    results = [straight.train_step().loss for _ in range(4)]
    first = _trainer("parity", "on")
    for _ in range(2):
        first.train_step()
    first.save(tmp_path / "ckpt.pt")
    torch.manual_seed(12345)
    resumed = Trainer.from_checkpoint(tmp_path / "ckpt.pt")
    assert resumed.compiled
    assert [resumed.train_step().loss for _ in range(2)] == results[2:]
    for p, q in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.slow
@COMPILES
@pytest.mark.usefixtures("shared_cache")
@pytest.mark.parametrize("task", ["parity", "mnist"])
def test_compiled_and_eager_agree_and_checkpoints_interchange(task: str) -> None:
    eager, compiled = _trainer(task, "off"), _trainer(task, "on")
    assert compiled.compiled and not eager.compiled
    # the compiled step never wraps the model: the same state_dict keys, no _orig_mod.
    assert list(compiled.state_dict()["model"]) == list(eager.state_dict()["model"])
    for i in range(3):
        batch = eager.sample_batch(eager.generator)
        compiled.sample_batch(compiled.generator)  # keep both generators in step
        a, b = eager.train_step(batch), compiled.train_step(batch)
        for name in ("loss", "loss_rec", "loss_reg", "grad_norm"):
            assert getattr(b, name) == pytest.approx(getattr(a, name), rel=1e-4, abs=1e-6), (i, name)
        for (name, p), q in zip(eager.model.named_parameters(), compiled.model.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), (i, name)
            assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), (i, name)
    # a compiled run's checkpoint continues eagerly, and the other way round
    to_eager = Trainer.from_state(compiled.state_dict(), compiled_mnist(task), compile="off")
    to_compiled = Trainer.from_state(eager.state_dict(), compiled_mnist(task), compile="on")
    assert to_compiled.compiled and not to_eager.compiled
    a, b = to_eager.train_step(), to_compiled.train_step()
    assert a.loss == pytest.approx(b.loss, rel=1e-4, abs=1e-6)


def compiled_mnist(task: str) -> MnistData | None:
    return _digits() if task == "mnist" else None
