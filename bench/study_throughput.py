"""A whole study's wall time in each compile mode: what a user waits for, Ray and compiles included.

Four trials of ``--iterations`` (default 10,000) on 15-element parity (the reference size: max_steps
20, batch 128, hidden 64), lambda_p and beta different in each (``--vary-max-steps``: max_steps
10 and 20 instead of two betas, so the compiled trials need two shapes), no early stopping, two
trials at a time on one CPU each. Each study is the real command (``ponder-study run``, its own
local Ray instance) in a fresh process, timed from start to exit. Modes, in this order:

- ``eager``: ``compile = "off"``, the baseline;
- ``default``: the config's default (``auto``: see `ponder.compiled.should_compile`), with an
  empty Inductor cache;
- ``compiled``: ``compile = "on"``, first with an empty Inductor cache (``cold``), then again with
  the cache the first run filled (``warm``), as a second study on the same machine would.

Where the default compiles (``--gpu``: on CUDA), ``compiled`` is the default, so the modes are
``eager``, ``default cold`` and ``default warm``.

``--gpu FRACTION`` runs the trials on the GPU, ``FRACTION`` of it each (0.25: all four at once
on one GPU), instead of two at a time on one CPU each.

With ``--shipped`` it also times the shipped ``parity`` study (what ``make study`` runs) in the
default mode and in eager. The last line is ``ratio <default / eager>`` for the four-trial study
(the default's first run, with the empty cache).

    .venv/bin/python bench/study_throughput.py [--iterations 10000] [--vary-max-steps] [--shipped]
        [--gpu 0.25]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SPEC = """\
description = "bench/study_throughput.py: four trials of 15-element parity"
task = "parity"

[config]
n_elems = 15
batch_size = 128
n_hidden = 64
iterations = {iterations}
eval_interval = {eval_interval}
compile = "{compile}"
{fixed}

[space.lambda_p]
values = [0.1, 0.3]

[space.{second}]
values = {second_values}

[search]
sampler = "grid"
max_concurrent = {concurrent}

[scheduler]
metric = "test/halted_accuracy"
mode = "max"
grace_period = {iterations}  # every trial runs its whole budget

[resources]
cpu = 1
gpu = {gpu}
"""


def study_spec(iterations: int, compile: str, vary_max_steps: bool, gpu: float = 0.0) -> str:
    second, values, fixed = (
        ("max_steps", "[10, 20]", "beta = 0.01")
        if vary_max_steps
        else ("beta", "[0.01, 0.001]", "max_steps = 20")
    )
    return SPEC.format(
        iterations=iterations,
        eval_interval=max(iterations // 4, 1),
        compile=compile,
        fixed=fixed,
        second=second,
        second_values=values,
        concurrent=min(4, int(1 / gpu)) if gpu else 2,
        gpu=gpu,
    )


def shipped_spec(compile: str | None) -> str:
    """The shipped ``parity`` spec, with ``compile`` fixed in its [config] if given."""
    sys.path.insert(0, str(REPO))
    from study.spec.spec import load_spec

    source = load_spec("parity").source
    return (
        source if compile is None else source.replace("[config]\n", f'[config]\ncompile = "{compile}"\n', 1)
    )


def run(spec: str, name: str, storage: Path, cache: Path) -> float:
    """Seconds from launching ``ponder-study run`` to its exit (which must be 0)."""
    args = [sys.executable, "-m", "study", "run", spec, "--name", name, "--storage", str(storage), "--quiet"]
    env = {**os.environ, "PONDER_STUDY_CACHE": str(cache)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    start = time.perf_counter()
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=10_000, help="iterations per trial")
    parser.add_argument("--vary-max-steps", action="store_true", help="max_steps 10 and 20 across trials")
    parser.add_argument("--shipped", action="store_true", help="also time the shipped parity study")
    parser.add_argument(
        "--gpu", type=float, default=0.0, help="fraction of the GPU per trial (default 0: the CPU)"
    )
    args = parser.parse_args()
    if not 0 <= args.gpu <= 1:
        parser.error(f"--gpu {args.gpu}: give a fraction of one GPU, between 0 and 1")

    sys.path.insert(0, str(REPO))
    import torch

    from ponder.compiled import should_compile

    default_compiles = should_compile("auto", torch.device("cuda" if args.gpu else "cpu"))
    # (label, compile mode, cache): each cache starts empty, and a "warm" run reuses its cold run's
    modes = (
        [("eager", "off", "eager"), ("default cold", "auto", "default"), ("default warm", "auto", "default")]
        if default_compiles
        else [
            ("eager", "off", "eager"),
            ("default", "auto", "default"),
            ("compiled cold", "on", "compiled"),
            ("compiled warm", "on", "compiled"),
        ]
    )
    with tempfile.TemporaryDirectory(prefix="study_throughput.") as tmp:
        root = Path(tmp)
        times: dict[str, float] = {}
        for label, mode, cache in modes:
            spec = root / f"{label.replace(' ', '-')}.toml"
            spec.write_text(study_spec(args.iterations, mode, args.vary_max_steps, args.gpu))
            times[label] = run(str(spec), label.replace(" ", "-"), root / "results", root / f"cache-{cache}")
            ratio = times[label] / times["eager"]
            print(f"{label:14s} compile={mode:4s} {times[label]:7.1f} s  {ratio:.2f}x eager", flush=True)
        default = times[modes[1][0]]  # the default's first run, with its empty cache
        if args.shipped:
            shipped: dict[str, float] = {}
            for label, mode in (("eager", "off"), ("default", None)):
                spec = root / f"parity-{label}.toml"
                spec.write_text(shipped_spec(mode))
                shipped[label] = run(str(spec), f"parity-{label}", root / "results", root / "cache-default")
                print(f"shipped parity, {label:7s} {shipped[label]:7.1f} s", flush=True)
            print(f"shipped parity: default / eager {shipped['default'] / shipped['eager']:.2f}")
        print(f"ratio {default / times['eager']:.2f}")


if __name__ == "__main__":
    main()
