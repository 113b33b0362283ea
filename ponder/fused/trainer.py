"""Horizontal fusion: up to K runs trained as one model, each still a plain `Trainer` outside.

`FusedTrainer` holds K slots. A run joins a free slot (from its config, or from a plain `Trainer`
checkpoint to continue it) and leaves it when the driver says (a scheduler stopped it) or after it
finished (completed, diverged); the others train on unharmed. One `FusedTrainer.step` is one
iteration of every running member: one batched forward and backward (the task's fused step,
`ponder.fused.step.FusedStep`: parity's in `ponder.fused.parity`, MNIST's in `ponder.fused.mnist`),
one elementwise Adam over the stacked rows (`ponder.fused.adam.RowAdam`).

Each member is a plain `Trainer` built from its config (the member's *plain trainer*): its
initial weights, its data stream (its own generator, so member k sees exactly the batches a plain
run with its config sees), its evaluation sets, its counters and its metrics are that trainer's.
The fused trainer trains the member's row of the stacked weights and writes it back into the plain
trainer's model when the member is evaluated, checkpointed or leaves, so `metrics`, `state_dict`
and `leave` give exactly what the plain `Trainer` gives: its metrics dict, its checkpoint (which
`Trainer.from_state` continues exactly). The numbers equal a plain run's up to float rounding
(batched matmuls sum in another order).

Between reports an iteration reads nothing back to the host: each member's batch comes from its
counter stream (`ponder.streams`: the one its plain trainer draws from), all K drawn by one set of
ops; its loss sums, NaN events and iteration count accumulate on the device; a member whose loss
is not finite is masked out of the update there, and one past its NaN limit stops updating there.
The host reads the counters when a report falls due (for every member at once, so a member that
diverged meanwhile reports then, at the iteration it diverged, with the weights it had), so the
host queues iteration after iteration while the device computes.

What differs from a plain run: a member's ``time_s`` is its share of the fused iterations' wall
time (each iteration's time divided among the members it trained). The group compiles its step
as its members' ``compile`` says on its device (`ponder.compiled.should_compile`: ``auto`` is
compiled on CUDA, eager on a CPU), unless `FusedTrainer`'s ``compile`` decides.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ponder.compiled import compile_mode, share_compile_cache, should_compile, uses_cuda_graphs
from ponder.config import PonderConfig
from ponder.cpu import keep_freed_memory
from ponder.fused.adam import RowAdam
from ponder.fused.key import Key, fusable_key, fusable_mismatch, fused_step
from ponder.fused.layout import ParamLayout
from ponder.fused.loss import Losses
from ponder.fused.plan import COMPILED_STEPS, Plan, build_plan, unrolled_steps
from ponder.fused.step import FusedStep, fused_forward_loss
from ponder.streams import seed_keys, stream_base
from ponder.tasks import task_of
from ponder.trainer import Metrics, StepResult, Trainer, resolve_device

__all__ = ["COMPILED_STEPS", "FusedTrainer"]

LossFn = Callable[..., Losses]
"""A fused step's loss, eager or compiled: (L, L_rec, L_reg), each ``[R]``."""


@dataclass
class _Member:
    """A slot's run: its plain trainer and the per-member values the batched step reads."""

    slot: int
    trainer: Trainer
    lr: float
    held: bool = False
    """Kept out of the iterations until released (`FusedTrainer.hold`)."""

    @property
    def running(self) -> bool:
        return self.trainer.outcome == "running" and not self.held


class FusedTrainer:
    """Up to ``capacity`` runs of one task trained together as one stacked model on ``device``.

    ``compile``: run the batched data draw, forward and loss through ``torch.compile`` (on CUDA
    captured in CUDA graphs, as a plain compiled step is: `ponder.compiled.compile_mode`); every
    slot is then computed at every iteration (free ones masked) to the longest max_steps, so the
    compiled graph keeps one shape. Eager, a member stops costing arithmetic after its own
    max_steps. None (the default): as the members' ``compile`` says
    (`ponder.compiled.should_compile`, decided when the first member joins; ``compile`` is one of
    `ponder.fused.key.SHARED_FIELDS`). ``unroll``: compiled, unroll at least this many steps from
    the start (the longest max_steps the members may have, where the caller knows it: one compile,
    not one per longer member).
    """

    def __init__(
        self, capacity: int, device: str | torch.device = "auto", compile: bool | None = None, unroll: int = 0
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        keep_freed_memory()  # as `Trainer`: no page faults for the same tensors every iteration
        self.capacity = capacity
        self.device = resolve_device(device) if isinstance(device, str) else device
        self._compile = compile
        self.compiled = bool(compile)
        """Whether the step runs compiled (with ``compile=None``, set when the first member joins;
        the step is compiled when the first member's task is known)."""
        self._graphs = False  # compiled on CUDA: the step replays CUDA graphs
        self._members: dict[int, _Member] = {}
        self._key: Key | None = None
        self._layout: ParamLayout | None = None
        self._weights: torch.Tensor | None = None  # row k: slot k's parameters  # [K, P]
        self._adam: RowAdam | None = None
        self._plan: Plan | None = None
        self._step: FusedStep | None = None  # the group's fused step, its first member's task's
        self._counter = True  # the group draws from counter streams (else a generator per member)
        self._forward_loss: LossFn = fused_forward_loss  # a generator-stream group's
        self._stream_loss: LossFn | None = None  # a counter-stream group's: its fused step's
        self._compiled_steps = 0  # the longest unroll compiled so far
        self._unroll = unroll
        # what an iteration counts per slot, on the device, read when a report falls due
        dev = self.device
        self._iterations = torch.zeros(capacity, dtype=torch.int64, device=dev)  # the member's  # [K]
        self._nan_events = torch.zeros(capacity, dtype=torch.int64, device=dev)  # the member's  # [K]
        self._finite = torch.zeros(capacity, dtype=torch.int64, device=dev)  # since its last report  # [K]
        # since its last report: loss, loss_rec, loss_reg, grad_norm  # [K, 4]
        self._sums = torch.zeros(capacity, 4, dtype=torch.float64, device=dev)
        self._lrs = torch.zeros(capacity, dtype=torch.float64, device=dev)  # [K]
        self._k0 = torch.zeros(capacity, dtype=torch.int64, device=dev)  # [K]
        self._base: torch.Tensor | None = None  # the counter streams' bases, grown as needed  # [K, W]
        self._shared: tuple[torch.Tensor, ...] = ()  # what every member's batches read, held once
        self._last: tuple[tuple[int, ...], torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    # -- slots ----------------------------------------------------------------------------------
    @property
    def slots(self) -> list[int]:
        """The occupied slots, running or finished (a finished member keeps its slot until `leave`)."""
        return sorted(self._members)

    @property
    def running(self) -> list[int]:
        """The slots whose members train at the next iteration: not finished, not held."""
        return [s for s in self.slots if self._members[s].running]

    def hold(self, slot: int) -> None:
        """Keep the slot's member out of the iterations, its state as it is, until `release`: a
        driver that has not asked for its next report yet (a scheduler may stop it) holds it."""
        self._member(slot).held = True

    def release(self, slot: int) -> None:
        """Let a held member train again from where it was held."""
        self._member(slot).held = False

    @property
    def unrolled_steps(self) -> int:
        """N, the steps the next iteration unrolls (0 with no member running): eager, the longest
        running member's max_steps; compiled, at least ``unroll``, in steps of `COMPILED_STEPS`."""
        members = [self._members[s] for s in self.running]
        return self._current_plan(members).n_steps if members else 0

    @property
    def free_slots(self) -> list[int]:
        """The slots a run can join."""
        return [s for s in range(self.capacity) if s not in self._members]

    def join(
        self, config: PonderConfig, state: dict[str, Any] | None = None, data: object | None = None
    ) -> int:
        """Add a run to a free slot and return the slot: a fresh run of ``config`` (the weights a
        plain `Trainer` of it starts from), or, with ``state`` (`Trainer.state_dict`'s dict), that
        run continued exactly; ``data``: the task's own data, as `Trainer` takes it (MNIST's
        `MnistData`; None, the task's default). ValueError if the config cannot join this group
        (its task, a shape, the data stream or the device differs: `ponder.fused.key.fusable_key`;
        or it reads other training images), no slot is free, or the run is over; for the first
        member, also if the task's fused step does not read every parameter and layer of its plain
        model (`ponder.fused.step.FusedStep.of`, naming the first it does not)."""
        key = fusable_key(config)
        if self._members and self._key is not None:
            mismatch = fusable_mismatch(self._key, config)
            if mismatch is not None:
                raise ValueError(f"cannot join this fused group: {mismatch}")
        if resolve_device(config.device) != self.device:
            raise ValueError(f"device is {config.device!r} but this fused group's is {str(self.device)!r}")
        if not self.free_slots:
            raise ValueError(f"all {self.capacity} slots are taken")
        trainer = Trainer(config, data)
        if state is not None:
            trainer.load_state_dict(state)
        if trainer.outcome != "running":
            raise ValueError(f"the run is {trainer.outcome} already: nothing to train")
        step_class = fused_step(task_of(config))
        shared = step_class.shared(trainer)
        if self._members:
            if any(a is not b for a, b in zip(shared, self._shared, strict=True)):
                raise ValueError("cannot join this fused group: its training images are not the group's")
            if ParamLayout.of(trainer.model) != self._layout:
                raise ValueError("cannot join this fused group: its model's parameters are not the group's")
        else:  # a new group: its fused step, key, shapes, data and stream are this member's
            step = step_class.of(trainer.model)  # ValueError naming a plain layer it does not read
            self._key, self._shared = key, shared
            self._base = None
            self._allocate(step.layout)
            self._counter = config.data_stream == "counter"
            if self._step is None or type(step) is not type(self._step):  # another task's step
                self._step = step
                self._use_compiled(self.compiled, again=True)  # the task's step, compiled as it was
            elif step != self._step:  # the same task's, read from another plain model
                self._step = step
            if self._compile is None:  # the group's members say (a new group may say otherwise)
                self._use_compiled(should_compile(config.compile, self.device))
        slot = self.free_slots[0]
        assert self._weights is not None and self._layout is not None and self._adam is not None
        with torch.no_grad():
            self._weights[slot] = self._layout.read(trainer.model)
        # its torch Adam holds a checkpoint's state, if any; its learning rate is the Adam's own
        self._lrs[slot] = self._adam.load(slot, trainer.optimizer, list(trainer.model.parameters()))
        self._iterations[slot] = trainer.iteration
        self._nan_events[slot] = trainer.nan_events
        self._finite[slot] = 0
        self._sums[slot] = 0.0
        if self._counter:
            key0 = seed_keys(config.seed)
            self._k0[slot] = key0
            if self._base is not None:  # its words' iteration-free half, as wide as the group's
                self._base[slot] = stream_base(key0, self._base.shape[1], self.device)[0]
        self._members[slot] = _Member(slot, trainer, trainer.config.lr)
        self._plan = None
        return slot

    def leave(self, slot: int) -> Trainer:
        """Remove the slot's member; return its plain `Trainer`, synced (weights, Adam, counters:
        it can be saved, or trained on alone). The slot is cleared for the next run."""
        trainer = self.trainer(slot)
        del self._members[slot]
        assert self._weights is not None and self._adam is not None
        with torch.no_grad():
            self._weights[slot] = 0.0  # a free row computes zeros, never a left run's NaN
        self._adam.reset(slot)
        self._plan = None
        return trainer

    def trainer(self, slot: int) -> Trainer:
        """The slot's member as a plain `Trainer`, synced now: its weights, Adam state and counters
        are the fused ones (save it with `Trainer.save`). Do not train it while it is in the group:
        the group trains its own copy of the weights."""
        member = self._member(slot)
        self._settle([slot], sums=True)
        self._write_back(member, with_adam=True)
        return member.trainer

    def set_iterations(self, slot: int, iterations: int) -> None:
        """Change the slot's run's budget (`Trainer.set_iterations`): a completed member trains on."""
        self._member(slot).trainer.set_iterations(iterations)

    # -- training --------------------------------------------------------------------------------
    def train_step(self) -> list[int]:
        """One iteration of every running member, as `Trainer.train_step` makes one for a plain
        run: a member whose loss or gradient norm is not finite skips its update and counts a NaN
        event; one past its NaN limit makes no more updates; the others update as if it were not
        there. Returns the slots trained; reads nothing back from the device (`last_results`
        does, when asked)."""
        members = [self._members[s] for s in self.running]
        if not members:
            self._last = None
            return []
        start = time.perf_counter()
        plan = self._current_plan(members)
        weights, adam, step = self._weights, self._adam, self._step
        assert weights is not None and adam is not None and step is not None
        index = plan.index

        def rows(t: torch.Tensor) -> torch.Tensor:  # the plan's rows of a [K, ...] tensor  # [R, ...]
            return t if index is None else t.index_select(0, index)

        if self._graphs:
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]  # a new iteration
        iterations = rows(self._iterations)  # [R]
        live = plan.mask & (rows(self._nan_events) <= plan.max_nan)  # not padding, not diverged  # [R]
        weights.grad = None
        flat = rows(weights)  # [R, P]
        kl = members[0].trainer.config.kl_direction
        losses = (plan.log_prior, plan.beta, plan.max_steps, plan.n_steps, kl, plan.active)
        if self._counter:  # counter streams: every row's batch drawn inside the step
            batch_size = members[0].trainer.config.batch_size
            stream = (plan.base, plan.k0, iterations, *plan.data, batch_size)
            assert self._stream_loss is not None
            loss, rec, reg = self._stream_loss(step, flat, *stream, *losses)  # [R] each
        else:  # generator streams (parity): a draw per member, as their plain runs made
            x, y = self._batches(members, plan)  # [R, B, I], [R, B]
            loss, rec, reg = self._forward_loss(step, flat, x, y, None, *losses)  # [R] each
        # a member's non-finite loss is masked out before backward: its row gets no gradient that
        # counts, and the other rows' gradients never see it (each loss reads its own row only)
        loss_ok = torch.isfinite(loss) & live  # [R]
        torch.where(loss_ok, loss, torch.zeros_like(loss)).sum().backward()  # type: ignore[no-untyped-call]
        grad = weights.grad
        assert grad is not None
        grad_rows = rows(grad)  # [R, P]
        # per member, clip_grad_norm_: ||g_k|| over its row; g_k *= min(1, clip_k / (||g_k|| + 1e-6))
        norms = torch.linalg.vector_norm(grad_rows, dim=1)  # [R]
        norms = torch.where(loss_ok, norms, torch.full_like(norms, math.nan))
        grad_rows = grad_rows * (plan.max_norm / (norms + 1e-6)).clamp(max=1.0)[:, None]
        ok = loss_ok & torch.isfinite(norms)  # updates this iteration  # [R]
        values = torch.stack([loss.detach(), rec.detach(), reg.detach(), norms], dim=1)  # [R, 4]
        # what `Trainer.train_step` counts: the sums of finite iterations, NaN events, iterations
        sums = torch.where(ok[:, None], values.double(), torch.zeros_like(values, dtype=torch.float64))
        if index is None:
            grad, update = grad_rows, ok
            self._sums += sums
            self._finite += ok
            self._nan_events += live & ~ok
            self._iterations += live
        else:
            grad.index_copy_(0, index, grad_rows)
            update = torch.zeros(self.capacity, dtype=torch.bool, device=self.device)
            update.index_copy_(0, index, ok)
            self._sums.index_add_(0, index, sums)
            self._finite.index_add_(0, index, ok.long())
            self._nan_events.index_add_(0, index, (live & ~ok).long())
            self._iterations.index_add_(0, index, live.long())
        adam.step(weights.data, grad, update, self._lrs)
        self._last = (plan.slots, live, values, ok)
        share = (time.perf_counter() - start) / len(members)  # each member's part of the wall time
        for member in members:  # the host's count; `_settle` puts a diverged member's right
            member.trainer.iteration += 1
            member.trainer.train_time_s += share
        return [m.slot for m in members]

    @property
    def last_results(self) -> dict[int, StepResult]:
        """What the last iteration did for each member it trained (not one past its NaN limit), by
        slot; reads the device."""
        if self._last is None:
            return {}
        slots, trained, values, ok = self._last
        rows, flags, done = values.tolist(), ok.tolist(), trained.tolist()
        results = {}
        for i, slot in enumerate(slots):
            if done[i]:
                loss, rec, reg, norm = rows[i]
                results[slot] = StepResult(loss, rec, reg, norm, bool(flags[i]))
        return results

    def step(self) -> dict[int, Metrics]:
        """One iteration of every running member with `Trainer.run`'s bookkeeping: a member past
        its NaN limit ends ``diverged``, one at its budget ``completed``; returns, by slot, the
        metrics that fell due (every ``eval_interval`` of the member's iterations and at its end,
        exactly when `Trainer.run` yields them). A finished member stops training, keeping its slot.

        The device's counters are read only when some member's report may fall due (its interval
        or its budget); a member that passed its NaN limit meanwhile made no update since, and
        reports then as ``diverged`` at the iteration it diverged, as its plain run does."""
        due: dict[int, Metrics] = {}
        for slot in self.running:  # at its budget already (joined at its end): completed, untrained
            trainer = self._members[slot].trainer
            if trainer.iteration >= trainer.config.iterations:
                trainer.outcome = "completed"
                due[slot] = self.metrics(slot)
        trained = self.train_step()
        if not any(_report_may_fall_due(self._members[s].trainer) for s in trained):
            return due
        start = time.perf_counter()
        self._settle(self.slots)  # one read: every member's iteration and NaN count
        waited = (time.perf_counter() - start) / len(trained)  # the device's queue caught up: their time
        for slot in trained:
            trainer = self._members[slot].trainer
            trainer.train_time_s += waited
            cfg = trainer.config
            if trainer.nan_events > cfg.max_nan_events:
                trainer.outcome = "diverged"
            elif trainer.iteration == cfg.iterations:
                trainer.outcome = "completed"
            if trainer.outcome != "running" or trainer.iteration % cfg.eval_interval == 0:
                due[slot] = self.metrics(slot)
        return due

    def run_until_event(self, max_iterations: int | None = None) -> dict[int, Metrics]:
        """`step` until some member's metrics fall due (returned by slot), no member is running,
        or ``max_iterations`` iterations were made (None: no limit)."""
        made = 0
        while self.running and (max_iterations is None or made < max_iterations):
            due = self.step()
            made += 1
            if due:
                return due
        return {}

    # -- what a plain trainer reports ------------------------------------------------------------
    def metrics(self, slot: int) -> Metrics:
        """The slot's `Trainer.metrics`: training averages since its last metrics, its counters,
        and `Trainer.evaluate` on its evaluation sets (the plain code, on the member's weights)."""
        member = self._member(slot)
        self._settle([slot], sums=True)
        self._write_back(member, with_adam=False)
        return member.trainer.metrics()

    def evaluate(self, slot: int) -> Metrics:
        """The slot's `Trainer.evaluate`, on the member's current weights."""
        member = self._member(slot)
        self._write_back(member, with_adam=False)
        return member.trainer.evaluate()

    def state_dict(self, slot: int) -> dict[str, Any]:
        """The slot's run as a plain `Trainer` checkpoint (`Trainer.state_dict`): `Trainer.from_state`
        continues it exactly, and so does `join` with it."""
        return self.trainer(slot).state_dict()

    # -- internals -------------------------------------------------------------------------------
    def _member(self, slot: int) -> _Member:
        member = self._members.get(slot)
        if member is None:
            raise KeyError(f"slot {slot} is free")
        return member

    def _settle(self, slots: list[int], sums: bool = False) -> None:
        """Read the device's counters of ``slots`` into their plain trainers (one read): each
        member's iteration and NaN events, and with ``sums`` its training sums since its last
        report, which move to the trainer (the device's are zeroed)."""
        if not slots:
            return
        index = torch.tensor(slots, device=self.device)
        counters = torch.stack([self._iterations, self._nan_events, self._finite], dim=1).double()  # [K, 3]
        read = torch.cat([counters, self._sums], dim=1).index_select(0, index).tolist()  # [S, 7]
        for slot, (iterations, nan_events, finite, *totals) in zip(slots, read, strict=True):
            trainer = self._members[slot].trainer
            trainer.iteration, trainer.nan_events = int(iterations), int(nan_events)
            if sums:
                for name, total in zip(("loss", "loss_rec", "loss_reg", "grad_norm"), totals, strict=True):
                    trainer._sums[name] += total
                trainer._finite_steps += int(finite)
        if sums:
            self._finite.index_fill_(0, index, 0)
            self._sums.index_fill_(0, index, 0.0)

    def _use_compiled(self, compiled: bool = True, again: bool = False) -> None:
        """Run the group's fused step (`ponder.fused.step.FusedStep.stream_loss`, or
        `ponder.fused.step.fused_forward_loss` for generator streams) through ``torch.compile`` from
        now on (or eagerly: ``compiled=False``); ``again``: make it anew even if ``compiled`` is as
        it was (the task changed)."""
        if compiled == self.compiled and not again:
            return
        assert self._step is not None
        stream_loss = type(self._step).stream_loss
        self._forward_loss, self._stream_loss = fused_forward_loss, stream_loss
        self._graphs = compiled and uses_cuda_graphs(self.device)
        if compiled:
            share_compile_cache()  # the machine's Inductor cache, as `Trainer` compiles with
            # static shapes: K rows always (free slots padded), N changes only upwards
            mode = compile_mode(self.device)
            # each compiles when first called: a group runs one of them, as its stream says
            self._forward_loss = torch.compile(fused_forward_loss, dynamic=False, mode=mode)
            self._stream_loss = torch.compile(stream_loss, dynamic=False, mode=mode)
        self.compiled = compiled
        self._compiled_steps = 0
        self._plan = None

    def _allocate(self, layout: ParamLayout) -> None:
        """The stacked weights and Adam for this group's shapes (kept while its shapes are the same)."""
        if self._layout == layout:
            return
        self._layout = layout
        self._weights = torch.zeros(self.capacity, layout.size, device=self.device, requires_grad=True)
        self._adam = RowAdam(self.capacity, layout.size, self.device)

    def _write_back(self, member: _Member, with_adam: bool) -> None:
        """Copy the member's row into its plain trainer's model (and, ``with_adam``, its Adam state
        into the trainer's torch Adam: `ponder.fused.adam.RowAdam.store`)."""
        assert self._layout is not None and self._weights is not None and self._adam is not None
        trainer, slot = member.trainer, member.slot
        self._layout.write(self._weights[slot].detach(), trainer.model)
        if with_adam:
            self._adam.store(slot, trainer.optimizer, list(trainer.model.parameters()))

    def _current_plan(self, members: list[_Member]) -> Plan:
        """The plan for these members' rows (`ponder.fused.plan`), cached while the set of running
        slots is the same."""
        assert self._step is not None
        running = tuple(m.slot for m in members)
        ordered = self._step.ordered and not self.compiled
        by_steps = sorted(running, key=lambda s: (-self._members[s].trainer.config.max_steps, s))
        slots = tuple(range(self.capacity)) if self.compiled else tuple(by_steps if ordered else running)
        trained = tuple(s in running for s in slots)
        if self._plan is not None and self._plan.slots == slots and self._plan.trained == trained:
            return self._plan
        trainers = [self._members[s].trainer if t else None for s, t in zip(slots, trained, strict=True)]
        longest = max(t.config.max_steps for t in trainers if t is not None)
        n_steps = unrolled_steps(longest, self.compiled, self._unroll, self._compiled_steps)
        if self.compiled:
            self._compiled_steps = n_steps
        rows = self._stream_rows if self._counter else None
        step, k0 = type(self._step), self._k0
        self._plan = build_plan(step, slots, trainers, n_steps, ordered, rows, k0, self.capacity, self.device)
        return self._plan

    def _stream_rows(self, width: int) -> torch.Tensor:
        """Every slot's `ponder.streams.stream_base` ``[K, >= width]``, made anew from the slots' seed
        keys when a plan needs more words than it has (MNIST's grow with the group's N)."""
        if self._base is None or self._base.shape[1] < width:
            self._base = stream_base(self._k0, width)
        return self._base

    def _batches(self, members: list[_Member], plan: Plan) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's training batch from its member's own generator (zeros for padding rows): the
        generator stream of runs made before counter streams, one draw per member."""
        batches = {m.slot: m.trainer.sample_batch(m.trainer.generator) for m in members}
        x0, y0 = next(iter(batches.values()))
        pad = (torch.zeros_like(x0), torch.zeros_like(y0))
        rows = [batches.get(s, pad) for s in plan.slots]
        return torch.stack([x for x, _ in rows]), torch.stack([y for _, y in rows])


def _report_may_fall_due(trainer: Trainer) -> bool:
    """Whether ``trainer``'s report may fall due now, by the host's count of its iterations (its
    interval, or its budget); a member that diverged on the device meanwhile reports then too."""
    cfg = trainer.config
    return trainer.iteration % cfg.eval_interval == 0 or trainer.iteration >= cfg.iterations
