"""``ponder-study check``: what running a spec would do, said before anything starts.

The spec is validated as ``run`` validates it (a bad one is the same one-line `SpecError`), then
the figures a study's cost hangs on are worked out from the spec alone: the search space, the
trial count, the budget in trial-iterations (and the least ASHA could cut it to), resources per
trial, trials at once on this machine, and where the results go. A wall-time estimate times a few
real training iterations of the spec's task (ponder's `Trainer`, torch) on this machine; Ray is
never imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ponder.config import compiles_on
from study.spec.spec import Dimension, StudySpec, load_spec
from study.storage.commands import command_name
from study.storage.storage import StudyPaths, has_scheme

__all__ = [
    "Check",
    "Estimate",
    "asha_milestones",
    "check",
    "check_spec",
    "fusion_note",
    "group_members",
    "least_trial_iterations",
    "measure",
    "trials_at_once",
    "wall_seconds",
]

ESTIMATE_BUDGET_S = 2.0
"""Time spent training at most, for the estimate (plus building the task and one evaluation)."""
TIMED_MEMBERS = 16
"""On a CPU, a fused group's estimate times at most this many members: per member-iteration, a
larger group costs about what 16 do there (`bench/fused_speed.py`: K = 8 and 16 within 2%). On a
GPU it times the whole group."""


MEMORY_MEMBERS = 4
"""A fused group's memory is measured on this many members (a member's share is the same at any
K: its rows of every tensor)."""


@dataclass(frozen=True)
class Check:
    """What running a spec would do, as data: ``ponder-study check``'s report, which `str` gives."""

    spec: StudySpec
    """The validated spec, with its overrides (name, trials, storage)."""
    trials: int
    """``num_samples``: trials the study runs."""
    budget: int
    """Trial-iterations if every trial runs its whole budget (trials x ``iterations``)."""
    least_budget: int
    """The least ASHA could cut the budget to (the budget itself without ASHA)."""
    cpu: float
    """CPUs a trial reserves (a fused group's share: ``[resources] cpu / fuse``)."""
    gpu: float
    """GPUs a trial reserves (``[resources] gpu / fuse``)."""
    fuse: int
    """Trials trained as one model (``[resources] fuse``; 1: each in its own process)."""
    fits: int
    """Trials this machine holds at once (0: a cluster must run it)."""
    at_once: int
    """Trials at once here: ``fits``, at most ``max_concurrent``."""
    exists: bool
    """A study of this name is already under the storage (`run` would refuse it)."""
    estimate: Estimate | None
    """The iterations timed here; None with ``estimate=False`` or where the task cannot be built."""
    wall_s: float | None
    """Estimated seconds of training and evaluation for the whole budget (None: not estimated)."""
    least_wall_s: float | None
    """The same for ASHA's least budget (None: not estimated, or no ASHA)."""
    group_bytes: float | None
    """A fused group's memory on its device at an iteration's peak (None: not fused, or not estimated)."""
    text: str = field(repr=False)
    """The report ``ponder-study check`` prints."""

    def __str__(self) -> str:
        return self.text


def check_spec(spec_arg: str, storage: str | None = None, *, estimate: bool = True) -> str:
    """The report ``ponder-study check SPEC`` prints; raises `SpecError` for a bad spec."""
    return str(check(load_spec(spec_arg).with_overrides(storage=storage), estimate=estimate))


def check(spec: StudySpec, *, estimate: bool = True) -> Check:
    """What running ``spec`` would do (`Check`), without Ray; ``estimate`` times a few training
    iterations of its task here (torch) for the wall time and a fused group's memory."""
    lines = [f"spec {spec.name!r} is valid: {spec.description}", "", f"task {spec.task}, search space:"]
    lines += [f"  {_dimension(d)}" for d in spec.space]
    if spec.config:
        fixed = ", ".join(f"{k}={v!r}" for k, v in spec.config.items())
        lines.append(f"  fixed: {fixed}")
    budget, least = _budget(spec)
    lines += ["", *budget]

    cpus, gpus = os.cpu_count() or 1, _gpu_count()
    res = spec.resources
    room = trials_at_once(2**31, res.cpu / res.fuse, res.gpu / res.fuse, cpus, gpus)  # the machine's
    fit = min(room, spec.search.max_concurrent)
    groups = room // res.fuse  # fused groups side by side here (each `cpu` CPUs, or a `gpu` share)
    lines += ["", *_fusion(spec, groups)]
    lines += [
        f"trials at once: at most {spec.search.max_concurrent} (max_concurrent); this machine "
        f"({cpus} CPUs, {gpus} GPUs) fits {room}"
        + (f" ({groups} group{'s' if groups != 1 else ''} of {res.fuse})" if res.fuse > 1 and room else "")
        + ("" if room else " (a cluster runs it: ponder-study run --address ...)"),
    ]
    exists = _exists(StudyPaths(spec.run.storage, spec.name))
    lines += ["", *_results(spec, exists), ""]
    wall = _Wall()
    if not estimate:
        lines.append(
            "wall time"
            + (" and a group's memory" if res.fuse > 1 else "")
            + ": not estimated (--no-estimate)"
        )
    else:
        wall = _wall_time(spec, fit, least)
        lines += wall.lines
    n = spec.search.num_samples
    return Check(
        spec=spec,
        trials=n,
        budget=n * spec.iterations,
        least_budget=least,
        cpu=res.cpu / res.fuse,
        gpu=res.gpu / res.fuse,
        fuse=res.fuse,
        fits=room,
        at_once=fit,
        exists=exists,
        estimate=wall.estimate,
        wall_s=wall.seconds,
        least_wall_s=wall.least_seconds,
        group_bytes=wall.group_bytes,
        text="\n".join(lines),
    )


def _fusion(spec: StudySpec, groups: int) -> list[str]:
    """What a trial reserves, and with ``fuse``, how trials are trained together (``groups``: the
    fused groups this machine holds side by side)."""
    res = spec.resources
    if res.fuse == 1:
        return [
            f"resources per trial: {res.cpu:g} CPU, {res.gpu:g} GPU; each trial trains in its own process"
        ]
    device = "GPU" if res.gpu > 0 else "CPU group"
    mode = spec.config_for({d.name: _centre(d) for d in spec.space}).compile
    step = "compiled" if compiles_on(mode, "cuda" if res.gpu > 0 else "cpu") else "eager"
    lines = [
        f"fused: up to {res.fuse} trials trained as one model per {device} ({res.cpu:g} CPU, {res.gpu:g} GPU "
        f"a group); each trial reserves {res.cpu / res.fuse:g} CPU, {res.gpu / res.fuse:g} GPU",
        f"  a group's step runs {step} (compile = {mode!r})",
    ]
    note = fusion_note(spec.search.num_samples, spec.search.max_concurrent, res.fuse, groups)
    return lines + ([f"  note: {note}"] if note else [])


def fusion_note(trials: int, max_concurrent: int, fuse: int, groups: int) -> str | None:
    """What keeps a fused study from using the ``groups`` groups this machine holds side by side
    (or from filling its one group), and the ``fuse`` and ``max_concurrent`` that would; None when
    nothing does. A group trains the trials placed on its CPUs or GPU share, so trials at once that
    fit in fewer groups than the machine holds leave the others' CPUs idle."""
    if groups < 1:
        return None  # a cluster runs it
    at_once = min(max_concurrent, trials, groups * fuse)
    used = -(-at_once // fuse)  # groups those trials fill, one before the next
    most = min(trials, groups * fuse)  # the most trials this fuse trains at once here
    if used < groups and most > used:
        spread = -(-most // groups)
        raise_it = f" with [search] max_concurrent = {most}" if max_concurrent < most else ""
        idle = "the other idles" if groups - used == 1 else "the others idle"
        how = f"in {-(-most // spread)} groups of up to {spread}" if spread > 1 else "each in its own process"
        return (
            f"{at_once} trials at once fill {used} of the {groups} groups this machine holds, and {idle}: "
            f"fuse = {spread}{raise_it} trains {most} trials at once {how}"
        )
    if at_once < most:
        fill = "one" if most >= fuse else f"it with all {trials}"
        return (
            f"at most {at_once} trials at once (max_concurrent), so a group holds no more than that; "
            f"raise [search] max_concurrent to {most} to fill {fill}"
        )
    return None


def _budget(spec: StudySpec) -> tuple[list[str], int]:
    """The trial count and the budget in trial-iterations, in lines, and the least ASHA could cut
    the budget to (the budget itself without ASHA)."""
    n, iters = spec.search.num_samples, spec.iterations
    how = f"{spec.search.sampler} sampler, seed {spec.search.seed}"
    if spec.search.sampler == "grid":
        how = "grid: " + " x ".join(f"{len(d.values or ())} {d.name}" for d in spec.space) + " values"
    lines = [f"trials: {n} ({how})"]
    full = n * iters
    lines.append(f"budget: {n} trials x {iters:,} iterations = {full:,} trial-iterations")
    least = full
    if spec.scheduler is not None:
        s = spec.scheduler
        rungs = asha_milestones(s.grace_period, iters, s.reduction_factor, s.brackets)
        least = least_trial_iterations(n, iters, rungs, s.reduction_factor)
        if rungs:
            lines.append(
                f"  ASHA (rungs at {', '.join(f'{r:,}' for r in rungs)} iterations, keeping "
                f"1/{s.reduction_factor:g} at each) could cut it to {least:,} at best ({least / full:.0%})"
            )
        else:
            lines.append(
                f"  ASHA has no rung below the budget (grace_period {s.grace_period:,}): "
                "every trial runs its whole budget"
            )
    else:
        lines.append(f"  no ASHA ({len(spec.objectives)} objectives): every trial runs its whole budget")
    return lines, least


def _results(spec: StudySpec, exists: bool) -> list[str]:
    """Where the study's files would go, and whether a study of that name is there already."""
    paths = StudyPaths(spec.run.storage, spec.name)
    root = spec.run.storage if has_scheme(spec.run.storage) else os.path.abspath(spec.run.storage)
    lines = [
        f"results under {root}:",
        f"  study records  {paths.study_dir}",
        f"  Tune           {paths.experiment}",
        f"  trials table   {paths.trials_parquet}",
        f"  history table  {paths.table_dir('history')}/",
    ]
    if exists:
        lines.append(
            f"  a study named {spec.name!r} already exists there: `run` would refuse it; "
            f"`{command_name()} resume {shlex.quote(spec.name)}` continues it (or run with --name NEW)"
        )
    else:
        lines.append(f"  no study named {spec.name!r} there yet: `run` starts it")
    return lines


@dataclass(frozen=True)
class _Wall:
    """The wall-time estimate: its lines of the report, and its figures (None: not estimated)."""

    lines: list[str] = field(default_factory=list)
    estimate: Estimate | None = None
    seconds: float | None = None
    least_seconds: float | None = None
    group_bytes: float | None = None


def _wall_time(spec: StudySpec, fit: int, least: int) -> _Wall:
    """The wall-time estimate, from iterations timed here (`measure`), ``fit`` trials at once
    (with ``fuse``, in groups that each train as one model); ``least`` trial-iterations is the
    budget ASHA could cut to."""
    n, iters = spec.search.num_samples, spec.iterations
    full = n * iters
    fit = min(fit, n)  # a study of fewer trials than fit runs them all at once
    members = group_members(spec, fit)
    try:
        e = measure(spec, members=members)
    except Exception as exc:  # the estimate is a courtesy: a task it cannot build here is no spec error
        return _Wall([f"wall time: no estimate ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"])
    evaluations = math.ceil(iters / spec.eval_interval) * n
    at_once = max(max(fit, 1) // members, 1)  # trials, or fused groups: what trains side by side

    def wall(trial_iterations: int) -> float:
        return wall_seconds(e, trial_iterations, evaluations * trial_iterations / full, at_once)

    timed = f"{e.s_per_iteration * 1e3:.1f} ms an iteration"
    if e.members > 1:
        timed = (
            f"{e.s_per_iteration * 1e3:.1f} ms a member-iteration (a fused iteration of {e.members} "
            f"members: {e.s_per_iteration * e.members * 1e3:.0f} ms)"
        )
    lines = [
        f"wall time, an ESTIMATE: {timed} and {e.s_per_evaluation * 1e3:.0f} ms an evaluation, "
        f"measured here on {e.device} ({e.iterations} iterations at {e.at}, {e.threads} thread(s), eager)"
    ]
    span = f"{_duration(wall(full))}" + (f" (ASHA at best: {_duration(wall(least))})" if least < full else "")
    side_by_side = f"{at_once} at once"
    if members > 1:
        side_by_side = f"{at_once} group{'s' if at_once > 1 else ''} of {members} at once"
    lines.append(f"  {n} trials, {side_by_side}: about {span} of training and evaluation")
    lines.append("  not counted: Ray's start (~10 s), per-trial set-up, other load on the machine")
    if e.bytes_per_member:
        fuse, per = spec.resources.fuse, e.bytes_per_member
        gpu = f"; an 80 GB GPU holds about {int(0.9 * 80e9 / per):,} members" if spec.resources.gpu else ""
        lines.append(
            f"memory: a fused group needs about {_size(per)} a member on its device at an iteration's "
            f"peak (its tensors at max_steps {spec.longest_max_steps}, measured here): "
            f"{_size(fuse * per)} for a group of {fuse}{gpu}"
        )
    if spec.resources.gpu > 0 and e.device == "cpu":
        lines.append("  the trials ask for GPUs and none is here: on a GPU they run at another speed")
    group = spec.resources.fuse * e.bytes_per_member if e.bytes_per_member else None
    return _Wall(lines, e, wall(full), wall(least) if least < full else None, group)


def group_members(spec: StudySpec, fit: int) -> int:
    """Trials a fused group of ``spec`` trains at once on this machine (``fit`` trials at once in
    all): ``fuse``, or fewer where fewer trials run at once; where none fits here (a cluster runs
    it, ``fit`` 0), what a group there holds; 1 without fusion."""
    return max(1, min(spec.resources.fuse, fit or spec.resources.fuse, spec.search.max_concurrent))


def wall_seconds(e: Estimate, trial_iterations: float, evaluations: float, side_by_side: int) -> float:
    """Seconds to train ``trial_iterations`` and make ``evaluations`` with ``side_by_side`` trials
    (or fused groups, whose member-iterations `measure` timed) training at once. A fused group
    evaluates its members one after another, so an evaluation costs a group what it costs a trial."""
    return (trial_iterations * e.s_per_iteration + evaluations * e.s_per_evaluation) / max(side_by_side, 1)


def asha_milestones(grace: int, max_t: int, factor: float, brackets: int = 1) -> list[int]:
    """The iterations at which ASHA compares trials (the first bracket's rungs), as Ray's
    ``AsyncHyperBandScheduler`` places them: ``grace * factor**k`` below ``max_t``."""
    count = int(math.log(max_t / grace) / math.log(factor) + 1)
    rungs = sorted(int(grace * factor**k) for k in range(count))
    return [r for r in rungs if r < max_t]


def least_trial_iterations(n: int, max_t: int, rungs: list[int], factor: float) -> int:
    """Trial-iterations if ASHA stops all it may: of ``n`` trials, ``n / factor**k`` pass the k-th
    rung, the rest stop there. A bound: the first trials at a rung always go on."""
    total, start = 0.0, 0
    for k, end in enumerate([*rungs, max_t]):
        total += n / factor**k * (end - start)
        start = end
    return round(total)


def trials_at_once(max_concurrent: int, cpu: float, gpu: float, cpus: int, gpus: int) -> int:
    """How many trials run together on one machine with ``cpus`` and ``gpus``."""
    fit = min(max_concurrent, int(cpus // cpu))
    return min(fit, int(gpus // gpu)) if gpu > 0 else fit


@dataclass(frozen=True)
class Estimate:
    """Seconds a training iteration and an evaluation took here, at one point of the space."""

    s_per_iteration: float
    """Seconds a training iteration took; fused, a member-iteration (a fused iteration / members)."""
    s_per_evaluation: float
    iterations: int
    device: str
    threads: int
    at: str
    """The point of the space timed (``lambda_p=0.21, max_steps=12``)."""
    members: int = 1
    """Members of the fused group timed (1: a plain `Trainer`)."""
    bytes_per_member: float = 0.0
    """Fused: the device memory a member needs at an iteration's peak (the group's tensors: its
    share of the stacked weights, Adam, data and activations), at the longest max_steps."""


def measure(spec: StudySpec, budget_s: float = ESTIMATE_BUDGET_S, members: int = 1) -> Estimate:
    """Time real training iterations of the spec's task at the centre of its space (each range's
    middle, on a log scale where the range is; the middle listed value), eager, with the threads
    one trial (or fused group) gets; ``budget_s`` of training at most, after one warm-up iteration.
    ``members`` > 1: a fused group of that many (`ponder.fused.trainer.FusedTrainer`, on a CPU at
    most `TIMED_MEMBERS` of them, each its own seed), timed per member-iteration."""
    import torch

    from ponder.fused.trainer import FusedTrainer
    from ponder.trainer import Trainer

    point = {d.name: _centre(d) for d in spec.space}
    config = spec.config_for(point)
    config.compile = "off"  # a compile takes a minute: time the eager step (auto is eager on the CPU)
    threads = max(1, int(spec.resources.cpu))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        trainer = Trainer(config)
        # on a GPU a member-iteration keeps getting cheaper with K (launches, not arithmetic)
        timed = members if trainer.device.type == "cuda" else min(members, TIMED_MEMBERS)
        step: Any = trainer.train_step
        per_member = 0.0
        if timed > 1:

            def group_of(size: int, max_steps: int) -> FusedTrainer:
                group = FusedTrainer(size, trainer.device, compile=False)
                for k in range(size):
                    group.join(dataclasses.replace(config, seed=config.seed + k, max_steps=max_steps))
                group.train_step()  # warm-up: first-call allocations
                return group

            # memory at the longest max_steps a member may have (a compiled group unrolls it for all)
            size = min(timed, MEMORY_MEMBERS)
            _, peak = peak_memory(lambda: group_of(size, spec.longest_max_steps), trainer.device)
            step, per_member = group_of(timed, config.max_steps).train_step, peak / size
        else:
            step()  # warm-up: first-call allocations
        count, start = 0, time.perf_counter()
        while count < 3 or (time.perf_counter() - start < budget_s and count < config.iterations):
            step()
            count += 1
        per_iteration = (time.perf_counter() - start) / count / timed
        start = time.perf_counter()
        trainer.evaluate()
        per_evaluation = time.perf_counter() - start
    finally:
        torch.set_num_threads(before)
    at = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in point.items())
    return Estimate(per_iteration, per_evaluation, count, str(trainer.device), threads, at, timed, per_member)


T = TypeVar("T")


def peak_memory(build: Callable[[], T], device: Any) -> tuple[T, int]:
    """(what ``build`` returns, the most bytes of tensors it held at once on ``device``): CUDA's
    allocator statistics on a GPU; on a CPU, torch's profiler's allocation events in order."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        out = build()
        return out, torch.cuda.max_memory_allocated(device) - start
    from torch.profiler import ProfilerActivity, profile

    with _stderr_closed(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = build()
    held = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        held += event.self_cpu_memory_usage  # + allocated, - freed, by this op alone
        peak = max(peak, held)
    return out, peak


def _centre(d: Dimension) -> Any:
    if d.values is not None:
        ordered = sorted(d.values) if all(isinstance(v, int | float) for v in d.values) else list(d.values)
        return ordered[(len(ordered) - 1) // 2]
    assert d.low is not None and d.high is not None
    mid = math.sqrt(d.low * d.high) if d.log else (d.low + d.high) / 2
    return round(mid) if d.integer else mid


def _dimension(d: Dimension) -> str:
    if d.values is not None:
        return f"{d.name:<14} one of {', '.join(map(str, d.values))}"
    kind = "int" if d.integer else "float"
    scale = ", log scale" if d.log else ""
    return f"{d.name:<14} {kind} in [{d.low:g}, {d.high:g}]{scale}"


def _gpu_count() -> int:
    """GPUs here, without importing torch: ``nvidia-smi -L`` lists one a line."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def _exists(paths: StudyPaths) -> bool:
    try:
        return paths.exists()
    except OSError:  # an unreachable storage: `run` says so itself
        return False


@contextlib.contextmanager
def _stderr_closed() -> Iterator[None]:
    """File descriptor 2 to /dev/null inside the block: torch's profiler writes a line to it at its
    start and stop (its C++ layer, whatever the log level), which is no message for a user."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
