"""Loading checkpoints: from a path or from bytes, onto another device, and never running code."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ponder.config import ParityConfig
from ponder.trainer import EagerAdam, Trainer


def _trained(steps: int = 3) -> Trainer:
    config = ParityConfig(n_elems=5, max_steps=4, n_hidden=8, batch_size=16, eval_samples=64, device="cpu")
    trainer = Trainer(config)
    for _ in range(steps):
        trainer.train_step()
    return trainer


def _same_weights(a: Trainer, b: Trainer) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True))


def test_a_checkpoint_loads_the_same_from_a_path_and_from_its_bytes(tmp_path: Path) -> None:
    trainer = _trained()
    trainer.save(tmp_path / "t.pt")
    from_path = Trainer.from_checkpoint(tmp_path / "t.pt")
    from_bytes = Trainer.from_checkpoint(io.BytesIO((tmp_path / "t.pt").read_bytes()))  # as from s3://
    for restored in (from_path, from_bytes):
        assert restored.iteration == 3 and _same_weights(trainer, restored)
    assert from_path.evaluate() == from_bytes.evaluate() == trainer.evaluate()


def test_a_loaded_checkpoint_keeps_adams_state_until_it_trains_on(tmp_path: Path) -> None:
    """The optimizer is made at first use: a checkpoint loaded and saved again without training
    keeps Adam's moments, and a run resumed from it steps as the original does."""
    trainer = _trained()
    trainer.save(tmp_path / "t.pt")
    loaded = Trainer.from_checkpoint(tmp_path / "t.pt")
    loaded.save(tmp_path / "again.pt")  # never trained here: Adam's state passed through as loaded
    first, again = (torch.load(tmp_path / f, weights_only=True)["optimizer"] for f in ("t.pt", "again.pt"))
    assert first["param_groups"] == again["param_groups"] and len(again["state"]) == len(first["state"]) > 0
    for key, moments in first["state"].items():
        assert all(torch.equal(v, again["state"][key][k]) for k, v in moments.items())
    resumed = Trainer.from_checkpoint(tmp_path / "again.pt")
    trainer.train_step(), resumed.train_step()
    assert _same_weights(trainer, resumed)


def test_evaluating_or_training_a_checkpoint_never_imports_dynamo(tmp_path: Path) -> None:
    """torch's own optimizers import ``torch._dynamo`` at their first call (2.2-2.5 s of CPU, in
    every trial's worker): evaluating a checkpoint never makes the optimizer, and training makes
    `EagerAdam`, which does not import it."""
    path = str(tmp_path / "t.pt")
    _trained().save(path)
    code = (
        "import sys, torch\nfrom ponder.trainer import Trainer\n"
        f"Trainer.from_checkpoint({path!r}).evaluate()\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        f"trainer = Trainer.from_checkpoint({path!r})\n"
        "trainer.train_step()\ntrainer.state_dict()\n"  # Adam made, its state loaded, stepped, saved
        "assert 'torch._dynamo' not in sys.modules\n"
        "torch.optim.Adam(trainer.model.parameters()).zero_grad()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "True"  # torch's own Adam imports it: the checks above could fail


def test_the_trainers_adam_updates_and_saves_as_torchs_own_bit_for_bit() -> None:
    """`EagerAdam` is ``torch.optim.Adam(fused=True)`` without its methods' dynamo wrappers: the
    same weights and moments after every step, the same ``state_dict``, each loading the other's."""
    assert isinstance(_trained().optimizer, EagerAdam)
    torch.manual_seed(0)
    shapes = [(4, 3), (3,), (2, 2, 2)]
    ours_params = [torch.randn(shape, requires_grad=True) for shape in shapes]
    torch_params = [p.detach().clone().requires_grad_() for p in ours_params]
    ours = EagerAdam(ours_params, lr=3e-3, fused=True)
    theirs = torch.optim.Adam(torch_params, lr=3e-3, fused=True)

    def step_both(ours: torch.optim.Adam, theirs: torch.optim.Adam) -> None:
        grads = [torch.randn(shape) for shape in shapes]
        for optimizer in (ours, theirs):
            optimizer.zero_grad(set_to_none=True)
            for p, g in zip(optimizer.param_groups[0]["params"], grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
        pairs = zip(ours.param_groups[0]["params"], theirs.param_groups[0]["params"], strict=True)
        assert all(torch.equal(p, q) for p, q in pairs)

    for _ in range(4):
        step_both(ours, theirs)
    saved, torch_saved = ours.state_dict(), theirs.state_dict()
    assert saved["param_groups"] == torch_saved["param_groups"]
    assert saved["state"].keys() == torch_saved["state"].keys()
    for key, moments in torch_saved["state"].items():
        assert moments.keys() == saved["state"][key].keys()
        assert all(torch.equal(v, saved["state"][key][name]) for name, v in moments.items())
    # each continues from the other's state as from its own
    ours_again = EagerAdam([p.detach().clone().requires_grad_() for p in torch_params], lr=1.0, fused=True)
    theirs_again = torch.optim.Adam([p.detach().clone().requires_grad_() for p in ours_params], fused=True)
    ours_again.load_state_dict(torch_saved)
    theirs_again.load_state_dict(saved)
    for _ in range(2):
        step_both(ours_again, theirs_again)


@pytest.mark.parametrize("written", ["now", "before-generator_device"])
def test_from_state_builds_the_config_inside_and_can_move_it_to_another_device(written: str) -> None:
    trainer = _trained()
    state = trainer.state_dict()
    assert state["generator_device"] == "cpu"
    # a GPU run's checkpoint, as a CUDA trainer writes it: its data generator's state is a CUDA
    # generator's (16 bytes: seed and offset), which a CPU generator cannot take
    state["config"] = {**state["config"], "device": "cuda:7"}
    state.update(
        generator=torch.tensor([7, 0, 0, 0, 0, 0, 0, 0] * 2, dtype=torch.uint8), generator_device="cuda"
    )
    if written == "before-generator_device":  # told apart by its size instead
        del state["generator_device"]
    restored = Trainer.from_state(state, device="cpu")
    assert restored.config.device == "cpu" and restored.device == torch.device("cpu")
    assert restored.config.max_steps == 4 and restored.iteration == 3 and _same_weights(trainer, restored)
    assert state["config"]["device"] == "cuda:7"  # the caller's dict is left as it was
    # the data come from a CPU stream of their own (the GPU's cannot continue here), not the
    # config seed's, whose first batches the run has already trained on
    fresh = Trainer(restored.config)
    moved = restored.sample_batch(restored.generator)
    assert not torch.equal(moved[0], fresh.sample_batch(fresh.generator)[0])
    again = Trainer.from_state(state, device="cpu")
    assert torch.equal(moved[0], again.sample_batch(again.generator)[0])  # and the same each time
    restored.train_step()
    assert restored.iteration == 4


class _Payload:
    """Unpickling this runs ``os.mkdir(marker)``: what a tampered checkpoint could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (str(self.marker),)


def test_a_checkpoint_with_code_in_it_is_refused_without_running_it(tmp_path: Path) -> None:
    state = _trained(1).state_dict()
    state["extra"] = _Payload(tmp_path / "ran")
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        Trainer.from_checkpoint(tmp_path / "bad.pt")
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        Trainer.from_checkpoint(io.BytesIO((tmp_path / "bad.pt").read_bytes()))
    assert not (tmp_path / "ran").exists()
    torch.load(tmp_path / "bad.pt", weights_only=False)  # the payload is live: a full unpickle runs it
    assert (tmp_path / "ran").is_dir()


def test_a_checkpoint_is_readable_as_torch_save_would_leave_it(tmp_path: Path) -> None:
    """Written under a temporary name and renamed: not left 0600 as mkstemp makes it."""
    old = os.umask(0o022)
    try:
        _trained(0).save(tmp_path / "ckpt.pt")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "ckpt.pt").st_mode) == 0o644


def test_a_checkpoint_from_before_counter_streams_goes_on_with_its_generator_stream() -> None:
    """A checkpoint whose config has no ``data_stream`` was written when every run drew from its
    generator: restored, it goes on drawing the generator's batches (exactly what it would have
    trained on), though a new run's default is the counter stream; and a trainer built for the
    other stream refuses it rather than train on another run's batches."""
    config = ParityConfig(n_elems=5, max_steps=4, n_hidden=8, batch_size=16, eval_samples=64, device="cpu")
    old = Trainer(dataclasses.replace(config, data_stream="generator"))
    for _ in range(3):
        old.train_step()
    state = old.state_dict()
    del state["config"]["data_stream"]  # as a checkpoint written before the field
    restored = Trainer.from_state(pickle.loads(pickle.dumps(state)))
    assert restored.config.data_stream == "generator" and config.data_stream == "counter"
    for _ in range(3):
        x, y = old.next_batch()
        x_restored, y_restored = restored.next_batch()
        assert torch.equal(x, x_restored) and torch.equal(y, y_restored)
        old.train_step((x, y)), restored.train_step((x_restored, y_restored))
    assert _same_weights(old, restored)
    with pytest.raises(
        ValueError, match="trained on the generator data stream, this trainer's config says counter"
    ):
        Trainer(config).load_state_dict(state)


def test_a_counter_stream_run_resumes_with_the_batches_it_would_have_drawn() -> None:
    """The counter stream needs no generator state: a run's batch is a function of its seed and
    iteration, so a resumed run draws what the uninterrupted one draws, and two seeds differ."""
    straight = _trained(0)
    batches = []
    for _ in range(5):
        batches.append(straight.next_batch())
        straight.train_step(batches[-1])
    resumed = _trained(0)
    for _ in range(2):
        resumed.train_step()
    resumed = Trainer.from_state(resumed.state_dict())
    for x, y in batches[2:]:
        got = resumed.next_batch()
        assert torch.equal(got[0], x) and torch.equal(got[1], y)
        resumed.train_step()
    assert _same_weights(straight, resumed)
    other = Trainer(dataclasses.replace(straight.config, seed=1))
    assert not torch.equal(other.next_batch()[0], _trained(0).next_batch()[0])
