"""The same search four ways: ponder-study, ponder-study fused, plain Ray Tune, plain Optuna; which
answers first?

One search, run by each in its own process, the order alternating over ``--rounds``:

- ponder-study: the real command (``ponder-study run`` of a spec written for the bench);
- ponder-study fused: the same spec with ``[resources] fuse = --fuse`` (a fused group of that many
  trials per CPU of ``--at-once``, so ``--fuse`` times as many trials at once; ``--fuse 1`` leaves
  this peer out);
- plain Tune: a `Tuner` whose trainable runs the same `ponder.trainer.Trainer` and reports at
  the same interval, `OptunaSearch` (TPE, same seed, same space, same startup trials),
  `ASHAScheduler` (same grace period, same reduction factor, over the model's iteration), the
  default `RunConfig` (Tune's own loggers; no checkpoint, as a plain trainable reports none:
  ponder-study alone pays for one at every report);
- plain Optuna: ``study.optimize`` with TPE (same seed and startup), `SuccessiveHalvingPruner`
  (``min_resource`` = the grace period, same reduction factor: the rungs ASHA uses), ``n_jobs``
  = the trials at once, the Trainer in-process with one torch thread per trial, its reports as
  ``trial.report``.

The differences that remain, stated: Optuna prunes synchronously within its own threads (one
process, the GIL shared) and its pruner compares against all trials at a rung, ASHA against
those that reached it so far; Tune and ponder-study run each trial in a worker process.

For each: wall time from launch to exit, the machine's busy CPU meanwhile (``/proc/stat``: Ray's
daemons and workers included), trials started and stopped early, iterations trained, the best
``test/halted_accuracy``, and the time from launch until a report first came within 0.005 of the
best any of the three reached (the time to the answer), and until one first reached ``--target``
(0.99); ``first s`` is the time to the first report of all, the start-up before any trial has
trained ``--eval-interval``; ``s/report`` how fast a trial trains (`_pace`). Report times are
to the ms: the plain peers take them in the trial as it reports, ponder-study's come from its
TensorBoard events as the driver receives each report (Tune's own ``timestamp`` is whole seconds).
``--dump`` keeps every report for a closer look. Last line: ``ratio <ponder-study's median time
to the target / the fastest peer's>`` (the plain peers; the line before it, ``fused``, is ponder-study
fused's against ponder-study's); the time to the answer where a peer missed the target.
With asynchronous early stopping the trials that run to the end differ from run to run, so the
best of a run moves by about 0.005: a fixed target is the steadier answer.

    .venv/bin/python bench/peers.py                               # 16 trials x 2,000 iterations
    .venv/bin/python bench/peers.py --n-elems 8                   # a search that learns in that budget
    .venv/bin/python bench/peers.py --n-elems 5 --trials 200 --iterations 300 --eval-interval 50 \
        --grace 100 --target 0.9                                  # many short trials that learn
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OBJECTIVE = "test/halted_accuracy"
TOLERANCE = 0.005
SPACE = {"lambda_p": (0.05, 0.9, False), "beta": (1e-4, 0.1, True), "max_steps": (4, 20, None)}
"""The shipped `parity` spec's space: (low, high, log); None marks an integer."""


def _spec(a: argparse.Namespace, fuse: int = 1) -> str:
    space = "\n".join(
        f"[space.{k}]\nlow = {lo}\nhigh = {hi}\n" + ("log = true\n" if log else "")
        for k, (lo, hi, log) in SPACE.items()
    )
    return textwrap.dedent(f"""\
        description = "bench/peers.py: the search the three peers run"
        task = "parity"

        [config]
        n_elems = {a.n_elems}
        batch_size = 128
        n_hidden = 64
        iterations = {a.iterations}
        eval_interval = {a.eval_interval}

        {space}
        [search]
        sampler = "tpe"
        seed = {a.seed}
        num_samples = {a.trials}
        max_concurrent = {a.at_once * fuse}

        [scheduler]
        metric = "{OBJECTIVE}"
        mode = "max"
        grace_period = {a.grace}
        reduction_factor = {a.reduction}
        brackets = 1

        [resources]
        cpu = 1
        gpu = 0
        fuse = {fuse}
        """)


# The plain peers: scripts a user would write, run as `python -c` with the bench's settings in argv.
_COMMON = """
import json, sys, time
settings = json.loads(sys.argv[1])
SPACE = settings["space"]
def config(params):
    from ponder.config import ParityConfig
    return ParityConfig(n_elems=settings["n_elems"], iterations=settings["iterations"],
                        eval_interval=settings["eval_interval"], device="cpu", compile="off", **params)
def startup(n):
    return max(2, min(10, n // 4))
"""

_TUNE = (
    _COMMON
    + """
import torch, ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch
import optuna

def trainable(params):
    torch.set_num_threads(1)
    from ponder.trainer import Trainer
    for m in Trainer(config(params)).run():
        tune.report({"iteration": m["iteration"], "acc": m["test/halted_accuracy"], "t": time.time()})

space = {k: (tune.randint(lo, hi + 1) if log is None else (tune.loguniform if log else tune.uniform)(lo, hi))
         for k, (lo, hi, log) in SPACE.items()}
sampler = optuna.samplers.TPESampler(seed=settings["seed"], n_startup_trials=startup(settings["trials"]))
search = ConcurrencyLimiter(OptunaSearch(sampler=sampler), max_concurrent=settings["at_once"])
asha = ASHAScheduler(time_attr="iteration", max_t=settings["iterations"], grace_period=settings["grace"],
                     reduction_factor=settings["reduction"])
ray.init(num_cpus=settings["at_once"], include_dashboard=False, log_to_driver=False)
grid = tune.Tuner(
    tune.with_resources(trainable, {"cpu": 1}), param_space=space,
    tune_config=tune.TuneConfig(search_alg=search, scheduler=asha, metric="acc", mode="max",
                                num_samples=settings["trials"]),
    run_config=tune.RunConfig(storage_path=settings["storage"], name="peers", verbose=0),
).fit()
reports = []
for r in grid:
    df = r.metrics_dataframe
    for _, row in df.iterrows():
        reports.append({"trial": r.path, "iteration": int(row["iteration"]), "acc": float(row["acc"]),
                        "t": float(row["t"])})
json.dump(reports, open(settings["out"], "w"))
"""
)

_OPTUNA = (
    _COMMON
    + """
import torch, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
reports = []

def objective(trial):
    params = {k: (trial.suggest_int(k, lo, hi) if log is None else trial.suggest_float(k, lo, hi, log=log))
              for k, (lo, hi, log) in SPACE.items()}
    torch.set_num_threads(1)
    from ponder.trainer import Trainer
    value = 0.0
    for m in Trainer(config(params)).run():
        value = m["test/halted_accuracy"]
        reports.append({"trial": trial.number, "iteration": m["iteration"], "acc": value, "t": time.time()})
        trial.report(value, m["iteration"])
        if trial.should_prune():
            raise optuna.TrialPruned()
    return value

sampler = optuna.samplers.TPESampler(seed=settings["seed"], n_startup_trials=startup(settings["trials"]))
pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=settings["grace"],
                                                reduction_factor=settings["reduction"])
study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
study.optimize(objective, n_trials=settings["trials"], n_jobs=settings["at_once"])
json.dump(reports, open(settings["out"], "w"))
"""
)


def _machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (user, nice, system, irq), from /proc/stat:
    Ray's daemons and workers are no waited-for children, so rusage misses them."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _run(command: list[str], env: dict[str, str]) -> tuple[float, float, float, int]:
    """(launch time, wall s, the machine's busy CPU s meanwhile, exit code). Run the bench on
    a quiet machine: the CPU figure counts every process (what else runs is in it too)."""
    before = _machine_cpu_s()
    t0 = time.time()
    rc = subprocess.run(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    ).returncode
    wall = time.time() - t0
    return t0, wall, _machine_cpu_s() - before, rc


def _tensorboard_reports(trial_dir: Path) -> list[dict[str, Any]]:
    """A ponder-study trial's reports of the objective, timed to the ms from its TensorBoard events
    (written by the driver as each report arrives). Tune stamps a report with whole seconds only
    (its ``timestamp``, the Parquet's), which would favour ponder-study by half a second."""
    import struct

    from tensorboardX.proto import event_pb2  # type: ignore[import-untyped]

    reports = []
    for f in trial_dir.glob("events.out.tfevents*"):
        data, at = f.read_bytes(), 0
        while at + 12 <= len(data):  # TFRecord: length u64, its CRC u32, the Event, its CRC u32
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for v in event.summary.value:
                if v.tag == f"ray/tune/{OBJECTIVE}":
                    row = {"trial": trial_dir.name, "iteration": event.step, "acc": v.simple_value}
                    reports.append({**row, "t": event.wall_time})
    return reports


def _ponder_study(a: argparse.Namespace, where: Path, env: dict[str, str], fuse: int = 1) -> dict[str, Any]:
    spec = where / "peers.toml"
    spec.write_text(_spec(a, fuse))
    storage = where / "ponder"
    t0, wall, cpu, rc = _run(
        [sys.executable, "-m", "study", "run", str(spec), "--storage", str(storage), "--quiet"], env
    )
    import pandas as pd

    table = pd.read_parquet(storage / "trials" / "study=peers")
    trial_dirs = [d for d in (storage / "tune" / "peers").iterdir() if d.is_dir()]
    reports = [r for d in trial_dirs for r in _tensorboard_reports(d)]
    stopped = int((table["status"] == "early_stopped").sum())
    return {"t0": t0, "wall": wall, "cpu": cpu, "rc": rc, "reports": reports, "stopped": stopped}


def _plain(code: str, a: argparse.Namespace, where: Path, env: dict[str, str], name: str) -> dict[str, Any]:
    out = where / f"{name}.json"
    settings = {**vars(a), "dump": None, "space": SPACE, "storage": str(where / name), "out": str(out)}
    t0, wall, cpu, rc = _run([sys.executable, "-c", code, json.dumps(settings)], env)
    reports = json.loads(out.read_text()) if out.exists() else []
    last: dict[Any, int] = {}
    for r in reports:
        last[r["trial"]] = max(last.get(r["trial"], 0), r["iteration"])
    stopped = sum(1 for it in last.values() if it < a.iterations)
    return {"t0": t0, "wall": wall, "cpu": cpu, "rc": rc, "reports": reports, "stopped": stopped}


def _pace(reports: list[dict[str, Any]], a: argparse.Namespace) -> float:
    """The median wall time between a trial's consecutive reports (``--eval-interval`` iterations
    and an evaluation): how fast a trial trains while the others run beside it."""
    by: dict[Any, list[tuple[int, float]]] = {}
    for x in reports:
        by.setdefault(x["trial"], []).append((x["iteration"], x["t"]))
    gaps = sorted(
        t1 - t0
        for runs in map(sorted, by.values())
        for (i0, t0), (i1, t1) in itertools.pairwise(runs)
        if i1 - i0 == a.eval_interval
    )
    return gaps[len(gaps) // 2] if gaps else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--grace", type=int, default=500, help="ASHA's grace period and the pruner's min_resource")
    p.add_argument("--reduction", type=int, default=3)
    p.add_argument("--at-once", type=int, default=2, help="trials at once (n_jobs for Optuna)")
    p.add_argument(
        "--fuse", type=int, default=8, help="ponder-study fused's trials per group (1: no such peer)"
    )
    p.add_argument("--n-elems", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--target",
        type=float,
        default=0.99,
        help="a fixed answer: the time to the first report at or above it (the ratio's measure where "
        "every peer reaches it in every round, else the relative answer's)",
    )
    p.add_argument("--dump", type=Path, help="write every peer's runs, reports included, to this JSON file")
    p.add_argument(
        "--write-spec",
        type=Path,
        metavar="TOML",
        help="write the ponder-study spec of this search to TOML and exit (to profile its `run` alone)",
    )
    a = p.parse_args()
    if a.write_spec:
        a.write_spec.write_text(_spec(a))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    peers = {
        "ponder-study": lambda w: _ponder_study(a, w, env),
        "ponder-study fused": lambda w: _ponder_study(a, w, env, a.fuse),
        "plain Tune": lambda w: _plain(_TUNE, a, w, env, "tune"),
        "plain Optuna": lambda w: _plain(_OPTUNA, a, w, env, "optuna"),
    }
    if a.fuse <= 1:
        del peers["ponder-study fused"]
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in peers}
    for rnd in range(a.rounds):
        order = list(peers) if rnd % 2 == 0 else list(reversed(peers))
        for name in order:
            where = Path(tempfile.mkdtemp(prefix=f"peers-{name.replace(' ', '-')}-"))
            r = peers[name](where)
            results[name].append(r)
            print(f"round {rnd + 1}: {name}: exit {r['rc']}, wall {r['wall']:.1f} s", flush=True)
    if a.dump:
        a.dump.write_text(json.dumps(results, default=str))
    best = max(
        (x["acc"] for runs in results.values() for r in runs for x in r["reports"]), default=float("nan")
    )
    print(
        f"\nbest {OBJECTIVE} any peer reached: {best:.4f}; answer = within {TOLERANCE}; target = {a.target}"
    )
    columns = (("wall s", 9), ("CPU s", 9), ("trials", 8), ("stopped", 9))
    columns += (("iters", 9), ("best", 8), ("first s", 9), ("s/report", 10), ("answer s", 10))
    columns += ((f"{a.target} s", 9),)
    print(f"{'peer':<20}" + "".join(f"{c:>{w}}" for c, w in columns))
    median = {"answer": {}, "target": {}}
    for name, runs in results.items():
        times: dict[str, list[float]] = {"answer": [], "target": []}
        for r in runs:
            last: dict[Any, int] = {}
            for x in r["reports"]:
                last[x["trial"]] = max(last.get(x["trial"], 0), x["iteration"])
            for kind, bar in (("answer", best - TOLERANCE), ("target", a.target)):
                hits = [x["t"] - r["t0"] for x in r["reports"] if x["acc"] >= bar]
                times[kind].append(min(hits) if hits else float("inf"))
            top = max((x["acc"] for x in r["reports"]), default=float("nan"))
            first = min((x["t"] - r["t0"] for x in r["reports"]), default=float("nan"))  # start-up
            print(
                f"{name:<20}{r['wall']:>9.1f}{r['cpu']:>9.1f}{len(last):>8}{r['stopped']:>9}"
                f"{sum(last.values()):>9}{top:>8.3f}{first:>9.1f}{_pace(r['reports'], a):>10.2f}"
                f"{times['answer'][-1]:>10.1f}"
                f"{times['target'][-1]:>9.1f}"
            )
        for kind in times:
            median[kind][name] = sorted(times[kind])[len(times[kind]) // 2]  # the upper one of two
    kind = "target" if all(t < float("inf") for t in median["target"].values()) else "answer"
    by = median[kind]
    fastest_peer = min(v for k, v in by.items() if not k.startswith("ponder-study"))
    if "ponder-study fused" in by:
        print(
            f"fused {by['ponder-study fused'] / by['ponder-study']:.2f}  (ponder-study fused / ponder-study)"
        )
    ratio = by["ponder-study"] / fastest_peer
    print(f"ratio {ratio:.2f}  (median time to the {kind}: ponder-study / the fastest peer)")


if __name__ == "__main__":
    main()
