"""Time one parity training iteration: this library, eager and compiled, against the reference formulation.

Shapes: the reference implementations' parity run, n_elems 15, max_steps 20, batch 128, hidden 64,
CPU, 2 threads. The baseline (`bench/reference_baseline.py`) builds samples one at a time through
a DataLoader, computes p as a product, loops over steps in the reconstruction loss and takes
``KLDivLoss(p.log(), p_g)``.

Each side runs in its own fresh worker process, as each would run for real (ponder's trainer
changes process-wide malloc settings, see `ponder/cpu.py`, which the reference code would not
have), and the workers alternate for several rounds so that a busy moment of the machine hits
all alike. ``compiled`` is `Trainer` with ``compile = "on"``: its first iteration, which
compiles (or loads the compile from Inductor's cache, `ponder.compiled`), is timed apart from
the iterations; the first round's compile is cold only if the cache has no entry for these
shapes and thread count (``--cache DIR`` picks the cache; default the one trials share).

Prints each mode's median and, as its last line, ``speedup <reference / mode>`` for the mode a
parity trial with the default config uses on this device (`ponder.compiled.should_compile`).

``--device cuda`` times every mode on the GPU (each iteration waited for: ``synchronize``), the
reference batches built on the CPU and moved, as their code does. There ``compiled`` replays CUDA
graphs (`ponder.compiled.CUDA_GRAPHS`), and ``compiled-nographs`` is the same compile without
them, to show what the graphs add.

    .venv/bin/python bench/iteration_speed.py [--iterations 1000] [--rounds 5] [--threads 2] [--task mnist]
        [--modes reference,eager,compiled] [--cache DIR] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SHAPES = {"n_elems": 15, "max_steps": 20, "batch_size": 128, "n_hidden": 64}
MNIST_SHAPES = {"max_steps": 20, "batch_size": 128, "n_hidden": 64}
"""MNIST (``--task mnist``): the CNN + MLP step at the config's defaults otherwise (embedding 64)."""
MODES = ("reference", "eager", "compiled", "compiled-nographs")
OLD_MODES = {"seeds": "reference"}
"""A mode's former name -> its name now (``--modes seeds,eager`` still runs)."""
NAMES = {
    "reference": "reference formulation",
    "eager": "ponder, eager",
    "compiled": "ponder, compiled",
    "compiled-nographs": "compiled, no graphs",
}


def worker(
    which: str, iterations: int, warmup: int, threads: int, task: str = "parity", device: str = "cpu"
) -> dict[str, list[float] | float]:
    """Seconds per training iteration of one mode, the first iteration's seconds (the compile, for
    ``compiled``), and page faults per iteration, in this process."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if which == "reference":
        sys.path.insert(0, str(HERE))
        from reference_baseline import ReferenceTrainer

        train_step = ReferenceTrainer(**SHAPES, lambda_p=0.2, beta=0.01, lr=3e-4, device=device).step
    else:
        import ponder.compiled
        from ponder import MnistConfig, ParityConfig, Trainer

        ponder.compiled.CUDA_GRAPHS = which != "compiled-nographs"
        compile = "off" if which == "eager" else "on"
        if task == "mnist":
            config: ParityConfig | MnistConfig = MnistConfig(**MNIST_SHAPES, device=device, compile=compile)
        else:
            config = ParityConfig(**SHAPES, lr=3e-4, device=device, compile=compile)
        train_step = Trainer(config).train_step  # type: ignore[assignment]
    on_cuda = device.startswith("cuda")

    def step() -> None:
        train_step()
        if on_cuda:  # the iteration's kernels done, not only launched
            torch.cuda.synchronize()

    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    for _ in range(warmup):
        step()
    times = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(iterations):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"times": times, "first": first, "faults": faults / iterations}


def default_mode(device: str) -> str:
    """The mode a parity trial with the default config uses on ``device``."""
    from ponder import ParityConfig
    from ponder.compiled import should_compile

    config = ParityConfig()
    return "compiled" if should_compile(config.compile, torch.device(device)) else "eager"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=1000, help="timed iterations of each side in all")
    parser.add_argument("--rounds", type=int, default=5, help="alternating worker processes per side")
    parser.add_argument("--warmup", type=int, default=30, help="untimed iterations per worker")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    parser.add_argument("--cache", help="Inductor cache directory (default: the one trials share)")
    parser.add_argument(
        "--task",
        choices=("parity", "mnist"),
        default="parity",
        help="mnist: the CNN + MLP step, eager against compiled (no reference baseline for it here)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (a GPU torch can see)")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: torch finds no CUDA device here")
    if args.worker:
        print(
            json.dumps(
                worker(args.worker, args.iterations, args.warmup, args.threads, args.task, args.device)
            )
        )
        return
    if args.cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(args.cache).resolve())

    asked = [OLD_MODES.get(m, m) for m in args.modes.split(",")]
    if unknown := sorted(set(asked) - set(MODES)):
        parser.error(f"--modes: unknown {', '.join(unknown)}; known: {', '.join(MODES)}")
    modes = [m for m in MODES if m in asked and not (args.task == "mnist" and m == "reference")]
    if not args.device.startswith("cuda"):  # graphs are a CUDA thing: on the CPU it is `compiled`
        modes = [m for m in modes if m != "compiled-nographs"]
    per_round = max(1, args.iterations // args.rounds)
    times: dict[str, list[float]] = {m: [] for m in modes}
    faults: dict[str, list[float]] = {m: [] for m in modes}
    firsts: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for which in modes:
            cmd = [sys.executable, __file__, "--worker", which, "--iterations", str(per_round)]
            cmd += ["--warmup", str(args.warmup), "--threads", str(args.threads), "--task", args.task]
            cmd += ["--device", args.device]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            result = json.loads(out)
            times[which] += result["times"]
            faults[which].append(result["faults"])
            firsts[which].append(result["first"])
            median = statistics.median(result["times"]) * 1e3
            print(f"round {r + 1}/{args.rounds} {which:17s} median {median:6.2f} ms", end="")
            print(f", {result['faults']:.0f} page faults/iteration, first iteration {result['first']:.1f} s")

    shapes = MNIST_SHAPES if args.task == "mnist" else SHAPES
    n_timed = len(times[modes[0]])
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
    print(f"{args.task} shapes: {shapes}, {where}, {args.threads} threads, {n_timed} iterations each")
    ms = {m: statistics.median(times[m]) * 1e3 for m in modes}
    for m in modes:
        page_faults = statistics.mean(faults[m])
        print(f"{NAMES[m]:<19} median {ms[m]:7.2f} ms/iteration, {page_faults:6.0f} page faults/iteration")
    for m in ("compiled", "compiled-nographs"):
        if m not in modes:
            continue
        first, *rest = firsts[m]
        warm = f", later rounds (warm cache) median {statistics.median(rest):.1f} s" if rest else ""
        print(f"compile ({m}, first iteration of a worker): first round {first:.1f} s{warm}")
    if args.task == "mnist":
        if {"eager", "compiled"} <= set(modes):
            print(f"compiled speedup over eager {ms['eager'] / ms['compiled']:.2f}")
        return
    mode = default_mode(args.device)
    if "reference" in modes and mode in modes:
        print(f"default mode for a parity trial on {args.device}: {mode}")
        print(f"speedup {ms['reference'] / ms[mode]:.2f}")


if __name__ == "__main__":
    main()
