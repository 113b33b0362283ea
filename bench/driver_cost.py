"""What the study's driver costs a real trial, against plain Ray Tune and plain Optuna doing the same.

One run, one local Ray instance started by the bench (``--cpus``, default all); every driver is a
process of its own joined to it by ``RAY_ADDRESS``, and what is timed is that process's CPU (user +
system, `resource.getrusage` of the bench's children: the driver and anything it waits for, none of
the trials' work, which runs in Ray's workers) and its wall time. The trials are tiny parity trials
(4 iterations, an evaluation every 2: 2 reports with a checkpoint each; 0.25 CPU a trial, 8 at once),
each peer run at two sizes N1 < N2 (``--sizes``, default 60 300), one right after the other; a
figure is its cost an ADDED trial, (cost(N2) - cost(N1)) / (N2 - N1), so that start-up (imports,
Ray's join) drops out. Beside the wall, the trials' span (the first trial's start to the last one's
end, to the second: Tune's ``timestamp`` less ``time_total_s``, as the trials Parquet's
``started_at``), the wall without the start-up and the study's end. The peers:

- the study: ``ponder-study run <spec> --num-samples N`` (TPE seeded, ASHA grace 2 reduction 2,
  the spec written into the bench's temporary directory), progress table on, and with ``--quiet``;
  the trials Parquet read back for the statuses (a trial ASHA stops at its first rung reports once);
- plain Tune: a script a user would write, run the same way: a function trainable that builds the
  same `ponder.trainer.Trainer` from the same config and reports every evaluation with a checkpoint
  as ``study/run/trainable.py`` does, random search over the same space, ``max_concurrent_trials``
  8, reused actors, ``verbose=0``, no scheduler; with Tune's default loggers (JSON, CSV, TensorBoard),
  without any (``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``), and with ``--loggers`` each alone (its cost
  a trial: alone minus none); then with `OptunaSearch` (TPE, seed 0, in memory, default loggers): the
  peer of the study's wall;
- plain Optuna, no Ray, in a process of its own: TPE (seed 0, the study's startup trials), a journal
  file, per trial ask, 3 suggests, 2 reports, tell; its CPU (``time.process_time``) an added trial.

``--strace``: the study (progress on) run again at N2 under ``strace -f -c`` counting the fsync
family (fsync, fdatasync, syncfs, sync), per trial. ``--tpe-growth [N ...]`` (default 1000 3000
10000): Optuna's TPE in memory, prefilled with N complete trials over the same space, then 20 ask
(3 suggests) + tell timed (CPU ms each); RandomSampler at the largest N beside it. ``--rounds R``:
each peer R times at each size (the order reversed every other round), each size's median.
``--keep`` keeps the temporary directory (printed); ``--timeout`` bounds each process.

Costs, on 2 cores beside other jobs: 17 to 30 minutes with ``--strace --loggers --tpe-growth``,
``--quick`` (sizes 20 60, no strace, no TPE growth) 8 to 12; most of a run is the drivers' start-up.
There the wall and span move with the other jobs' load between a peer's two runs (an added trial's
can come out negative): read them from a quiet machine; the CPU figures hold better. Each figure
prints as it comes, then a summary; the last line: ``ratio <the study's driver CPU an added trial
(progress on) / (plain Tune, default loggers + plain Optuna)>``.

    .venv/bin/python bench/driver_cost.py [--sizes 60 300] [--strace] [--loggers] [--tpe-growth [N ...]]
        [--rounds 1] [--cpus N] [--timeout 900] [--keep]
    .venv/bin/python bench/driver_cost.py --quick
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OBJECTIVE = "test/halted_accuracy"
CONFIG = {
    "n_elems": 5,
    "n_hidden": 16,
    "batch_size": 32,
    "eval_samples": 200,
    "iterations": 4,
    "eval_interval": 2,
}
REPORTS = CONFIG["iterations"] // CONFIG["eval_interval"]
AT_ONCE = 8
CPU_A_TRIAL = 0.25

SPEC = f"""\
description = "bench/driver_cost.py: tiny parity trials, the driver's cost a trial"
task = "parity"

[config]
{chr(10).join(f"{k} = {v}" for k, v in CONFIG.items())}

[space.lambda_p]
low = 0.05
high = 0.9

[space.beta]
low = 1e-4
high = 0.1
log = true

[space.max_steps]
low = 2
high = 8

[search]
sampler = "tpe"
seed = 0
num_samples = 10
max_concurrent = {AT_ONCE}

[scheduler]
metric = "{OBJECTIVE}"
mode = "max"
grace_period = 2
reduction_factor = 2
brackets = 1

[resources]
cpu = {CPU_A_TRIAL}
gpu = 0

[run]
storage = "results"
max_failures = 0
"""

# Plain Ray Tune, as a user would write it: the settings come as JSON in argv[1].
TUNE_SCRIPT = f"""\
import json, math, sys, tempfile
from pathlib import Path

import ray
from ray import tune

s = json.loads(sys.argv[1])
OBJECTIVE = "{OBJECTIVE}"


def trainable(config):
    import torch
    from ponder.compiled import forget_compiled
    from ponder.config import config_from_dict, stored_config
    from ponder.trainer import Trainer, device_label

    torch.set_num_threads(1)
    forget_compiled()
    trainer = Trainer(config_from_dict(stored_config(config)))
    where = {{
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpu_ids": ",".join(str(i) for i in ray.get_gpu_ids()),
        "device": device_label(trainer.device),
    }}
    for m in trainer.run():
        finite = {{k: ([x if math.isfinite(x) else None for x in v] if isinstance(v, list) else v)
                  for k, v in m.items() if not (isinstance(v, float) and not math.isfinite(v))}}
        finite.setdefault(OBJECTIVE, -1e9)
        with tempfile.TemporaryDirectory() as d:
            trainer.save(Path(d) / "trainer.pt")
            tune.report({{**finite, **where}}, checkpoint=tune.Checkpoint.from_directory(d))


space = {{"task": "parity", **s["config"], "lambda_p": tune.uniform(0.05, 0.9),
         "beta": tune.loguniform(1e-4, 0.1), "max_steps": tune.randint(2, 9)}}
search = None
if s["search"] == "optuna":
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    search = OptunaSearch(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=s["startup"]))
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

loggers = {{"json": JsonLoggerCallback, "csv": CSVLoggerCallback, "tbx": TBXLoggerCallback}}
callbacks = [loggers[s["loggers"]]()] if s["loggers"] in loggers else None
ray.init(log_to_driver=False, logging_level=40)  # ERROR
grid = tune.Tuner(
    tune.with_resources(trainable, {{"cpu": s["cpu"], "gpu": 0}}),
    param_space=space,
    tune_config=tune.TuneConfig(
        search_alg=search, metric=OBJECTIVE if search else None, mode="max" if search else None,
        num_samples=s["n"], max_concurrent_trials=s["at_once"], reuse_actors=True,
    ),
    run_config=tune.RunConfig(
        name="plain", storage_path=s["storage"], verbose=0, callbacks=callbacks,
        failure_config=tune.FailureConfig(max_failures=0),
    ),
).fit()
# the trials' span: the first one's start (its last report's time less its time_total_s) to the last end
ends = [(r.metrics["timestamp"], r.metrics["timestamp"] - r.metrics["time_total_s"]) for r in grid]
span = max(e for e, _ in ends) - min(s for _, s in ends)
print(json.dumps({{"trials": len(grid), "errors": grid.num_errors, "span": span}}))
"""

# (label, kind, its settings); kind "study" or "tune"
PEERS: list[tuple[str, str, dict[str, Any]]] = [
    ("study, progress on", "study", {"quiet": False}),
    ("study, --quiet", "study", {"quiet": True}),
    ("plain Tune, default loggers", "tune", {"search": "random", "loggers": "default"}),
    ("plain Tune, no loggers", "tune", {"search": "random", "loggers": "none"}),
    ("plain Tune + OptunaSearch", "tune", {"search": "optuna", "loggers": "default"}),
]
LOGGERS: list[tuple[str, str, dict[str, Any]]] = [
    (f"plain Tune, {name} logger alone", "tune", {"search": "random", "loggers": key})
    for key, name in (("json", "JSON"), ("csv", "CSV"), ("tbx", "TensorBoard"))
]


class Failed(RuntimeError):
    """A process of the bench failed or ran past its time: what it was, and its stderr's tail."""


def _tail(text: str | bytes | None, chars: int = 2000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "").strip()[-chars:]


def timed(label: str, cmd: list[str], env: dict[str, str], timeout: float) -> tuple[float, float, str]:
    """Run ``cmd``: (its CPU s with its children's, its wall s, its stdout); `Failed` when it exits
    non-zero or runs past ``timeout``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise Failed(f"{label}: ran past {timeout:.0f} s; its stderr ended:\n{_tail(e.stderr)}") from None
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise Failed(f"{label}: exit {done.returncode}; its stderr ended:\n{_tail(done.stderr)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.stdout.decode(errors="replace")


def _study_cmd(tmp: Path, n: int, quiet: bool, tag: str) -> tuple[list[str], Path, str]:
    storage, name = tmp / f"study-{tag}-{n}", f"cost{n}"
    cmd = [sys.executable, "-m", "study", "run", str(tmp / "driver_cost.toml"), "--name", name]
    cmd += ["--num-samples", str(n), "--storage", str(storage)] + (["--quiet"] if quiet else [])
    return cmd, storage, name


def run_peer(
    label: str,
    kind: str,
    settings: dict[str, Any],
    n: int,
    tmp: Path,
    env: dict[str, str],
    timeout: float,
    rnd: int = 0,
) -> dict[str, Any]:
    """One peer at size ``n``: its driver's CPU and wall, and what its trials ended as."""
    env = {k: v for k, v in env.items() if k != "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"}
    tag = label.replace(",", "").replace(" ", "-").replace("+", "") + f"-{rnd}"
    if kind == "study":
        cmd, storage, name = _study_cmd(tmp, n, settings["quiet"], tag)
        cpu, wall, _ = timed(f"{label}, N={n}", cmd, env, timeout)
        import pandas as pd

        table = pd.read_parquet(storage / "trials" / f"study={name}")
        ended = {str(k): int(v) for k, v in table["status"].value_counts().items()}
        span = (table["ended_at"].max() - table["started_at"].min()).total_seconds()
    else:
        from study.search.search import tpe_startup_trials

        if settings["loggers"] != "default":
            env["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
        from ponder.config import CONFIGS

        # the config the study's trials get: the spec's, and the data stream `run_study` pins
        config = {**CONFIG, "data_stream": CONFIGS["parity"]().data_stream}
        knobs = {**settings, "n": n, "config": config, "cpu": CPU_A_TRIAL, "at_once": AT_ONCE}
        knobs |= {"startup": tpe_startup_trials(n), "storage": str(tmp / f"tune-{tag}-{n}")}
        cmd = [sys.executable, str(tmp / "plain_tune.py"), json.dumps(knobs)]
        cpu, wall, out = timed(f"{label}, N={n}", cmd, env, timeout)
        grid = json.loads(out.strip().splitlines()[-1])
        if grid["errors"] or grid["trials"] != n:
            raise Failed(f"{label}, N={n}: {grid['trials']} trials, {grid['errors']} errored")
        ended, span = {"trials": grid["trials"]}, grid["span"]
    share = f"{cpu / wall:.0%} of a core"  # near 100%: the driver's thread set the pace
    print(
        f"{label}, N={n}: driver CPU {cpu:.2f} s, wall {wall:.1f} s ({share}), trials' span {span:.0f} s; "
        f"{ended}",
        flush=True,
    )
    return {"cpu": cpu, "wall": wall, "span": span}


def fsyncs(tmp: Path, n: int, env: dict[str, str], timeout: float) -> tuple[float, str]:
    """The study (progress on) at ``n`` under strace: fsync-family calls a trial, and each call's count."""
    cmd, _, _ = _study_cmd(tmp, n, False, "strace")
    counts = tmp / "strace.txt"
    trace = ["strace", "-f", "--seccomp-bpf", "-e", "trace=fsync,fdatasync,syncfs,sync", "-c"]
    timed(f"study under strace, N={n}", [*trace, "-o", str(counts), *cmd], env, timeout)
    calls: dict[str, int] = {}
    for line in counts.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in ("fsync", "fdatasync", "syncfs", "sync", "total"):
            calls[fields[-1]] = int(fields[3])
    total = calls.pop("total", 0)
    return total / n, ", ".join(f"{k} {v}" for k, v in calls.items()) or "none"


# -- plain Optuna, in a process of its own (``--worker``) ---------------------------------------------
def _suggest(trial: Any) -> None:
    trial.suggest_float("lambda_p", 0.05, 0.9)
    trial.suggest_float("beta", 1e-4, 0.1, log=True)
    trial.suggest_int("max_steps", 2, 8)


def optuna_cpu(n: int, startup: int, journal: str) -> float:
    """CPU s of a TPE study of ``n`` trials in a journal file: ask, 3 suggests, the reports, tell."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    rng = random.Random(0)
    start = time.process_time()
    study = optuna.create_study(
        study_name="plain",
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=startup),
        storage=optuna.storages.JournalStorage(JournalFileBackend(journal)),
    )
    for _ in range(n):
        trial = study.ask()
        _suggest(trial)
        for report in range(REPORTS):
            trial.report(rng.random(), (report + 1) * CONFIG["eval_interval"])
        study.tell(trial, rng.random())
    return time.process_time() - start


def ask_cost(sampler: Any, n: int, asks: int = 20) -> float:
    """CPU ms of one ask (3 suggests) + tell in an in-memory study that holds ``n`` complete trials."""
    import optuna
    from optuna.distributions import FloatDistribution, IntDistribution

    dists = {
        "lambda_p": FloatDistribution(0.05, 0.9),
        "beta": FloatDistribution(1e-4, 0.1, log=True),
        "max_steps": IntDistribution(2, 8),
    }
    rng = random.Random(1)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.add_trials(
        optuna.trial.create_trial(
            params={
                "lambda_p": rng.uniform(0.05, 0.9),
                "beta": 10 ** rng.uniform(-4, -1),
                "max_steps": rng.randint(2, 8),
            },
            distributions=dists,
            value=rng.random(),
        )
        for _ in range(n)
    )
    start = time.process_time()
    for _ in range(asks):
        trial = study.ask()
        _suggest(trial)
        study.tell(trial, rng.random())
    return (time.process_time() - start) / asks * 1e3


def worker(what: str, argv: list[str]) -> None:
    """``--worker optuna N1 STARTUP1 N2 STARTUP2 DIR`` or ``--worker tpe N STARTUP ...``: a JSON line."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if what == "optuna":
        n1, s1, n2, s2 = map(int, argv[:4])
        out: Any = [
            optuna_cpu(n, s, os.path.join(argv[4], f"journal-{n}.log")) for n, s in ((n1, s1), (n2, s2))
        ]
    else:
        pairs = [(int(argv[i]), int(argv[i + 1])) for i in range(0, len(argv), 2)]
        out = [
            ["tpe", n, ask_cost(optuna.samplers.TPESampler(seed=0, n_startup_trials=s), n)] for n, s in pairs
        ]
        out.append(["random", pairs[-1][0], ask_cost(optuna.samplers.RandomSampler(seed=0), pairs[-1][0])])
    print(json.dumps(out))


def run_worker(args: list[str], timeout: float) -> Any:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", *args]
    _, _, out = timed(f"worker {args[0]}", cmd, {**os.environ}, timeout)
    return json.loads(out.strip().splitlines()[-1])


# -- the run ------------------------------------------------------------------------------------------
def per_added(rows: dict[int, list[dict[str, Any]]], n1: int, n2: int, key: str) -> float:
    """ms an added trial between N1 and N2, each size's median over the rounds."""
    at = {n: statistics.median(r[key] for r in rows[n]) for n in (n1, n2)}
    return (at[n2] - at[n1]) / (n2 - n1) * 1e3


def measure_ray(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The study and plain Tune, every driver joined to one local Ray instance; strace's count."""
    import ray

    from study.launchers.ray_token import private_token

    private_token()  # as the study does before a local instance: the token its owner's alone
    ray.init(
        address="local",
        num_cpus=args.cpus,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        _system_config={"prestart_worker_first_driver": False},  # this driver runs no tasks
    )
    try:
        address = ray.get_runtime_context().gcs_address
        env = {**os.environ, "RAY_ADDRESS": address}
        print(f"one local Ray instance ({address}, {args.cpus} CPUs); {AT_ONCE} trials at once", flush=True)
        peers = PEERS + (LOGGERS if args.loggers else [])
        rows: dict[str, dict[int, list[dict[str, Any]]]] = {
            lbl: {n: [] for n in args.sizes} for lbl, _, _ in peers
        }
        # a peer's two sizes one after the other, so that its difference sees one load; the order
        # reversed every other round, so that drift spreads evenly
        for rnd in range(args.rounds):
            for label, kind, settings in peers[:: -1 if rnd % 2 else 1]:
                for n in args.sizes[:: -1 if rnd % 2 else 1]:
                    rows[label][n].append(run_peer(label, kind, settings, n, tmp, env, args.timeout, rnd))
        n1, n2 = args.sizes
        cost = {}
        for label in rows:
            cpu, wall, span = (per_added(rows[label], n1, n2, k) for k in ("cpu", "wall", "span"))
            cost[label] = {"cpu": cpu, "wall": wall, "span": span}
            print(
                f"{label}: driver CPU {cpu:.1f} ms an added trial, wall {wall:.1f} ms, "
                f"span {span:.1f} ms (N={n1} to {n2})"
            )
        fsync = None
        if args.strace:
            try:
                fsync = fsyncs(tmp, n2, env, 2 * args.timeout)
                print(f"fsyncs: {fsync[0]:.1f} a trial over a study of {n2} trials ({fsync[1]})")
            except Failed as e:
                print(f"fsyncs: not counted: {e}")
        return {"cost": cost, "fsync": fsync}
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs=2, default=[60, 300], metavar=("N1", "N2"))
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="the Ray instance's CPUs")
    parser.add_argument("--strace", action="store_true", help="count the study's fsyncs at N2")
    parser.add_argument("--loggers", action="store_true", help="each of Tune's default loggers alone")
    parser.add_argument(
        "--tpe-growth", type=int, nargs="*", metavar="N", help="TPE's ask at N past trials (1000 3000 10000)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each peer at each size (median)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for each process (default 900)")
    parser.add_argument("--quick", action="store_true", help="sizes 20 60, no strace, no TPE growth")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (printed)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1:])
        return
    if args.quick:
        args.sizes, args.strace, args.tpe_growth = [20, 60], False, None
    n1, n2 = args.sizes
    if not 0 < n1 < n2:
        parser.error(f"--sizes {n1} {n2}: two sizes, the first smaller (e.g. --sizes 60 300)")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: one round or more")
    if args.strace and shutil.which("strace") is None:
        parser.error("--strace: no strace on PATH; install it (apt-get install strace) or leave the flag out")
    growth = None if args.tpe_growth is None else sorted(args.tpe_growth or [1000, 3000, 10000])
    os.environ["RAY_AUTH_MODE"] = "token"  # read when Ray is imported; drivers joining by address need it
    from study.search.search import tpe_startup_trials

    tmp = Path(tempfile.mkdtemp(prefix="driver_cost."))
    (tmp / "driver_cost.toml").write_text(SPEC)
    (tmp / "plain_tune.py").write_text(TUNE_SCRIPT)
    print(
        f"tiny parity trials ({CONFIG['iterations']} iterations, {REPORTS} reports with a checkpoint), "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores "
        "(the figures move with the machine's load)",
        flush=True,
    )
    try:
        ray_part = measure_ray(args, tmp)
        cost = ray_part["cost"]
        startup = [str(x) for n in args.sizes for x in (n, tpe_startup_trials(n))]
        c1, c2 = run_worker(["optuna", *startup, str(tmp)], args.timeout)
        optuna_ms = (c2 - c1) / (n2 - n1) * 1e3
        print(f"plain Optuna (TPE, journal file): N={n1} {c1:.2f} s, N={n2} {c2:.2f} s of CPU")
        print(f"plain Optuna: CPU {optuna_ms:.1f} ms an added trial (N={n1} to {n2})", flush=True)
        tpe: list[list[Any]] = []
        if growth:
            try:
                tpe = run_worker(
                    ["tpe", *(str(x) for n in growth for x in (n, tpe_startup_trials(n)))], 4 * args.timeout
                )
            except Failed as e:
                print(f"TPE's growth: not measured: {e}")
            for sampler, n, ms in tpe:
                print(f"{sampler} ask (3 suggests) + tell at N={n} past trials: {ms:.1f} ms of CPU")
    except Failed as e:
        sys.exit(f"driver_cost: {e}")
    finally:
        if args.keep:
            print(f"the bench's files are in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    study, quiet = cost["study, progress on"], cost["study, --quiet"]
    tune_default, tune_none = cost["plain Tune, default loggers"], cost["plain Tune, no loggers"]
    peers = tune_default["cpu"] + optuna_ms
    print(
        f"\nsummary: an added trial, N={n1} to {n2}: driver CPU (its process and children), wall (its "
        "process), span (the first trial's start to the last's end)"
    )
    for label, c in cost.items():
        extra = ""
        if label in {lbl for lbl, _, _ in LOGGERS}:
            extra = f" ({c['cpu'] - tune_none['cpu']:+.1f} ms over no loggers)"
        print(f"  {label}: CPU {c['cpu']:.1f} ms{extra}, wall {c['wall']:.1f} ms, span {c['span']:.1f} ms")
    print(f"  plain Optuna (TPE, journal): CPU {optuna_ms:.1f} ms")
    print(f"  plain Tune's default loggers: {tune_default['cpu'] - tune_none['cpu']:.1f} ms of CPU a trial")
    if len(tpe) > 1:
        tpes = [(n, ms) for sampler, n, ms in tpe if sampler == "tpe"]
        (na, ma), (nb, mb) = tpes[0], tpes[-1]
        slope = (mb - ma) / (nb - na) * 1e3
        print(
            f"  TPE's ask + tell: {mb:.1f} ms at N={nb}, {slope:.1f} us a past trial; "
            f"random {tpe[-1][2]:.2f} ms"
        )
    if ray_part["fsync"] is not None:
        print(f"  fsyncs a trial: {ray_part['fsync'][0]:.1f} over {n2} trials (target <= 2)")
    wall_peer, span_peer = (cost["plain Tune + OptunaSearch"][k] for k in ("wall", "span"))
    if min(wall_peer, span_peer, study["wall"], study["span"]) <= 0:
        print("  (a wall or span an added trial <= 0: the load moved between a peer's sizes; --rounds)")
    print(f"  span ratio {study['span'] / span_peer:.2f}  (study, progress on / plain Tune + OptunaSearch)")
    print(
        f"  wall ratio {study['wall'] / wall_peer:.2f}  "
        "(study, progress on / plain Tune + OptunaSearch; target <= 1.2)"
    )
    print(f"  wall ratio {quiet['wall'] / wall_peer:.2f}  (study, --quiet / plain Tune + OptunaSearch)")
    print(f"  ratio --quiet {quiet['cpu'] / peers:.2f}  (study, --quiet / (plain Tune + plain Optuna))")
    print(
        f"ratio {study['cpu'] / peers:.2f}  "
        "(driver CPU an added trial: study / (plain Tune + plain Optuna); target <= 1.0)"
    )


if __name__ == "__main__":
    main()
