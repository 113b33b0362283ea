"""The same study run fused and unfused for a fixed wall time: member-iterations trained per second.

A study of 15-element parity at the default shapes (hidden 64, batch 128, max_steps 4-20 searched,
lambda_p and beta searched, ASHA on) is started by the real command (``ponder-study run``, its own
local Ray instance, the progress table off) and stopped with Ctrl-C after ``--seconds``. What it
trained is read back from its history Parquet: each trial's last reported iteration, summed over
trials (reports and evaluations included, iterations past a trial's last report not counted).

- unfused: ``[resources] cpu = 1`` a trial, two at a time (the CPU default), or with ``--gpu F``
  a fraction F of the GPU a trial (0.25: four packed on one GPU);
- fused: ``fuse = K`` (``--fuse``), a group per ``--group-cpus`` CPUs (default 1: a group a core,
  as the unfused trials take a core each), or with ``--gpu`` one group on the GPU (``gpu = 1``).

The runs alternate (unfused, fused; ``--rounds`` times) so a machine whose speed drifts slows both.
Prints a row per run (``first s``: from the launch to the study's first report, Ray's start and
the first ``eval_interval`` of training included) and, last, ``ratio <fused / unfused
member-iterations per second>`` (medians).

    .venv/bin/python bench/fused_throughput.py --seconds 120 --fuse 8
    .venv/bin/python bench/fused_throughput.py --seconds 120 --fuse 256 --gpu 0.25 --num-samples 1024
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
NAME = "fused-bench"


def spec_text(args: argparse.Namespace, fused: bool) -> str:
    """The study: parity-15 at the default shapes, ``num_samples`` trials, fused or not."""
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
    return f"""description = "fused-throughput bench"
task = "parity"
[config]
n_elems = 15
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
low = 4
high = 20
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


def run_for(args: argparse.Namespace, fused: bool, where: Path) -> tuple[int, int, float, float]:
    """Run the study for ``--seconds`` then Ctrl-C: (member-iterations, trials that reported, wall s,
    seconds to the first report)."""
    where.mkdir(parents=True)
    spec = where / f"{NAME}.toml"
    spec.write_text(spec_text(args, fused))
    cmd = [sys.executable, "-m", "study", "run", str(spec), "--storage", str(where / "s"), "--quiet"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    start, launched = time.monotonic(), time.time()
    with (where / "driver.log").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        try:
            proc.wait(args.seconds)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
        wall = time.monotonic() - start
        proc.wait(300)
    history = pd.read_parquet(where / "s" / "history" / f"study={NAME}")
    last = history.groupby("trial_id")["iteration"].max()
    first = history["timestamp"].min().timestamp() - launched  # Tune's timestamps are whole seconds
    return int(last.sum()), len(last), wall, first


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=120, help="wall time of each run, Ray's start included")
    p.add_argument("--fuse", type=int, default=8, help="K: trials a fused group trains as one model")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="CPUs the study may use")
    p.add_argument("--group-cpus", type=int, default=1, help="CPUs (torch threads) of each fused group")
    p.add_argument("--gpu", type=float, default=0.0, help="on the GPU: this fraction of it per unfused trial")
    p.add_argument("--num-samples", type=int, default=256, help="trials (more than a run gets through)")
    p.add_argument("--iterations", type=int, default=5000, help="each trial's budget")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    where = Path(tempfile.mkdtemp(prefix="fused-throughput-"))
    rates: dict[bool, list[float]] = {False: [], True: []}
    print(
        f"{'run':<10} {'member-iterations':>18} {'trials':>7} {'wall s':>7} {'first s':>8} {'per s':>9}",
        flush=True,
    )
    for r in range(args.rounds):
        for fused in (False, True):
            iterations, trials, wall, first = run_for(
                args, fused, where / f"{r}-{'fused' if fused else 'unfused'}"
            )
            rates[fused].append(iterations / wall)
            label = f"fused K={args.fuse}" if fused else "unfused"
            row = f"{label:<10} {iterations:>18,} {trials:>7} {wall:>7.1f} {first:>8.0f}"
            print(f"{row} {iterations / wall:>9.1f}", flush=True)
    print(f"storage {where}")
    print(f"ratio {statistics.median(rates[True]) / statistics.median(rates[False]):.2f}")


if __name__ == "__main__":
    main()
