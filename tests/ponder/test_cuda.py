"""The training step on a CUDA device: what the CPU computes, compiled (CUDA graphs) as eager, resumed
exactly, and its checkpoints evaluated on the CPU. Skipped where torch finds no CUDA device."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import ponder.compiled
from ponder.config import MnistConfig, ParityConfig
from ponder.data.mnist import MnistData
from ponder.gru import gru_unroll
from ponder.trainer import Trainer
from tests.ponder.test_fused import _plain, train_to_end
from tests.ponder.test_trainer import _digits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

PARITY = {"n_elems": 6, "n_hidden": 16, "max_steps": 5, "batch_size": 32, "eval_samples": 64}
MNIST = {"max_steps": 3, "n_hidden": 8, "n_embed": 8, "batch_size": 16, "eval_samples": 32}


def _trainer(task: str, device: str, compile: str = "off") -> Trainer:
    if task == "parity":
        return Trainer(ParityConfig(**PARITY, device=device, compile=compile))  # type: ignore[arg-type]
    # no dropout: the devices (and Inductor) draw dropout's random numbers each their own way
    config = MnistConfig(**MNIST, dropout=0.0, eval_rotations=(), device=device, compile=compile)  # type: ignore[arg-type]
    return Trainer(config, _digits())


def _mnist(task: str) -> MnistData | None:
    return _digits() if task == "mnist" else None


def _close(a: torch.Tensor, b: torch.Tensor, rel: float) -> bool:
    """Within ``rel`` of each other in norm."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm()) <= rel * max(float(a.norm()), 1e-12)


@pytest.mark.parametrize("task", ["parity", "mnist"])
def test_cuda_computes_what_the_cpu_computes(task: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # float32 against float32: cuDNN's convolutions round through TF32 by default, which put the
    # MNIST CNN's weight gradients 3 % (in norm) off the CPU's (seen on an H200)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    cpu = _trainer(task, "cpu")
    cuda = Trainer.from_state(cpu.state_dict(), _mnist(task), device="cuda", compile="off")
    assert cuda.device.type == "cuda" and next(cuda.model.parameters()).is_cuda
    for i in range(3):
        x, y = cpu.sample_batch(cpu.generator)
        a, b = cpu.train_step((x, y)), cuda.train_step((x.cuda(), y.cuda()))
        assert b.loss == pytest.approx(a.loss, rel=1e-3), i
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-2), i
        for (name, p), q in zip(cpu.model.named_parameters(), cuda.model.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            assert _close(p.grad, q.grad, 1e-3), (i, name)
    # evaluation: what does not depend on the halting draws (each device draws its own) agrees
    e_cpu, e_cuda = cpu.evaluate(), cuda.evaluate()
    name = next(iter(cpu.eval_sets))
    for key in ("best_step_accuracy", "expected_steps", "loss"):
        assert e_cuda[f"{name}/{key}"] == pytest.approx(e_cpu[f"{name}/{key}"], rel=1e-2, abs=1e-2), key


def test_the_fused_gru_backward_is_right_on_cuda() -> None:
    """`ponder.gru`'s hand-written backward against autograd's numerical gradient, on the GPU."""
    torch.manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=torch.double, device="cuda", requires_grad=True)

    x, h0, weights = rand(3, 5), rand(3, 4), [rand(12, 5), rand(12, 4), rand(12), rand(12)]
    assert torch.autograd.gradcheck(lambda *a: gru_unroll(*a, 3), (x, h0, *weights))


@pytest.mark.slow
@pytest.mark.parametrize("graphs", [True, False], ids=["cuda-graphs", "no-graphs"])
@pytest.mark.parametrize("task", ["parity", "mnist"])
def test_compiled_on_cuda_agrees_with_eager(task: str, graphs: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ponder.compiled, "CUDA_GRAPHS", graphs)
    eager, compiled = _trainer(task, "cuda", "off"), _trainer(task, "cuda", "auto")  # auto: compiled on CUDA
    assert compiled.compiled and not eager.compiled
    for i in range(5):  # beyond the graphs' warm-up and recording runs: replays
        batch = eager.sample_batch(eager.generator)
        compiled.sample_batch(compiled.generator)  # keep both generators in step
        a, b = eager.train_step(batch), compiled.train_step(batch)
        assert b.loss == pytest.approx(a.loss, rel=1e-3), i
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-2), i
        for (name, p), q in zip(eager.model.named_parameters(), compiled.model.parameters(), strict=True):
            assert _close(p, q, 1e-3), (i, name)
    # the compiled run's checkpoint continues eagerly
    to_eager = Trainer.from_state(compiled.state_dict(), _mnist(task), compile="off")
    assert to_eager.train_step().loss == pytest.approx(compiled.train_step().loss, rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("compile", ["off", "auto"])
def test_a_cuda_run_resumes_where_it_stopped(compile: str, tmp_path: Path) -> None:
    straight = _trainer("parity", "cuda", compile)
    losses = [straight.train_step().loss for _ in range(6)]
    first = _trainer("parity", "cuda", compile)
    for _ in range(3):
        first.train_step()
    first.save(tmp_path / "ckpt.pt")
    torch.manual_seed(12345)
    torch.cuda.manual_seed(12345)  # the resumed run's streams come from the checkpoint, not from here
    resumed = Trainer.from_checkpoint(tmp_path / "ckpt.pt")
    assert resumed.device.type == "cuda" and resumed.iteration == 3
    # the same batches (the CUDA generator's state came back) and the same weights, to the
    # rounding of kernels that may sum in another order (atomics)
    assert [resumed.train_step().loss for _ in range(3)] == pytest.approx(losses[3:], rel=1e-5)


def test_a_gpu_runs_checkpoint_evaluates_on_the_cpu(tmp_path: Path) -> None:
    """What `ponder-study evaluate --device cpu` does with a GPU trial's checkpoint."""
    gpu = _trainer("parity", "cuda")
    for _ in range(5):
        gpu.train_step()
    gpu.save(tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", map_location="cpu", weights_only=True)
    assert state["generator_device"] == "cuda" and "cuda_rng" in state
    cpu = Trainer.from_checkpoint(tmp_path / "ckpt.pt", device="cpu")
    assert cpu.device.type == "cpu" and cpu.iteration == 5
    for p, q in zip(gpu.model.parameters(), cpu.model.parameters(), strict=True):
        assert torch.equal(p.cpu(), q)
    e_gpu, e_cpu = gpu.evaluate(), cpu.evaluate()
    assert e_cpu["test/best_step_accuracy"] == pytest.approx(e_gpu["test/best_step_accuracy"], abs=0.02)
    cpu.train_step()  # and it trains on, from its own random stream
    assert cpu.iteration == 6


@pytest.mark.parametrize("compile", ["off", "auto"])
def test_fused_members_on_cuda_compute_what_their_plain_cuda_runs_compute(compile: str) -> None:
    """Three members (own lambda_p, beta, lr, seed, max_steps) trained fused on the GPU, eager
    (``off``) and compiled (``auto``: what a fused study on a GPU runs): each one's loss at every
    iteration and its metrics at each evaluation are its plain eager CUDA run's."""
    from ponder.fused.trainer import FusedTrainer

    configs = [
        ParityConfig(**{**PARITY, "max_steps": m}, lambda_p=lp, beta=b, lr=lr, seed=s, device="cuda",  # type: ignore[arg-type]
                     iterations=30, eval_interval=10, compile=compile)
        for m, lp, b, lr, s in ((5, 0.2, 0.01, 3e-3, 0), (3, 0.5, 0.1, 1e-2, 1), (4, 0.3, 0.05, 5e-3, 2))
    ]  # fmt: skip
    fused = FusedTrainer(4, "cuda")
    slots = [fused.join(c) for c in configs]
    assert fused.compiled == (compile == "auto")
    # compiled kernels sum in yet another order: agree to rounding, as `Trainer`'s compiled step does
    rel, acc = (1e-4, 1e-6) if compile == "off" else (1e-3, 0.02)
    losses, reports = train_to_end(fused)
    for slot, config in zip(slots, configs, strict=True):
        plain_losses, plain_reports = _plain(dataclasses.replace(config, compile="off"))
        assert losses[slot] == pytest.approx(plain_losses, rel=rel, abs=1e-5)
        for got, want in zip(reports[slot], plain_reports, strict=True):
            assert got["test/halted_accuracy"] == pytest.approx(want["test/halted_accuracy"], abs=acc)


def test_the_counter_stream_is_the_same_bits_on_cuda_and_a_run_moved_there_draws_on() -> None:
    """Integer ops only: a run's batches are the same on the GPU as on the CPU, so a CPU run's
    checkpoint continued on CUDA (and a fused member there) draws exactly its next batches."""
    cpu = _trainer("parity", "cpu")
    for _ in range(2):
        cpu.train_step()
    cuda = Trainer.from_state(cpu.state_dict(), device="cuda")
    for _ in range(3):
        (x, y), (xc, yc) = cpu.next_batch(), cuda.next_batch()
        assert torch.equal(x, xc.cpu()) and torch.equal(y, yc.cpu())
        cpu.train_step((x, y)), cuda.train_step((xc, yc))
