"""Fused trials: up to ``fuse`` trials of a study trained as one model per device, each still a trial.

Every trial keeps its own Tune trainable, so it is its own Tune trial, Optuna trial, end record,
reports, checkpoint and ASHA decision: nothing in the search, the scheduler, the records or resume
knows about fusion. What changes is who trains. With ``[resources] fuse = K`` the trainable does
not build a `Trainer`: it hands its run to the *fuser* of its device, a Ray actor holding a
`ponder.fused.trainer.FusedTrainer` of K slots, and relays the member's metrics and checkpoints
to Tune (`FusedRun`). Each trial reserves 1/K of ``[resources]``, so Tune places K trials on the
CPUs and GPU one group uses.

- A member trains only while its trainable waits for its next report (`Fuser.advance`): after a
  report it is *held*, so a trial that ASHA stops, or that Tune pauses, costs the group nothing;
  its slot goes to the next trial that needs one (the held member is evicted: its last report's
  checkpoint is with its trainable, which joins again from it if it is asked to go on).
- A fuser trains one device's members of one shape (`ponder.fused.key.fusable_key`): trials that
  differ in ``n_hidden``, ``batch_size`` or the task go to different fusers.
- The fusers belong to one `FuserRegistry` actor that the driver starts and stops, on the driver's
  own node: a study survives any node but the driver's, as unfused trials do. A lost node takes
  only its own fusers; their trials, retried by Tune on another node, join fusers there from
  their checkpoints. A driver that dies takes its registry and fusers with it, and the trials of
  a resumed study join new ones. A fuser that fails exits; its members' trainables join a new one
  from their last checkpoints, which continue exactly (a member's checkpoint is a plain `Trainer`
  checkpoint). A registry that fails is restarted by Ray on the driver's node (with none of its
  fusers: they end with it), and trials waiting for it wait on; one that is gone for good
  (`FusionLost`) ends the trial with one line saying so.

Ray is imported here (this is the run layer); torch only inside the actors.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

__all__ = ["FusedRun", "FuserRegistry", "Fusion", "FusionLost", "start_fusion", "stop_fusions"]

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
    waiting: bool = False
    """Its trainable waits in `Fuser.advance` for its next report."""
    pending: Due | None = None
    """A report made and not yet taken: the member is held until it is (one report ahead at most)."""
    ready: threading.Event = field(default_factory=threading.Event)
    """Set when a report is there for a waiting trainable, or when the member is dropped."""


class Fuser:
    """One device's fused group: trains the members whose trainables wait for a report.

    One thread owns the group: it applies the trainables' requests (join, advance, leave) between
    iterations and trains while any member may. The calls, each in a thread of Ray's pool, only
    queue a request and wait for its answer, so none waits on a lock the training holds.

    A member trains one report ahead: while its trainable hands a report to Tune, the member goes
    on towards the next, and is held only once that one is made and not yet asked for. A round
    trip through Tune then costs the group nothing; a trial that ASHA stopped costs it at most one
    report's iterations before its member is held and its slot can go."""

    def __init__(self, capacity: int, threads: int, unroll: int = 0) -> None:
        import torch

        from ponder.fused.trainer import FusedTrainer

        torch.set_num_threads(threads)
        self._group = FusedTrainer(capacity, "auto", unroll=unroll)
        self._members: dict[str, _Slot] = {}
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._iterations = 0  # member-iterations trained, for `stats`
        self._steps = 0
        self._busy_s = 0.0  # seconds spent training
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

        from ponder.config import config_from_dict, stored_config

        run_state = torch.load(io.BytesIO(state), map_location="cpu", weights_only=True) if state else None
        if run_state is not None and run_state.get("outcome", "running") != "running":
            return "finished"
        run_config = config_from_dict(stored_config(config))  # a trial of an older study lacks fields

        def join() -> str:
            if trial_id in self._members:
                self._drop(trial_id)
            if not self._group.free_slots:  # a held member's trial went, or waits for Tune
                held = [t for t, m in self._members.items() if m.pending is not None and not m.waiting]
                if not held:
                    return "full"
                self._drop(held[0])
            slot = self._group.join(run_config, run_state)
            self._group.hold(slot)
            self._members[trial_id] = _Slot(slot)
            return "joined"

        answer: str = self._call(join)
        return answer

    def advance(self, trial_id: str) -> Due | None:
        """Train the trial's member to its next report and return it (None: the member is not
        here, evicted while held: join again from the last checkpoint)."""

        def want() -> _Slot | None:
            member = self._members.get(trial_id)
            if member is not None:
                member.waiting = True
                if member.pending is not None:
                    member.ready.set()
                else:
                    self._group.release(member.slot)  # a new member's first request
            return member

        member: _Slot | None = self._call(want)
        if member is None:
            return None
        member.ready.wait()

        def take() -> Due | None:
            if self._members.get(trial_id) is not member:
                return None  # dropped meanwhile
            due, member.pending, member.waiting = member.pending, None, False
            member.ready.clear()
            if due is not None and due[0].get("outcome") != "running":  # its run is over: the slot goes
                self._drop(trial_id)
            else:
                self._group.release(member.slot)  # on towards the next report
            return due

        taken: Due | None = self._call(take)
        return taken

    def leave(self, trial_id: str) -> None:
        """The trial no longer trains here (it ended, or ASHA stopped it)."""
        self._call(lambda: self._drop(trial_id) if trial_id in self._members else None)

    def stats(self) -> dict[str, float]:
        """Members, fused steps made, member-iterations trained and seconds spent training."""
        stats: dict[str, float] = self._call(
            lambda: {
                "members": len(self._members),
                "steps": self._steps,
                "iterations": self._iterations,
                "busy_s": round(self._busy_s, 1),
            }
        )
        return stats

    def _call(self, request: Callable[[], Any]) -> Any:
        """Run ``request`` in the group's thread, between two iterations; its answer."""
        answer: Future[Any] = Future()
        self._requests.put((request, answer))
        self._wake.set()
        return answer.result()

    def _drop(self, trial_id: str) -> None:
        member = self._members.pop(trial_id)
        self._group.leave(member.slot)
        member.ready.set()  # a trainable waiting for it finds it gone

    def _loop(self) -> None:
        """Apply the queued requests; step the group while any member wants to train; hand each
        due report to its trainable."""
        try:
            while True:
                while True:
                    try:
                        request, answer = self._requests.get_nowait()
                    except queue.Empty:
                        break
                    try:
                        answer.set_result(request())
                    except Exception as e:  # the caller gets it
                        answer.set_exception(e)
                if not self._group.running:
                    self._wake.wait()
                    self._wake.clear()
                    continue
                self._train()
        except BaseException:  # the group is broken: end the actor, its members rejoin elsewhere
            log.error("a fuser failed; its trials go on from their checkpoints:\n%s", traceback.format_exc())
            os._exit(1)

    def _train(self) -> None:
        trained = len(self._group.running)
        start = time.perf_counter()
        due = self._group.step()
        self._steps += 1
        self._iterations += trained
        by_slot = {m.slot: m for m in self._members.values()}
        for slot, metrics in due.items():
            member = by_slot[slot]
            state = _checkpoint_bytes(self._group.state_dict(slot))
            member.pending = (metrics, state, len(self._members))
            self._group.hold(slot)  # until its trainable takes it (`advance` releases it then)
            if member.waiting:
                member.ready.set()
        self._busy_s += time.perf_counter() - start


def _checkpoint_bytes(state: dict[str, Any]) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


class FuserRegistry:
    """The driver's fusers, per shape: on a GPU as many as it holds groups (``[resources] gpu``
    each: 1, or 4 of 0.25), on CPUs as many per node as its CPUs hold groups (``cpu`` each); places
    a trial in one. Owned by the driver, so every fuser ends with it. Never more fusers than that:
    two groups on the same CPUs would each train at half speed, so a trial finding them all full
    waits for a slot (`FusedRun`). As many as that: Tune places that many groups' trials there."""

    def __init__(
        self, capacity: int, threads: int, group_cpus: float, group_gpus: float = 1.0, unroll: int = 0
    ) -> None:
        self._capacity, self._threads, self._group_cpus = capacity, threads, group_cpus
        self._group_gpus = group_gpus
        self._unroll = unroll  # the study's longest max_steps: a compiled group compiles once
        self._fusers: dict[tuple[str, str, str], list[Any]] = {}

    def place(
        self, trial_id: str, node_id: str, gpu: str | None, config: dict[str, Any], state: bytes | None
    ) -> tuple[str, Any]:
        """(``joined``, the fuser that took the trial's run), (``finished``, None) if its checkpoint
        says the run is over, or (``full``, None): every fuser this node may have is full."""
        group = (node_id, gpu or "cpu", _shape(config))
        fusers = self._fusers.setdefault(group, [])
        for fuser in list(fusers):
            try:
                answer = ray.get(fuser.join.remote(trial_id, config, state))
            except RayActorError:  # it failed: its members go elsewhere
                fusers.remove(fuser)
                continue
            if answer != "full":
                return answer, fuser if answer == "joined" else None
        if len(fusers) >= self._fusers_allowed(node_id, gpu):
            return "full", None
        fuser = _new_fuser(self._capacity, self._threads, self._unroll, node_id, gpu)
        fusers.append(fuser)
        answer = ray.get(fuser.join.remote(trial_id, config, state))
        return answer, fuser if answer == "joined" else None

    def _fusers_allowed(self, node_id: str, gpu: str | None) -> int:
        """Fusers of one shape on the node's CPUs, or on one of its GPUs."""
        if gpu is not None:
            return max(1, int(1 / self._group_gpus + 1e-9))
        nodes = ray.nodes()  # type: ignore[no-untyped-call]
        cpus = next((n["Resources"].get("CPU", 0) for n in nodes if n["NodeID"] == node_id), 0)
        return max(1, int(cpus // self._group_cpus))

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
    from ponder.config import config_from_dict, stored_config
    from ponder.fused.key import fusable_key

    return repr(fusable_key(config_from_dict(stored_config(config))))


def _new_fuser(capacity: int, threads: int, unroll: int, node_id: str, gpu: str | None) -> Any:
    """A fuser on ``node_id``, seeing only GPU ``gpu`` (Ray's id) if one is given. It reserves
    nothing: its members' trials hold the CPUs and the GPU it uses."""
    options: dict[str, Any] = {
        "num_cpus": 0,
        "max_concurrency": capacity + 8,  # every member's trainable may wait in `advance` at once
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
    }
    if gpu is not None:
        options["runtime_env"] = {"env_vars": {"CUDA_VISIBLE_DEVICES": gpu}}
    return ray.remote(Fuser).options(**options).remote(capacity, threads, unroll)


REGISTRY_RESTARTS = 5
"""How often Ray restarts a registry that failed (a crash, not its node's loss: that is the
driver's, and the study's, end)."""

REGISTRY_PATIENCE_S = 120.0
"""How long a trial waits for a registry that Ray is restarting before it gives up (`FusionLost`)."""


class FusionLost(RuntimeError):
    """The study's fuser registry is gone for good: the trial cannot train fused until the study
    is resumed (its driver stopped, or the driver's node left the cluster)."""


_registries: list[Any] = []
"""The driver's registries' handles, held so that none is collected while the driver runs."""


def start_fusion(
    capacity: int, threads: int, group_cpus: float, group_gpus: float = 1.0, unroll: int = 0
) -> tuple[Fusion, Any]:
    """Start the driver's `FuserRegistry`: (what the trainables need, the registry's handle). The
    driver owns it, and it owns the fusers: all end when the driver disconnects from Ray.
    ``group_cpus``, ``group_gpus``: what one group uses (``[resources]``); ``unroll``: the study's
    longest max_steps (`ponder.fused.trainer.FusedTrainer`'s)."""
    name = f"ponder-fusers-{uuid.uuid4().hex[:12]}"
    # on the driver's node, not wherever Ray finds room: a worker node that leaves would take the
    # registry, and with it every fuser it owns on every node, not just its own trials
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    registry = (
        ray.remote(FuserRegistry)
        .options(
            name=name,
            num_cpus=0,
            scheduling_strategy=here,
            max_restarts=REGISTRY_RESTARTS,  # a crash restarts it there, empty: trials join anew
            max_task_retries=REGISTRY_RESTARTS,
        )
        .remote(capacity, threads, group_cpus, group_gpus, unroll)
    )
    _registries.append(registry)
    return Fusion(name, capacity, threads), registry


def stop_fusions() -> None:
    """Stop this driver's fusers and registries now, as its Tune run ends: trials that Tune stopped
    leave their members wanting a report, which their fuser would otherwise train on to."""
    while _registries:
        registry = _registries.pop()
        try:
            for group in ray.get(registry.stats.remote(), timeout=30):
                log.info(
                    "fused group on %s: %d member-iterations in %d steps (%.1f a step), %.0f s training",
                    group["device"], group["iterations"], group["steps"],
                    group["iterations"] / max(group["steps"], 1), group["busy_s"],
                )  # fmt: skip
            ray.get(registry.stop.remote(), timeout=30)
            ray.kill(registry)
        except Exception as e:  # gone with its node, or Ray is going down: its fusers went with it
            log.debug("fusers not stopped cleanly: %s", e)


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
        """Join a fuser (waiting while every fuser this node may have is full); False if the
        checkpoint's run is over. A member this process held for an earlier trial leaves first:
        Tune reuses a trial's process for the next trial, and the earlier one is over."""
        global _last_member
        if _last_member is not None and _last_member[0] != self.trial_id:
            with contextlib.suppress(RayActorError):
                _last_member[1].leave.remote(_last_member[0])
        gpus = ray.get_gpu_ids()
        gpu = str(gpus[0]) if gpus else None
        node_id = ray.get_runtime_context().get_node_id()
        waited = time.monotonic()
        while True:
            answer, fuser = self._place(node_id, gpu)
            if answer != "full":
                break
            if time.monotonic() - waited > 60:
                log.warning(
                    "trial %s has waited %.0f s for a fused slot", self.trial_id, time.monotonic() - waited
                )
                waited = time.monotonic()
            time.sleep(0.2)  # a slot frees when a member reports and its trial goes
        if answer == "finished":
            return False
        self._fuser = fuser
        _last_member = (self.trial_id, fuser)
        self.device, self.group = ray.get(fuser.describe.remote())
        return True

    def _place(self, node_id: str, gpu: str | None) -> tuple[str, Any]:
        """The registry's `FuserRegistry.place` for this run; waits while Ray restarts a registry
        that failed, and raises `FusionLost` once it is gone for good."""
        lost_since = None
        while True:
            try:
                registry = ray.get_actor(self.fusion.registry)
                place: Any = registry.place.remote(self.trial_id, node_id, gpu, self.config, self.state)
                placed: tuple[str, Any] = ray.get(place)
                return placed
            except ValueError as e:  # no actor of that name: the driver stopped it, or it died for good
                reason = f"{e}"
            except ActorDiedError as e:  # its node (the driver's) left, or its restarts are spent
                reason = _first_line(e)
            except RayActorError as e:  # restarting, or unreachable for a moment
                reason = _first_line(e)
                if lost_since is None:
                    lost_since = time.monotonic()
                    log.warning("trial %s: the fuser registry is unreachable (%s)", self.trial_id, reason)
                if time.monotonic() - lost_since < REGISTRY_PATIENCE_S:
                    time.sleep(1.0)
                    continue
            raise FusionLost(
                f"trial {self.trial_id} cannot reach the study's fuser registry ({reason}): it lived "
                "on the driver's node; resume the study to train this trial in a new fused group"
            )


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


_last_member: tuple[str, Any] | None = None
"""The trial this process last joined a fuser for, and that fuser."""
