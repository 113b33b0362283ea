"""The same study run fused and unfused for a fixed wall time: member-iterations trained per second.

A study of 15-element parity at the default shapes (hidden 64, batch 128, max_steps 4-20 searched,
lambda_p and beta searched, ASHA on), or with ``--task mnist`` of MNIST at the shipped mnist spec's
(batch 128, hidden 64, max_steps 2-12, no rotated sets), is started by the real command
(``ponder-study run``, its own local Ray instance, the progress table off) and stopped with
Ctrl-C after ``--seconds``. What it trained is read back from its history Parquet: each trial's
last reported iteration, summed over trials (reports and evaluations included, iterations past a
trial's last report not counted).

- unfused: ``[resources] cpu = 1`` a trial, two at a time (the CPU default), or with ``--gpu F``
  a fraction F of the GPU a trial (0.25: four packed on one GPU);
- fused: ``fuse = K`` (``--fuse``), a group per ``--group-cpus`` CPUs (default 1: a group a core,
  as the unfused trials take a core each), or with ``--gpu`` one group on the GPU (``gpu = 1``).

The runs alternate (unfused, fused; ``--rounds`` times) so a machine whose speed drifts slows both.
Prints a row per run (``first s``: from the launch to the study's first report, Ray's start and
the first ``eval_interval`` of training included) and, last, ``ratio <fused / unfused
member-iterations per second>`` (medians), after a line with the same ratio of the rates from
``--settle`` seconds after the launch to the stop (the start left out: what a study long enough
for its start not to matter approaches). With ``--cpu``, a row per run of the CPU seconds the
study's processes had used 2 s before the stop, by role (``ps``: trials, fusers, the driver, Ray's
own), and the CPU seconds the machine had left idle: where a study's cores go.

    .venv/bin/python bench/fused_throughput.py --seconds 120 --fuse 8
    .venv/bin/python bench/fused_throughput.py --seconds 120 --fuse 256 --gpu 0.25 --num-samples 1024
    .venv/bin/python bench/fused_throughput.py --task mnist --seconds 120 --fuse 64 --gpu 0.25

``--to-end`` runs the fused study alone until it finishes (``--seconds`` its limit) and prints its
wall time: 256 trials x 5,000 iterations with ASHA on one GPU (a step of bench/gpu_checks.sh) is

    .venv/bin/python bench/fused_throughput.py --to-end --gpu 1 --fuse 256 --num-samples 256 --seconds 300
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
NAME = "fused-bench"


TASKS = {  # each task's [config] and max_steps range: parity-15's defaults, the shipped mnist spec's
    "parity": ('task = "parity"\n[config]\nn_elems = 15', (4, 20)),
    "mnist": ('task = "mnist"\n[config]\neval_rotations = []', (2, 12)),
}


def spec_text(args: argparse.Namespace, fused: bool) -> str:
    """The study: ``--task`` at its default shapes, ``num_samples`` trials, fused or not."""
    if fused:
        group_cpus = 1 if args.gpu else args.group_cpus
        resources = f"cpu = {group_cpus}\ngpu = {1 if args.gpu else 0}\nfuse = {args.fuse}"
        at_once = args.fuse * (1 if args.gpu else max(1, args.cpus // group_cpus))
    elif args.gpu:
        resources = f"cpu = 1\ngpu = {args.gpu}"
        at_once = round(1 / args.gpu)
    else:
        resources = "cpu = 1\ngpu = 0"
        at_once = args.cpus
    config, (low, high) = TASKS[args.task]
    return f"""description = "fused-throughput bench"
{config}
iterations = {args.iterations}
eval_interval = 250
[space.lambda_p]
low = 0.05
high = 0.9
[space.beta]
low = 1e-4
high = 0.1
log = true
[space.max_steps]
low = {low}
high = {high}
[search]
seed = {args.seed}
num_samples = {args.num_samples}
max_concurrent = {at_once}
[scheduler]
metric = "test/halted_accuracy"
mode = "max"
grace_period = 500
reduction_factor = 3
[resources]
{resources}
"""


def cpu_by_role(driver: int) -> dict[str, int]:
    """CPU seconds (user + system) of the driver and every process below it, by role."""
    table = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,cputimes=,args="], capture_output=True, text=True, check=True
    ).stdout
    parent, cpu, role = {}, {}, {}
    for line in table.splitlines():
        pid, ppid, seconds, command = line.split(None, 3)
        parent[int(pid)], cpu[int(pid)] = int(ppid), int(seconds)
        name = command.split()[0]
        role[int(pid)] = (
            "fusers" if name.startswith("ray::Fuser") and not name.startswith("ray::FuserRegistry")
            else "trials" if name.startswith("ray::ImplicitFunc")
            else "driver" if int(pid) == driver
            else "ray"
        )  # fmt: skip
    out: dict[str, int] = collections.Counter()
    for pid in cpu:
        up = pid
        while up not in (driver, 0, 1) and up in parent:
            up = parent[up]
        if up == driver:
            out[role[pid]] += cpu[pid]
    return dict(out)


class Run(NamedTuple):
    """What one run trained, read back from its history Parquet."""

    iterations: int
    """member-iterations: each trial's last reported iteration, summed"""
    trials: int
    """trials that reported"""
    wall: float
    """seconds from the launch to the stop (or the study's end)"""
    first: float
    """seconds from the launch to the first report"""
    cpu: dict[str, int]
    """CPU seconds by role 2 s before the stop (``--cpu``; else empty)"""
    steady: float
    """member-iterations a second from ``--settle`` seconds after the launch to the stop"""


def run_for(args: argparse.Namespace, fused: bool, where: Path) -> Run:
    """Run the study for ``--seconds`` then Ctrl-C, and read what it trained."""
    where.mkdir(parents=True)
    spec = where / f"{NAME}.toml"
    spec.write_text(spec_text(args, fused))
    cmd = [sys.executable, "-m", "study", "run", str(spec), "--storage", str(where / "s"), "--quiet"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    start, launched = time.monotonic(), time.time()
    with (where / "driver.log").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        cpu: dict[str, int] = {}
        try:
            if args.cpu:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(args.seconds - 2)
                cpu = cpu_by_role(proc.pid)
                proc.wait(max(0.0, args.seconds - (time.monotonic() - start)))
            else:
                proc.wait(args.seconds)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
        wall = time.monotonic() - start
        proc.wait(300)
    history = pd.read_parquet(where / "s" / "history" / f"study={NAME}")
    last = history.groupby("trial_id")["iteration"].max()
    first = history["timestamp"].min().timestamp() - launched  # Tune's timestamps are whole seconds
    settled = history[history["timestamp"] <= pd.Timestamp(launched + args.settle, unit="s", tz="UTC")]
    before = settled.groupby("trial_id")["iteration"].max().sum() if len(settled) else 0
    steady = (last.sum() - before) / max(wall - args.settle, 1e-9)
    return Run(int(last.sum()), len(last), wall, first, cpu, float(steady))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=120, help="wall time of each run, Ray's start included")
    p.add_argument(
        "--task", choices=sorted(TASKS), default="parity", help="the study's task (default parity)"
    )
    p.add_argument("--fuse", type=int, default=8, help="K: trials a fused group trains as one model")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="CPUs the study may use")
    p.add_argument("--group-cpus", type=int, default=1, help="CPUs (torch threads) of each fused group")
    p.add_argument("--gpu", type=float, default=0.0, help="on the GPU: this fraction of it per unfused trial")
    p.add_argument("--num-samples", type=int, default=256, help="trials (more than a run gets through)")
    p.add_argument("--iterations", type=int, default=5000, help="each trial's budget")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="print each run's CPU seconds by process role")
    p.add_argument(
        "--settle",
        type=float,
        default=60,
        help="the steady rate counts from this many seconds after the launch",
    )
    p.add_argument(
        "--to-end",
        action="store_true",
        help="run the fused study alone, to its end or --seconds, and say whether it finished",
    )
    args = p.parse_args()
    where = Path(tempfile.mkdtemp(prefix="fused-throughput-"))
    if args.to_end:
        to_end(args, where)
        return
    rates: dict[bool, list[float]] = {False: [], True: []}
    steady: dict[bool, list[float]] = {False: [], True: []}
    settled = f"after {args.settle:g} s"
    print(
        f"{'run':<10} {'member-iterations':>18} {'trials':>7} {'wall s':>7} {'first s':>8} {'per s':>9}"
        f" {settled:>12}",
        flush=True,
    )
    for r in range(args.rounds):
        for fused in (False, True):
            run = run_for(args, fused, where / f"{r}-{'fused' if fused else 'unfused'}")
            rates[fused].append(run.iterations / run.wall)
            steady[fused].append(run.steady)
            label = f"fused K={args.fuse}" if fused else "unfused"
            row = f"{label:<10} {run.iterations:>18,} {run.trials:>7} {run.wall:>7.1f} {run.first:>8.0f}"
            print(f"{row} {run.iterations / run.wall:>9.1f} {run.steady:>12.1f}", flush=True)
            if args.cpu:
                seconds = args.seconds - 2
                roles = ("trials", "fusers", "driver", "ray")
                split = ", ".join(f"{role} {run.cpu.get(role, 0)}" for role in roles)
                idle = args.cpus * seconds - sum(run.cpu.values())
                print(f"  CPU s: {split}; idle {idle:.0f} of {args.cpus} x {seconds:.0f}", flush=True)
    print(f"storage {where}")
    settled_ratio = statistics.median(steady[True]) / statistics.median(steady[False])
    print(f"ratio {settled_ratio:.2f} {settled} (the start left out: what a long study approaches)")
    print(f"ratio {statistics.median(rates[True]) / statistics.median(rates[False]):.2f}")


def to_end(args: argparse.Namespace, where: Path) -> None:
    """The fused study alone, until it ends (or ``--seconds``, then Ctrl-C): its wall time and
    member-iterations per second; last line ``finished <yes|no> <ended>/<trials> in <wall> s``."""
    run = run_for(args, True, where / "fused")
    table = pd.read_parquet(where / "fused" / "s" / "trials" / f"study={NAME}")
    ended = int(table["status"].isin(["completed", "early_stopped", "diverged"]).sum())
    n, wall, made = args.num_samples, run.wall, run.iterations
    print(f"fused K={args.fuse}: {made:,} member-iterations in {wall:.1f} s ({made / wall:.1f} a second),")
    print(f"  first report after {run.first:.0f} s, {ended} of {n} trials ended; storage {where}")
    print(f"finished {'yes' if ended == n else 'no'} {ended}/{n} in {wall:.1f} s", flush=True)


if __name__ == "__main__":
    main()
