"""A fused group's per-row inputs for one set of running members (`Plan`): which slots are
computed and in which order, to how many steps, and each row's prior, beta, clip, NaN limit, task
data and counter stream. `ponder.fused.trainer.FusedTrainer` builds one when its set of running
members changes (`build_plan`) and reuses it until then.

Which rows a plan computes:

- compiled, every slot (the free ones as padding rows), so the compiled graph keeps one shape,
  unrolled to a multiple of `COMPILED_STEPS` that never shrinks (`unrolled_steps`);
- eager, the running rows only; for a fused step that honours ``active``
  (`ponder.fused.step.FusedStep.ordered`), longest max_steps first, so that step n computes a
  prefix of the rows and a short member stops costing arithmetic at its own N_k.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ponder.fused.halting import padded_log_prior
from ponder.fused.step import FusedStep
from ponder.trainer import Trainer

__all__ = ["COMPILED_STEPS", "Plan", "build_plan", "unrolled_steps"]

COMPILED_STEPS = 4
"""A compiled group unrolls a multiple of this many steps (the rows past their own max_steps are
masked, so a few more cost arithmetic, not results)."""


@dataclass(frozen=True)
class Plan:
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
    max_nan: torch.Tensor  # NaN events a member may have before it diverges  # [R]
    data: tuple[torch.Tensor, ...]  # the task's per-row inputs (`FusedStep.row_data`)
    base: torch.Tensor  # its counter stream's `stream_base` (counter groups)  # [R, W]
    k0: torch.Tensor  # its counter stream's seed key  # [R]


def unrolled_steps(longest: int, compiled: bool, unroll: int, compiled_before: int) -> int:
    """N, the steps a plan unrolls for rows whose longest max_steps is ``longest``: that, eager;
    compiled, at least ``unroll`` and ``compiled_before`` (N only grows: each new N is a compile, a
    shorter one would be another), in steps of `COMPILED_STEPS`, so that a study's max_steps of
    4-20 compile at most 5 times, within torch.compile's 8 shapes a process (past them it runs
    eagerly, silently)."""
    if not compiled:
        return longest
    return max(-(-max(longest, unroll) // COMPILED_STEPS) * COMPILED_STEPS, compiled_before)


def build_plan(
    step: type[FusedStep],
    slots: tuple[int, ...],
    trainers: Sequence[Trainer | None],
    n_steps: int,
    ordered: bool,
    stream_rows: Callable[[int], torch.Tensor] | None,
    k0: torch.Tensor,
    capacity: int,
    device: torch.device,
) -> Plan:
    """The plan computing ``slots`` (each row's plain trainer in ``trainers``, None for a padding
    row) to ``n_steps``; ``ordered``: the rows are longest max_steps first, and each step computes
    the rows still inside their own. ``stream_rows(width)``: every slot's counter-stream base
    ``[K, >= width]`` (None: a group of generator streams); ``k0`` ``[K]``: every slot's seed key."""
    configs = [t.config if t is not None else None for t in trainers]
    priors = [
        padded_log_prior(t.log_prior, n_steps) if t is not None else torch.zeros(n_steps, device=device)
        for t in trainers
    ]
    index = None if slots == tuple(range(capacity)) else torch.tensor(slots, device=device)
    own_steps = [c.max_steps for c in configs if c is not None]  # non-increasing when ordered
    active = tuple(sum(m > n for m in own_steps) for n in range(n_steps)) if ordered else None
    base = torch.zeros(capacity, 0, dtype=torch.int64)
    if stream_rows is not None:  # the words every row reads at N steps
        width = max(step.stream_width(c, n_steps) for c in configs if c is not None)
        base = stream_rows(width)[:, :width]
    trained = tuple(t is not None for t in trainers)
    return Plan(
        slots=slots,
        trained=trained,
        mask=torch.tensor(trained, device=device),
        index=index,
        n_steps=n_steps,
        active=active,
        max_steps=torch.tensor([c.max_steps if c else 1 for c in configs], device=device),
        log_prior=torch.stack(priors),
        beta=torch.tensor([c.beta if c else 0.0 for c in configs], device=device),
        max_norm=torch.tensor(
            [c.grad_clip if c and c.grad_clip > 0 else math.inf for c in configs], device=device
        ),
        max_nan=torch.tensor([c.max_nan_events if c else 0 for c in configs], device=device),
        data=step.row_data(trainers, device),
        base=base if index is None else base.index_select(0, index.to(base.device)),
        k0=k0 if index is None else k0.index_select(0, index),
    )
