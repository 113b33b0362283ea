"""Horizontal fusion: up to K parity runs trained as one model, each still a plain `Trainer` outside.

`FusedTrainer` holds K slots. A run joins a free slot (from its config, or from a plain `Trainer`
checkpoint to continue it) and leaves it when the driver says (a scheduler stopped it) or after it
finished (completed, diverged); the others train on unharmed. One `FusedTrainer.step` is one
iteration of every running member: one batched forward and backward (`ponder.fused`), one
elementwise Adam over the stacked rows (`ponder.fused_adam.RowAdam`).

Each member is a plain `Trainer` built from its config (the member's *plain trainer*): its
initial weights, its data stream (its own generator, so member k sees exactly the batches a plain
run with its config sees), its evaluation sets, its counters and its metrics are that trainer's.
The fused trainer trains the member's row of the stacked weights and writes it back into the plain
trainer's model when the member is evaluated, checkpointed or leaves, so `metrics`, `state_dict`
and `leave` give exactly what the plain `Trainer` gives: its metrics dict, its checkpoint (which
`Trainer.from_state` continues exactly). The numbers equal a plain run's up to float rounding
(batched matmuls sum in another order).

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

from ponder.compiled import share_compile_cache, should_compile
from ponder.config import PonderConfig
from ponder.cpu import keep_freed_memory
from ponder.fused import ParamLayout, fusable_key, fusable_mismatch, fused_forward_loss, padded_log_prior
from ponder.fused_adam import RowAdam
from ponder.trainer import Metrics, StepResult, Trainer, resolve_device

__all__ = ["COMPILED_STEPS", "FusedTrainer"]

Key = tuple[tuple[str, object], ...]

COMPILED_STEPS = 4
"""A compiled group unrolls a multiple of this many steps (the rows past their own max_steps are
masked, so a few more cost arithmetic, not results)."""


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


@dataclass(frozen=True)
class _Plan:
    """The batched step's per-row inputs for one set of rows (rebuilt when the set changes)."""

    slots: tuple[int, ...]  # the slot of each row computed
    trained: tuple[bool, ...]  # whether the row's slot has a running member (else padding)
    mask: torch.Tensor  # `trained` as a tensor  # [R]
    index: torch.Tensor | None  # `slots` as a tensor, None when they are all K  # [R]
    n_steps: int  # N = max over the rows' max_steps
    active: tuple[int, ...] | None  # rows computed at each step (longest first), None: all  # [N]
    max_steps: torch.Tensor  # [R]
    log_prior: torch.Tensor  # [R, N]
    beta: torch.Tensor  # [R]
    max_norm: torch.Tensor  # the gradient clip, inf where off  # [R]


class FusedTrainer:
    """Up to ``capacity`` parity runs trained together as one stacked model on ``device``.

    ``compile``: run the batched forward and loss through ``torch.compile``; every slot is then
    computed at every iteration (free ones masked) to the longest max_steps, so the compiled graph
    keeps one shape. Eager, a member stops costing arithmetic after its own max_steps. None (the
    default): as the members' ``compile`` says (`ponder.compiled.should_compile`, decided when
    the first member joins; ``compile`` is one of `ponder.fused.FUSED_KEY_FIELDS`).
    ``unroll``: compiled, unroll at least this many steps from the start (the longest max_steps
    the members may have, where the caller knows it: one compile, not one per longer member).
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
        self.compiled = False
        """Whether the step runs compiled (with ``compile=None``, set when the first member joins)."""
        self._members: dict[int, _Member] = {}
        self._key: Key | None = None
        self._layout: ParamLayout | None = None
        self._weights: torch.Tensor | None = None  # row k: slot k's parameters  # [K, P]
        self._adam: RowAdam | None = None
        self._plan: _Plan | None = None
        self._forward_loss: Callable[..., tuple[torch.Tensor, ...]] = fused_forward_loss
        self._compiled_steps = 0  # the longest unroll compiled so far
        self._unroll = unroll
        if compile:
            self._use_compiled()
        self.last_results: dict[int, StepResult] = {}
        """What the last iteration did for each member it trained, by slot."""

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

    def join(self, config: PonderConfig, state: dict[str, Any] | None = None) -> int:
        """Add a run to a free slot and return the slot: a fresh run of ``config`` (the weights a
        plain `Trainer` of it starts from), or, with ``state`` (`Trainer.state_dict`'s dict), that
        run continued exactly. ValueError if the config cannot join this group (its task, a shape
        or the device differs: `ponder.fused.fusable_key`), no slot is free, or the run is over."""
        key = fusable_key(config)
        if self._members and self._key is not None:
            mismatch = fusable_mismatch(self._key, config)
            if mismatch is not None:
                raise ValueError(f"cannot join this fused group: {mismatch}")
        if resolve_device(config.device) != self.device:
            raise ValueError(f"device is {config.device!r} but this fused group's is {str(self.device)!r}")
        if not self.free_slots:
            raise ValueError(f"all {self.capacity} slots are taken")
        trainer = Trainer(config)
        if state is not None:
            trainer.load_state_dict(state)
        if trainer.outcome != "running":
            raise ValueError(f"the run is {trainer.outcome} already: nothing to train")
        slot = self.free_slots[0]
        if not self._members:
            self._key = key
            self._allocate(ParamLayout.of(trainer.model))
            if self._compile is None:  # the group's members say (a new group may say otherwise)
                self._use_compiled(should_compile(config.compile, self.device))
        assert self._weights is not None and self._layout is not None
        with torch.no_grad():
            self._weights[slot] = self._layout.read(trainer.model)
        self._members[slot] = _Member(slot, trainer, self._load_adam(slot, trainer))
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
        """The slot's member as a plain `Trainer`, synced now: its weights and Adam state are the
        fused ones (save it with `Trainer.save`). Do not train it while it is in the group: the
        group trains its own copy of the weights."""
        member = self._member(slot)
        self._write_back(member, with_adam=True)
        return member.trainer

    def set_iterations(self, slot: int, iterations: int) -> None:
        """Change the slot's run's budget (`Trainer.set_iterations`): a completed member trains on."""
        self._member(slot).trainer.set_iterations(iterations)

    # -- training --------------------------------------------------------------------------------
    def train_step(self) -> dict[int, StepResult]:
        """One iteration of every running member, as `Trainer.train_step` makes one for a plain
        run: a member whose loss or gradient norm is not finite skips its update and counts a NaN
        event; the others update as if it were not there. Returns each trained slot's result."""
        self.last_results = {}
        members = [self._members[s] for s in self.running]
        if not members:
            return {}
        start = time.perf_counter()
        plan = self._current_plan(members)
        weights, adam, layout = self._weights, self._adam, self._layout
        assert weights is not None and adam is not None and layout is not None
        x, y = self._batches(members, plan)  # [R, B, I], [R, B]
        weights.grad = None
        rows = weights if plan.index is None else weights.index_select(0, plan.index)  # [R, P]
        kl = members[0].trainer.config.kl_direction
        loss, rec, reg = self._forward_loss(
            layout, rows, x, y, plan.log_prior, plan.beta, plan.max_steps, plan.n_steps, kl, plan.active
        )  # [R] each
        # a member's non-finite loss is masked out before backward: its row gets no gradient that
        # counts, and the other rows' gradients never see it (each loss reads its own row only)
        loss_ok = torch.isfinite(loss) & plan.mask  # [R]
        torch.where(loss_ok, loss, torch.zeros_like(loss)).sum().backward()  # type: ignore[no-untyped-call]
        grad = weights.grad
        assert grad is not None
        grad_rows = grad if plan.index is None else grad.index_select(0, plan.index)  # [R, P]
        # per member, clip_grad_norm_: ||g_k|| over its row; g_k *= min(1, clip_k / (||g_k|| + 1e-6))
        norms = torch.linalg.vector_norm(grad_rows, dim=1)  # [R]
        norms = torch.where(loss_ok, norms, torch.full_like(norms, math.nan))
        grad_rows = grad_rows * (plan.max_norm / (norms + 1e-6)).clamp(max=1.0)[:, None]
        if plan.index is None:
            grad = grad_rows
        else:
            grad.index_copy_(0, plan.index, grad_rows)
        ok = loss_ok & torch.isfinite(norms)  # [R]
        values = torch.stack([loss.detach(), rec.detach(), reg.detach(), norms, ok.float()]).tolist()
        update, lrs = [False] * self.capacity, [0.0] * self.capacity
        results: dict[int, StepResult] = {}
        for i, slot in enumerate(plan.slots):
            if not plan.trained[i]:
                continue
            l_, rec_, reg_, norm_, ok_ = (v[i] for v in values)
            results[slot] = StepResult(l_, rec_, reg_, norm_, bool(ok_))
            update[slot], lrs[slot] = bool(ok_), self._members[slot].lr
        adam.step(weights.data, grad, update, lrs)
        share = (time.perf_counter() - start) / len(results)  # each member's part of the wall time
        for slot, result in results.items():
            _record(self._members[slot].trainer, result, share)
        self.last_results = results
        return results

    def step(self) -> dict[int, Metrics]:
        """One iteration of every running member with `Trainer.run`'s bookkeeping: a member past
        its NaN limit ends ``diverged``, one at its budget ``completed``; returns, by slot, the
        metrics that fell due (every ``eval_interval`` of the member's iterations and at its end,
        exactly when `Trainer.run` yields them). A finished member stops training, keeping its slot."""
        due: dict[int, Metrics] = {}
        for slot in self.running:  # at its budget already (joined at its end): completed, untrained
            trainer = self._members[slot].trainer
            if trainer.iteration >= trainer.config.iterations:
                trainer.outcome = "completed"
                due[slot] = self.metrics(slot)
        for slot in self.train_step():
            trainer = self._members[slot].trainer
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

    def _use_compiled(self, compiled: bool = True) -> None:
        """Run the step through ``torch.compile`` from now on (or eagerly: ``compiled=False``)."""
        if compiled == self.compiled:
            return
        self._forward_loss = fused_forward_loss
        if compiled:
            share_compile_cache()  # the machine's Inductor cache, as `Trainer` compiles with
            # static shapes: K rows always (free slots padded), N changes only upwards
            self._forward_loss = torch.compile(fused_forward_loss, dynamic=False)
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

    def _load_adam(self, slot: int, trainer: Trainer) -> float:
        """Put the trainer's Adam state (a checkpoint's, or none) into the slot's Adam row and return
        its learning rate (the one its torch Adam would use: a checkpoint's own, as on load)."""
        assert self._adam is not None
        optimizer = trainer.optimizer  # a torch Adam with the checkpoint's state loaded, if any
        group = optimizer.param_groups[0]
        if tuple(group["betas"]) != self._adam.betas or group["eps"] != self._adam.eps:
            raise ValueError(f"Adam betas {group['betas']} and eps {group['eps']} are not the defaults")
        states = [optimizer.state.get(p) for p in trainer.model.parameters()]
        if all(states):
            m = torch.cat([s["exp_avg"].reshape(-1) for s in states])  # type: ignore[index]
            v = torch.cat([s["exp_avg_sq"].reshape(-1) for s in states])  # type: ignore[index]
            self._adam.reset(slot, m, v, int(states[0]["step"]))  # type: ignore[index]
        else:  # no update made yet
            self._adam.reset(slot)
        return float(group["lr"])

    def _write_back(self, member: _Member, with_adam: bool) -> None:
        """Copy the member's row into its plain trainer's model (and, ``with_adam``, its Adam state
        into the trainer's torch Adam, the state ``torch.optim.Adam(fused=True)`` would hold)."""
        assert self._layout is not None and self._weights is not None and self._adam is not None
        trainer, slot = member.trainer, member.slot
        self._layout.write(self._weights[slot].detach(), trainer.model)
        if not with_adam:
            return
        optimizer = trainer.optimizer
        optimizer.state.clear()
        step = self._adam.steps[slot]
        if step == 0:  # no update made yet: torch's Adam has no state either
            return
        sizes = self._layout.sizes
        moments = zip(
            torch.split(self._adam.exp_avg[slot], sizes),
            torch.split(self._adam.exp_avg_sq[slot], sizes),
            strict=True,
        )
        for p, (m, v) in zip(trainer.model.parameters(), moments, strict=True):
            optimizer.state[p] = {
                "step": torch.tensor(float(step), dtype=torch.float32, device=self.device),
                "exp_avg": m.view(p.shape).clone(),
                "exp_avg_sq": v.view(p.shape).clone(),
            }

    def _current_plan(self, members: list[_Member]) -> _Plan:
        """The plan for these members' rows (cached while the set of running slots is the same)."""
        running = tuple(m.slot for m in members)
        # compiled: every slot, the others as padding rows, so the compiled graph keeps one shape;
        # eager: the running rows, longest max_steps first, so each step computes a prefix of rows
        # (`ponder.fused.fused_gru_unroll`'s ``active``): a short member stops costing at its N_k
        by_steps = sorted(running, key=lambda s: (-self._members[s].trainer.config.max_steps, s))
        slots = tuple(range(self.capacity)) if self.compiled else tuple(by_steps)
        if (
            self._plan is not None
            and self._plan.slots == slots
            and self._plan.trained == tuple(s in running for s in slots)
        ):
            return self._plan
        trained = tuple(s in running for s in slots)
        configs = [
            self._members[s].trainer.config if t else None for s, t in zip(slots, trained, strict=True)
        ]
        n_steps = max(c.max_steps for c in configs if c is not None)
        if self.compiled:  # N only grows: each new N is a compile, a shorter one would be another;
            # and in steps of COMPILED_STEPS, so that a study's max_steps of 4-20 compile at most 5
            # times, within torch.compile's 8 shapes a process (past them it runs eagerly, silently)
            n_steps = -(-max(n_steps, self._unroll) // COMPILED_STEPS) * COMPILED_STEPS
            n_steps = self._compiled_steps = max(n_steps, self._compiled_steps)
        dev = self.device
        priors = [
            padded_log_prior(self._members[s].trainer.log_prior, n_steps)
            if t
            else torch.zeros(n_steps, device=dev)
            for s, t in zip(slots, trained, strict=True)
        ]
        index = None if slots == tuple(range(self.capacity)) else torch.tensor(slots, device=dev)
        own_steps = [c.max_steps for c in configs if c is not None]  # non-increasing when eager
        active = None if self.compiled else tuple(sum(m > n for m in own_steps) for n in range(n_steps))
        self._plan = _Plan(
            slots=slots,
            trained=trained,
            mask=torch.tensor(trained, device=dev),
            index=index,
            n_steps=n_steps,
            active=active,
            max_steps=torch.tensor([c.max_steps if c else 1 for c in configs], device=dev),
            log_prior=torch.stack(priors),
            beta=torch.tensor([c.beta if c else 0.0 for c in configs], device=dev),
            max_norm=torch.tensor(
                [c.grad_clip if c and c.grad_clip > 0 else math.inf for c in configs], device=dev
            ),
        )
        return self._plan

    def _batches(self, members: list[_Member], plan: _Plan) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's training batch from its member's own generator (zeros for padding rows)."""
        batches = {m.slot: m.trainer.sample_batch(m.trainer.generator) for m in members}
        x0, y0 = next(iter(batches.values()))
        pad = (torch.zeros_like(x0), torch.zeros_like(y0))
        rows = [batches.get(s, pad) for s in plan.slots]
        return torch.stack([x for x, _ in rows]), torch.stack([y for _, y in rows])


def _record(trainer: Trainer, result: StepResult, seconds: float) -> None:
    """Count one iteration made for ``trainer`` by the fused step, as `Trainer.train_step` counts its
    own: the averages' sums when it was finite, a NaN event when not, the iteration and the time."""
    if result.finite:
        sums = trainer._sums
        sums["loss"] += result.loss
        sums["loss_rec"] += result.loss_rec
        sums["loss_reg"] += result.loss_reg
        sums["grad_norm"] += result.grad_norm
        trainer._finite_steps += 1
    else:
        trainer.nan_events += 1
    trainer.iteration += 1
    trainer.train_time_s += seconds
