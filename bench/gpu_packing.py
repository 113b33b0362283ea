"""How many parity trials one GPU holds at once, and what packing them buys in throughput.

For each packing k (``--packings``, default 1, 2, 4, 8) one real study runs through the
project's own path, `study.run.runner.run_study`: the shipped ``parity`` spec (`study.spec.spec.load_spec`),
its TOML edited and parsed again (`study.spec.spec.parse_spec`) with

- ``num_samples = max_concurrent = k`` and ``[resources] gpu = 1/k``, ``cpu = --cpus-per-trial``:
  Ray may place k trials on one GPU, and Tune starts all k at once;
- a fixed budget, ``--iterations`` (default 2000) with an evaluation every ``--eval-interval``
  (250), and ASHA's ``grace_period`` = the budget, so that no trial is stopped early;
- every searched field of the spec pinned to one value (the middle of its range, on a log scale
  for a log range; a categorical's first value), so every trial of every packing trains the same
  config and the packings differ only in how many trials share the GPU;
- ``max_failures = 0``: a trial that fails is reported, not retried into the timings.

The config's ``device`` is the spec's (``auto``): a trial trains on the GPU Tune assigned it. All
studies go to one temporary storage root (``--storage`` keeps them) and one new local Ray instance,
which `run_study` starts (``address="local"``: not a cluster some other process runs on this
machine, which a plain ``ray.init()`` would join). Per packing, from the study's history Parquet
(one row per trial per report):

- trials at once: the most trials whose [start, end] intervals overlap, where a trial's end is
  the ``timestamp`` of its last report and its start that minus its last ``time_total_s``
  (``timestamp`` is whole seconds: the intervals are good to about a second); and the mean
  number running (the trials' summed durations over the span from first start to last end);
- aggregate it/s: all trials' training iterations over that span; its ratio to packing 1's,
  the baseline measured in the same run (packing 1 is always run, first);
- per trial, the median of iterations / ``time_total_s`` (end to end: building the Trainer,
  training, evaluating, Tune's checkpoint and report) and of iterations / the Trainer's own
  ``time_s`` (training only);
- the study's wall time (the `run_study` call), the devices and the ``gpu_ids`` Ray gave.

First, untimed, a one-trial study starts Ray and puts the compiled training step in the cache
the trials share (``--no-warmup`` skips it), so that packing 1 pays neither alone.

On a GPU machine (one GPU for the figures to mean "trials per GPU")::

    .venv/bin/python bench/gpu_packing.py [--packings 1,2,4,8] [--iterations 2000]
        [--eval-interval 250] [--cpus-per-trial 1] [--out packing.json] [--storage DIR]

Without a GPU the script refuses to run, unless told to fake one: ``--fake-gpus N`` starts Ray
itself with N GPUs it does not have (``ray.init(num_gpus=N)``), torch finds no CUDA and trains on
the CPU. That checks the script end to end; its figures say nothing about GPUs::

    .venv/bin/python bench/gpu_packing.py --fake-gpus 1 --quick --packings 1,2

``--quick`` is a 200-iteration budget with an evaluation every 50.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd

from study.spec.spec import Dimension, StudySpec, load_spec, parse_spec, to_toml
from study.storage.storage import read_study_table

SPEC = "parity"


# -- the study of one packing -------------------------------------------------------------------
def _pinned(dim: Dimension) -> Any:
    """One value of a searched dimension: a categorical's first, else the middle of the range."""
    if dim.categorical:
        assert dim.values is not None
        return dim.values[0]
    assert dim.low is not None and dim.high is not None
    mid = math.sqrt(dim.low * dim.high) if dim.log else (dim.low + dim.high) / 2
    return round(mid) if dim.integer else float(f"{mid:.4g}")


def packing_spec(k: int, args: argparse.Namespace, storage: str, name: str | None = None) -> StudySpec:
    """The parity spec as a k-trials-per-GPU study under ``storage``."""
    base = load_spec(SPEC)
    doc = tomllib.loads(base.source)
    doc["description"] = f"bench/gpu_packing.py: {k} parity trials at gpu = 1/{k}"
    doc["config"] = {**doc.get("config", {}), "iterations": args.iterations}
    doc["config"]["eval_interval"] = args.eval_interval
    doc["space"] = {d.name: {"values": [_pinned(d)]} for d in base.space}
    doc["search"] = {**doc.get("search", {}), "num_samples": k, "max_concurrent": k}
    doc["scheduler"] = {**doc.get("scheduler", {}), "grace_period": args.iterations}
    doc["resources"] = {"cpu": args.cpus_per_trial, "gpu": 1 / k}
    doc["run"] = {"storage": storage, "max_failures": 0}
    return parse_spec(to_toml(doc), name or f"gpu-packing-{k}")


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that hold one instant (an interval ending where another starts: not both)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])  # ends first
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def figures(k: int, history: pd.DataFrame, trials: pd.DataFrame, wall_s: float) -> dict[str, Any]:
    """The packing's figures from its study's Parquet (see the module docstring)."""
    last = history.sort_values(["trial_id", "report"]).groupby("trial_id").tail(1)
    # seconds since the epoch: ``timestamp`` is a UTC datetime column in the Parquet
    end = (last["timestamp"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    start = end - last["time_total_s"]
    span = float(end.max() - start.min())
    iterations = last["iteration"].astype(float)
    devices = sorted({str(d) for d in history["device"].dropna()})
    gpu_ids = sorted({str(g) for g in history["gpu_ids"].dropna() if str(g)})
    return {
        "packing": k,
        "gpu_per_trial": 1 / k,
        "trials": len(trials),
        "statuses": trials["status"].value_counts().to_dict(),
        "at_once": max_overlap(list(zip(start, end, strict=True))),
        "mean_running": float((end - start).sum() / span) if span > 0 else float("nan"),
        "wall_s": wall_s,
        "span_s": span,
        "iterations": int(iterations.sum()),
        "aggregate_ips": float(iterations.sum() / span) if span > 0 else float("nan"),
        "trial_ips": statistics.median(iterations / last["time_total_s"]),
        "trial_train_ips": statistics.median(iterations / last["time_s"]),
        "devices": devices,
        "gpu_ids": gpu_ids,
        "nodes": sorted({str(n) for n in history["node_ip"].dropna()}),
    }


def run_packing(k: int, args: argparse.Namespace, storage: str, name: str | None = None) -> dict[str, Any]:
    from study.run.runner import run_study

    spec = packing_spec(k, args, storage, name)
    start = time.perf_counter()
    outcome = run_study(spec, address="local", verbose=0)  # Ray starts on the first packing only
    wall_s = time.perf_counter() - start
    history = read_study_table(outcome.paths, "history").to_pandas()
    trials = read_study_table(outcome.paths, "trials").to_pandas()
    if outcome.statuses != {"completed": k}:
        errors = "; ".join(str(e) for e in trials["error"].dropna())
        raise RuntimeError(f"packing {k}: trials ended {outcome.statuses}, not all completed: {errors}")
    return figures(k, history, trials, wall_s)


# -- output -------------------------------------------------------------------------------------
def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'packing':>7} {'gpu/trial':>9} {'trials':>6} {'at once':>7} {'mean run':>8} {'wall s':>7} "
        f"{'span s':>7} {'agg it/s':>9} {'x alone':>7} {'trial it/s':>10} {'train it/s':>10}  "
        "gpu_ids  device"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['packing']:>7} {r['gpu_per_trial']:>9.3g} {r['trials']:>6} {r['at_once']:>7} "
            f"{r['mean_running']:>8.2f} {r['wall_s']:>7.1f} {r['span_s']:>7.1f} {r['aggregate_ips']:>9.1f} "
            f"{r['ratio']:>7.2f} {r['trial_ips']:>10.1f} {r['trial_train_ips']:>10.1f}  "
            f"{','.join(r['gpu_ids']) or '-':7s}  {'; '.join(r['devices'])}"
        )


def conclusion(rows: list[dict[str, Any]], fake: bool) -> str:
    best = max(rows, key=lambda r: r["aggregate_ips"])
    on_gpu = all(d.startswith("cuda") for r in rows for d in r["devices"])
    line = (
        f"best packing {best['packing']} (gpu = {best['gpu_per_trial']:.3g}): {best['at_once']} trials at "
        f"once, {best['aggregate_ips']:.0f} it/s in all = {best['ratio']:.2f}x one trial alone "
        f"({rows[0]['aggregate_ips']:.0f} it/s)"
    )
    if not on_gpu:
        why = "fake GPUs, " if fake else ""
        line += f" [{why}trials trained on the CPU: a check that the script works, not a GPU figure]"
    return line


# -- main ---------------------------------------------------------------------------------------
def parse_packings(text: str) -> list[int]:
    try:
        packings = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers like 1,2,4,8, got {text!r}") from None
    if not packings or min(packings) < 1:
        raise argparse.ArgumentTypeError(f"packings must be >= 1, got {text!r}")
    return [1, *(p for p in dict.fromkeys(packings) if p != 1)]  # the baseline first, once


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--packings", type=parse_packings, default=[1, 2, 4, 8], help="trials per GPU (1 is always run)"
    )
    parser.add_argument("--iterations", type=int, help="training iterations per trial (2000; quick 200)")
    parser.add_argument("--eval-interval", type=int, help="iterations between evaluations (250; quick 50)")
    parser.add_argument("--cpus-per-trial", type=float, default=1.0, help="[resources] cpu of a trial")
    parser.add_argument("--fake-gpus", type=int, help="start Ray with N GPUs it does not have (CPU check)")
    parser.add_argument("--quick", action="store_true", help="a 200-iteration budget, for a smoke check")
    parser.add_argument("--storage", help="keep the studies under this root (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the untimed one-trial study that first starts Ray and fills the compile cache",
    )
    args = parser.parse_args()
    if args.iterations is None:
        args.iterations = 200 if args.quick else 2000
    if args.eval_interval is None:
        args.eval_interval = 50 if args.quick else 250

    import torch

    if not torch.cuda.is_available() and not args.fake_gpus:
        print(
            "gpu_packing.py: error: no GPU visible to torch; pass --fake-gpus N to check the script on a CPU",
            file=sys.stderr,
        )
        sys.exit(2)

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" per packing
    if args.fake_gpus:
        import ray

        # run_study finds Ray up and uses it as it is
        ray.init(
            address="local",  # a new instance, never a cluster another process started here
            num_gpus=args.fake_gpus,
            num_cpus=os.cpu_count(),
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
        print(f"fake GPUs: Ray told of {args.fake_gpus}, torch sees none: figures check the script only")
    else:
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        print(f"GPUs visible: {len(names)} ({', '.join(names)})")
    cpus = os.cpu_count() or 1
    print(
        f"spec {SPEC!r}, {args.iterations} iterations (evaluation every {args.eval_interval}), "
        f"{args.cpus_per_trial:g} CPU a trial, {cpus} CPUs here, packings {args.packings}"
    )
    too_many = [k for k in args.packings if k * args.cpus_per_trial > cpus]
    if too_many:
        print(f"note: packings {too_many} ask for more CPUs than this machine has: fewer run at once")

    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_packing.") as tmp:
        storage = args.storage or tmp
        if not args.no_warmup:
            # untimed: Ray's start and the first compile (12 s cold on an H200, 1.6 s from the
            # cache) would otherwise land on packing 1 alone and inflate every ratio against it
            warm = run_packing(1, args, storage, "gpu-packing-warmup")
            print(f"  warm-up (untimed): 1 trial, study {warm['wall_s']:.1f} s")
        for k in args.packings:
            row = run_packing(k, args, storage)
            row["ratio"] = row["aggregate_ips"] / (rows[0] if rows else row)["aggregate_ips"]
            rows.append(row)
            print(
                f"  packing {k}: {row['at_once']} of {row['trials']} trials at once, "
                f"{row['aggregate_ips']:.1f} it/s in all, study {row['wall_s']:.1f} s"
            )
    print(f"--- {len(rows)} studies in {time.perf_counter() - start:.0f} s")
    print_table(rows)
    line = conclusion(rows, bool(args.fake_gpus))
    print(line)
    if args.out:
        report = {
            "spec": SPEC,
            "iterations": args.iterations,
            "eval_interval": args.eval_interval,
            "cpus_per_trial": args.cpus_per_trial,
            "fake_gpus": args.fake_gpus,
            "baseline_aggregate_ips": rows[0]["aggregate_ips"],
            "packings": rows,
            "conclusion": line,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"figures written to {args.out}")


if __name__ == "__main__":
    main()
