"""Fused trials: up to ``fuse`` trials of a study trained as one model per device, each still a trial.

Every trial keeps its own Tune trainable, so it is its own Tune trial, Optuna trial, end record,
reports, checkpoint and ASHA decision: nothing in the search, the scheduler, the records or resume
knows about fusion. What changes is who trains. With ``[resources] fuse = K`` the trainable does
not build a `Trainer`: it hands its run to the *fuser* of its device, a Ray actor holding a
`ponder.fused_trainer.FusedTrainer` of K slots, and relays the member's metrics and checkpoints
to Tune (`FusedRun`). Each trial reserves 1/K of ``[resources]``, so Tune places K trials on the
CPUs and GPU one group uses.

- A member trains only while its trainable waits for its next report (`Fuser.advance`): after a
  report it is *held*, so a trial that ASHA stops, or that Tune pauses, costs the group nothing;
  its slot goes to the next trial that needs one (the held member is evicted: its last report's
  checkpoint is with its trainable, which joins again from it if it is asked to go on).
- A fuser trains one device's members of one shape (`ponder.fused.fusable_key`): trials that
  differ in ``n_hidden``, ``batch_size`` or the task go to different fusers.
- The fusers belong to one `FuserRegistry` actor that the driver starts and stops: a driver that
  dies takes its fusers with it, and the trials of a resumed study join new ones from their
  checkpoints. A fuser that fails exits; its members' trainables join a new one from their last
  checkpoints, which continue exactly (a member's checkpoint is a plain `Trainer` checkpoint).

Ray is imported here (this is the run layer); torch only inside the actors.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

__all__ = ["FusedRun", "FuserRegistry", "Fusion", "start_fusion", "stop_fusion"]

log = logging.getLogger("ponder-study")

Metrics = dict[str, Any]
Due = tuple[Metrics, bytes, int]
"""A member's report: its metrics, its checkpoint (a plain `Trainer` checkpoint's bytes), and how
many members its group held when it fell due."""


@dataclass(frozen=True)
class Fusion:
    """What a fused trial needs to find its fuser: the registry's name and the group's size."""

    registry: str
    """The name of the driver's `FuserRegistry` actor."""
    capacity: int
    """K: members a fuser trains as one model."""
    threads: int
    """torch threads of a fuser on the CPU (the CPUs one group uses)."""


@dataclass
class _Slot:
    slot: int
    wanted: bool = False
    """Its trainable waits for its next report: it trains (else it is held)."""
    due: Due | None = None
    """The report made for its trainable, not yet taken."""


class Fuser:
    """One device's fused group: trains the members whose trainables wait for a report."""

    def __init__(self, capacity: int, threads: int) -> None:
        import torch

        from ponder.fused_trainer import FusedTrainer

        torch.set_num_threads(threads)
        self._group = FusedTrainer(capacity, "auto")
        self._members: dict[str, _Slot] = {}
        self._cond = threading.Condition()
        self._iterations = 0  # member-iterations trained, for `stats`
        self._steps = 0
        self._id = uuid.uuid4().hex[:12]
        threading.Thread(target=self._loop, name="fuser", daemon=True).start()

    def describe(self) -> tuple[str, str]:
        """(its device as the Parquet's ``device`` column names it, its own id)."""
        from ponder.trainer import device_label

        return device_label(self._group.device), self._id

    def join(self, trial_id: str, config: dict[str, Any], state: bytes | None) -> str:
        """Take the trial's run into a free slot (evicting a held member if none is free):
        ``joined``, ``full`` (every slot's member wants to train), or ``finished`` (its
        checkpoint says the run is over: nothing to train). A trial already here (Tune retried
        it) starts again from ``state``: its checkpoint is the truth."""
        import torch

        from ponder.config import config_from_dict

        run_state = torch.load(io.BytesIO(state), map_location="cpu", weights_only=True) if state else None
        if run_state is not None and run_state.get("outcome", "running") != "running":
            return "finished"
        with self._cond:
            if trial_id in self._members:
                self._drop(trial_id)
            if not self._group.free_slots:
                held = [t for t, m in self._members.items() if not m.wanted and m.due is None]
                if not held:
                    return "full"
                self._drop(held[0])
            slot = self._group.join(config_from_dict(dict(config)), run_state)
            self._group.hold(slot)
            self._members[trial_id] = _Slot(slot)
            return "joined"

    def advance(self, trial_id: str) -> Due | None:
        """Train the trial's member to its next report and return it (None: the member is not
        here, evicted while held: join again from the last checkpoint)."""
        with self._cond:
            member = self._members.get(trial_id)
            if member is None:
                return None
            if member.due is None:
                member.wanted = True
                self._group.release(member.slot)
                self._cond.notify_all()
            while member.due is None and self._members.get(trial_id) is member:
                self._cond.wait()
            if self._members.get(trial_id) is not member:
                return None
            due, member.due = member.due, None
            assert due is not None
            if due[0].get("outcome") != "running":  # its run is over: the slot goes
                self._drop(trial_id)
            return due

    def leave(self, trial_id: str) -> None:
        """The trial no longer trains here (it ended, or ASHA stopped it)."""
        with self._cond:
            if trial_id in self._members:
                self._drop(trial_id)

    def stats(self) -> dict[str, int]:
        """Members, fused steps made and member-iterations trained, for tests and benchmarks."""
        with self._cond:
            return {"members": len(self._members), "steps": self._steps, "iterations": self._iterations}

    def _drop(self, trial_id: str) -> None:
        member = self._members.pop(trial_id)
        self._group.leave(member.slot)
        self._cond.notify_all()

    def _loop(self) -> None:
        """Step the group while any member wants to train; hand each due report to its trainable."""
        try:
            while True:
                with self._cond:
                    while not self._group.running:
                        self._cond.wait()
                    trained = len(self._group.running)
                    due = self._group.step()
                    self._steps += 1
                    self._iterations += trained
                    by_slot = {m.slot: m for m in self._members.values()}
                    for slot, metrics in due.items():
                        member = by_slot[slot]
                        state = _checkpoint_bytes(self._group.state_dict(slot))
                        member.due = (metrics, state, len(self._members))
                        member.wanted = False
                        self._group.hold(slot)
                    if due:
                        self._cond.notify_all()
        except BaseException:  # the group is broken: end the actor, its members rejoin elsewhere
            log.error(
                "a fuser failed; its trials continue from their checkpoints:\n%s", traceback.format_exc()
            )
            os._exit(1)


def _checkpoint_bytes(state: dict[str, Any]) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


class FuserRegistry:
    """The driver's fusers: one per node, device and shape (more where one is full); places a
    trial in one. Owned by the driver, so every fuser ends with it."""

    def __init__(self, capacity: int, threads: int) -> None:
        self._capacity, self._threads = capacity, threads
        self._fusers: dict[tuple[str, str, str], list[Any]] = {}

    def place(
        self, trial_id: str, node_id: str, gpu: str | None, config: dict[str, Any], state: bytes | None
    ) -> Any:
        """The fuser that took the trial's run, or None if its checkpoint says the run is over."""
        group = (node_id, gpu or "cpu", _shape(config))
        fusers = self._fusers.setdefault(group, [])
        for fuser in list(fusers):
            try:
                answer = ray.get(fuser.join.remote(trial_id, config, state))
            except RayActorError:  # it failed: its members go elsewhere
                fusers.remove(fuser)
                continue
            if answer != "full":
                return fuser if answer == "joined" else None
        fuser = _new_fuser(self._capacity, self._threads, node_id, gpu)
        fusers.append(fuser)
        answer = ray.get(fuser.join.remote(trial_id, config, state))
        return fuser if answer == "joined" else None

    def stats(self) -> list[dict[str, Any]]:
        """Each live fuser's group and `Fuser.stats`."""
        out = []
        for (node_id, device, shape), fusers in self._fusers.items():
            for fuser in fusers:
                try:
                    out.append(
                        {
                            "node_id": node_id,
                            "device": device,
                            "shape": shape,
                            **ray.get(fuser.stats.remote()),
                        }
                    )
                except RayActorError:
                    continue
        return out

    def stop(self) -> None:
        for fusers in self._fusers.values():
            for fuser in fusers:
                ray.kill(fuser)
        self._fusers.clear()


def _shape(config: dict[str, Any]) -> str:
    from ponder.config import config_from_dict
    from ponder.fused import fusable_key

    return repr(fusable_key(config_from_dict(dict(config))))


def _new_fuser(capacity: int, threads: int, node_id: str, gpu: str | None) -> Any:
    """A fuser on ``node_id``, seeing only GPU ``gpu`` (Ray's id) if one is given. It reserves
    nothing: its members' trials hold the CPUs and the GPU it uses."""
    options: dict[str, Any] = {
        "num_cpus": 0,
        "max_concurrency": capacity + 8,  # every member's trainable may wait in `advance` at once
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
    }
    if gpu is not None:
        options["runtime_env"] = {"env_vars": {"CUDA_VISIBLE_DEVICES": gpu}}
    return ray.remote(Fuser).options(**options).remote(capacity, threads)


_registries: list[Any] = []
"""The driver's registries' handles, held so that none is collected while the driver runs."""


def start_fusion(capacity: int, threads: int) -> tuple[Fusion, Any]:
    """Start the driver's `FuserRegistry`: (what the trainables need, the registry's handle). The
    driver owns it, and it owns the fusers: all end when the driver disconnects from Ray."""
    name = f"ponder-fusers-{uuid.uuid4().hex[:12]}"
    registry = ray.remote(FuserRegistry).options(name=name, num_cpus=0).remote(capacity, threads)
    _registries.append(registry)
    return Fusion(name, capacity, threads), registry


def stop_fusion(registry: Any) -> None:
    """Stop every fuser and the registry (a driver that dies stops them too: it owns them)."""
    try:
        ray.get(registry.stop.remote(), timeout=30)
    except Exception as e:  # already gone with its node, or Ray is going down
        log.debug("fusers not stopped cleanly: %s", e)
    ray.kill(registry)


@dataclass
class FusedRun:
    """A trial's run trained by its device's fuser, as `study.run.trainable` uses a `Trainer`:
    `run` yields its metrics when `Trainer.run` would, `save` writes its checkpoint."""

    fusion: Fusion
    trial_id: str
    config: dict[str, Any]
    state: bytes | None = None
    """The last checkpoint: the one Tune gave at the start, then the last report's."""
    outcome: str = "running"
    iteration: int = 0
    device: str = ""
    """The fuser's device, as the Parquet's ``device`` column names it."""
    group: str = ""
    """The fuser's id: trials reported with the same one were trained as one model."""
    members: int = 0
    """The members the fuser held at the last report."""
    _fuser: Any = field(default=None, repr=False)

    def run(self) -> Iterator[Metrics]:
        """The member's metrics at each report; joins a fuser again from the last checkpoint when
        its fuser evicted it or failed. Returns at once if the checkpoint's run is over."""
        while self.outcome == "running":
            if self._fuser is None and not self._join():
                self.outcome = "finished"
                return
            try:
                due = ray.get(self._fuser.advance.remote(self.trial_id))
            except RayActorError:
                log.warning("trial %s: its fuser failed; it goes on from its last checkpoint", self.trial_id)
                due = None
            if due is None:
                self._fuser = None
                continue
            metrics, self.state, self.members = due
            self.outcome, self.iteration = str(metrics["outcome"]), int(metrics["iteration"])
            yield metrics

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the last report's checkpoint (a plain `Trainer` checkpoint)."""
        assert self.state is not None, "no report made yet"
        Path(path).write_bytes(self.state)

    def leave(self) -> None:
        """Free the member's slot (its trial ended or was stopped); best effort."""
        if self._fuser is not None:
            self._fuser.leave.remote(self.trial_id)
            self._fuser = None

    def _join(self) -> bool:
        registry = ray.get_actor(self.fusion.registry)
        gpus = ray.get_gpu_ids()
        gpu = str(gpus[0]) if gpus else None
        node_id = ray.get_runtime_context().get_node_id()
        self._fuser = ray.get(registry.place.remote(self.trial_id, node_id, gpu, self.config, self.state))
        if self._fuser is None:
            return False
        self.device, self.group = ray.get(self._fuser.describe.remote())
        return True
