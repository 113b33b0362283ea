"""Kill campaign: a real study, its driver SIGKILLed (the whole process group) at seeded random
moments over its whole life, resumed after each kill; prints ``kills survived <k>/<K>`` last.

With ``--signals`` the drivers are stopped as people stop them instead: Ctrl-C (SIGINT to the
process group, once or twice), ``kill`` (SIGTERM), a closed terminal (SIGHUP); every fourth
signal within a second of a new study's creation (its Optuna journal's first record). Each must
exit 130 (0 if it had just finished) with no traceback and, as its last line, the command that
continues the study, which is what the campaign runs next; it prints ``signals survived <k>/<K>``.

The moments, drawn from ``--seed``: while Ray starts (or a resume restores), while trials
train, the instant a trial's end record appears (it reached its budget, diverged, or ASHA
stopped it), the instant Tune saves its state before a trial starts, and during the final
export. Every other kill meets a driver showing Tune's progress table, the others ``--quiet``.

With ``--uniform`` every kill lands at a time drawn uniformly over the driver's life instead of
at a named moment: it looks for windows nobody named. The life is ``--horizon`` seconds until a
``run`` has done a whole study by itself, then the longest such run so far. ``--seeds
A,B,C`` runs one campaign per seed (``--kills`` each) and prints one line over all of them.

After every kill the study's Parquet must be readable. When a study finishes (its driver exits
by itself, 0), it must hold exactly ``num_samples`` trials, all final; no (trial_id, iteration)
twice in history; every trial that had ended in the Parquet before a kill has the same history
rows after it; no configuration twice; no Optuna trial RUNNING and exactly one finished Optuna
trial per Tune trial.
A study that finishes before the campaign has made its K kills is followed by another.

    .venv/bin/python bench/kill_campaign.py                      # 30 kills, local storage
    .venv/bin/python bench/kill_campaign.py --s3 --cluster       # moto S3, 3-node local Ray cluster
    .venv/bin/python bench/kill_campaign.py --signals --kills 20 # SIGINT, SIGTERM, SIGHUP
    .venv/bin/python bench/kill_campaign.py --seeds 11,12,13     # 3 x 30 kills, one total
    .venv/bin/python bench/kill_campaign.py --uniform            # kills at uniform random times
    .venv/bin/python bench/kill_campaign.py --fuse 4             # fused trials, 4 a group
    .venv/bin/python bench/kill_campaign.py --fuse 4 --spec mnist-rotation --kills 8

With ``--fuse K`` the smoke study's trials are trained in fused groups of K on the machine's CPUs
(K at a time), so every kill lands on a driver whose trials share a fuser. With ``--spec mnist``
or ``--spec mnist-rotation`` it is that shipped MNIST spec instead, cut to a smoke study's size
(60 iterations of a 16-unit model on batches of 32, reports every 10, ASHA's first rung at 10,
200 test digits: `fused_mnist_smoke`) and fused in groups of K on one CPU.

Also a library: tests/study/test_kill_campaign.py imports it and runs a seeded, smaller campaign
(`Campaign`, `run_campaign`) in the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pyarrow.fs as pafs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from study.records.records import read_end_records  # noqa: E402
from study.search.journal import optuna_storage  # noqa: E402
from study.search.search import TUNE_ID_ATTR  # noqa: E402
from study.storage.storage import StudyPaths, is_remote, read_study_table, resolve  # noqa: E402

ENDED = ("completed", "early_stopped", "diverged")
MOMENTS = ("startup", "training", "trial-end", "state-save", "final-export")
SIGNALS = ("SIGINT", "SIGINT x2", "SIGTERM", "SIGHUP")


@dataclass
class Kill:
    number: int
    study: str
    verb: str
    table: bool
    moment: str
    at_s: float
    problems: list[str] = field(default_factory=list)


@dataclass
class Campaign:
    """One campaign: where, how many kills, and what each driver gets."""

    storage: str
    kills: int
    seed: int
    spec: str = "parity-smoke"
    num_samples: int = 8
    address: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kill-campaign-")))
    uniform: bool = False
    """Kill at a uniform random time over ``[0, horizon]`` s of each driver, not at named moments."""
    horizon: float = 30.0
    lives: list[float] = field(default_factory=list)
    """How long the drivers that ran to their end by themselves took (the --uniform window)."""
    signals: bool = False
    """Stop drivers with signals (SIGINT once or twice, SIGTERM, SIGHUP) instead of SIGKILL, check
    each exits 130 with the command to continue as its last line, and continue with that line."""
    on_cycle: Callable[[int], None] | None = None
    """Called with the cycle number before each driver starts (the cluster variant removes a node)."""
    echo: Callable[[str], None] = print


def _driver(c: Campaign, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    extra = ["--address", c.address] if c.address else []
    with log.open("wb") as out:
        storage = [] if "--storage" in args else ["--storage", c.storage]
        return subprocess.Popen(
            [sys.executable, "-m", "study", *args, *storage, *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,  # its own process group, as in a terminal: killed whole
            env={**os.environ, **c.env},
        )


def _end_ids(paths: StudyPaths) -> set[str]:
    try:
        return set(read_end_records(paths))
    except (OSError, ValueError):
        return set()


def _state_mtime(paths: StudyPaths) -> float:
    """When Tune last saved its experiment state (0 if never), on any storage."""
    fs, directory = resolve(paths.experiment)
    infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    times = [
        i.mtime.timestamp()
        for i in infos
        if i.type == pafs.FileType.File and i.base_name.startswith("experiment_state-") and i.mtime
    ]
    return max(times, default=0.0)


def _wait(proc: subprocess.Popen[bytes], until: Callable[[], bool], timeout: float, poll: float) -> bool:
    """True when ``until`` held before the driver exited by itself."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if until():
            return True
        time.sleep(poll)
    return False


def _moment_reached(c: Campaign, paths: StudyPaths, moment: str, rng: random.Random) -> Callable[[], bool]:
    start = time.monotonic()
    if moment == "uniform":
        delay = rng.uniform(0.0, max(c.lives, default=c.horizon))
        return lambda: time.monotonic() - start >= delay
    if moment == "created":  # within a second of `run` creating the study in Optuna's journal
        delay = rng.uniform(0.0, 1.0)
        seen: list[float] = []
        journal = Path(paths.optuna_journal)  # a local file, on S3 storage too (its cache)

        def created() -> bool:
            if not seen and journal.exists() and journal.stat().st_size > 0:
                seen.append(time.monotonic())
            return bool(seen) and time.monotonic() - seen[0] >= delay

        return created
    if moment == "startup":
        delay = rng.uniform(0.0, 6.0)
        return lambda: time.monotonic() - start >= delay
    if moment == "training":
        delay = rng.uniform(6.0, 30.0)
        return lambda: time.monotonic() - start >= delay
    if moment == "trial-end":
        ended = _end_ids(paths)
        return lambda: bool(_end_ids(paths) - ended)
    if moment == "state-save":
        before = _state_mtime(paths)
        return lambda: _state_mtime(paths) > before
    # final-export: every trial has its end record; the driver is writing the Parquet, failing
    # Optuna's orphans, shutting Ray down
    extra = rng.uniform(0.0, 1.0)
    reached: list[float] = []

    def final() -> bool:
        if not reached and len(_end_ids(paths)) >= c.num_samples:
            reached.append(time.monotonic())
        return bool(reached) and time.monotonic() - reached[0] >= extra

    return final


def _stop(proc: subprocess.Popen[bytes], how: str, log: Path) -> list[str]:
    """Stop the driver as ``how`` says; the problems seen (it must exit 130, or 0 if it had
    just finished, within two minutes, without a traceback)."""
    if how == "SIGKILL":
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return []
    if how == "SIGTERM":
        os.kill(proc.pid, signal.SIGTERM)  # `kill PID`, a job scheduler
    else:  # Ctrl-C and a closed terminal reach the whole foreground process group
        os.killpg(proc.pid, signal.SIGHUP if how == "SIGHUP" else signal.SIGINT)
        if how == "SIGINT x2":
            time.sleep(random.uniform(0.05, 1.0))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return [f"{how}: the driver did not stop within 120 s"]
    with contextlib.suppress(ProcessLookupError):  # Ray's helpers must have gone with it
        os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    problems = []
    if rc not in (0, 130):
        problems.append(
            f"{how}: exit {rc}, not 130: {text.strip().splitlines()[-1:] if text.strip() else ''}"
        )
    if "Traceback (most recent call last)" in text:
        problems.append(f"{how}: a traceback reached the terminal ({log})")
    return problems


def _pasted_command(log: Path) -> list[str] | None:
    """The command the driver's last line says to run, split as a shell would."""
    lines = log.read_text(errors="replace").strip().splitlines()
    if not lines:
        return None
    last = lines[-1]
    for marker in ("resume it with: ", "run it again: "):
        if marker in last:
            return shlex.split(last.split(marker, 1)[1])
    if lines and "Parquet:" in last:  # it had finished: the summary's last line
        return ["ponder-study", "resume", last.split("study=", 1)[-1].split("/", 1)[0]]
    if "nothing to resume" in last:  # a resume that found it finished, before the signal came
        return ["ponder-study", "resume", last.split("study '", 1)[-1].split("'", 1)[0]]
    return None


def _read(paths: StudyPaths, kind: str) -> pd.DataFrame | None:
    table = read_study_table(paths, kind)
    return None if table is None else table.to_pandas()


def _snapshot(paths: StudyPaths, seen: dict[str, pd.DataFrame]) -> list[str]:
    """The Parquet must be readable; remember the history rows of every trial it shows ended."""
    try:
        t = _read(paths, "trials")
        h = _read(paths, "history")
    except Exception as e:
        return [f"Parquet unreadable: {type(e).__name__}: {e}"]
    if t is None or h is None:
        return []
    for trial_id in t.loc[t["status"].isin(ENDED), "trial_id"]:
        if trial_id not in seen:
            rows = h[h["trial_id"] == trial_id].sort_values("iteration").reset_index(drop=True)
            seen[trial_id] = rows
    return []


def _final_problems(c: Campaign, paths: StudyPaths, seen: dict[str, pd.DataFrame]) -> list[str]:
    problems: list[str] = []
    t, h = _read(paths, "trials"), _read(paths, "history")
    if t is None or h is None:
        return ["no Parquet at the end"]
    if len(t) != c.num_samples:
        problems.append(f"{len(t)} trials, not {c.num_samples}")
    if not t["status"].isin(ENDED).all():
        problems.append(f"not all final: {t['status'].value_counts().to_dict()}")
    searched = [x for x in ("lambda_p", "beta", "max_steps", "seed") if x in t.columns]
    twice = t.duplicated(searched)
    if twice.any():
        problems.append(f"{int(twice.sum())} configurations ran twice: {sorted(t['trial_id'][twice])}")
    dup = h.duplicated(["trial_id", "iteration"])
    if dup.any():
        problems.append(f"{int(dup.sum())} (trial_id, iteration) repeated in history")
    for trial_id, rows in seen.items():
        now = h[h["trial_id"] == trial_id].sort_values("iteration").reset_index(drop=True)
        if not rows.equals(now):
            problems.append(f"trial {trial_id}: history rows changed after it had ended")
    ends = read_end_records(paths)
    missing = set(ends) - set(t["trial_id"])
    if missing:
        problems.append(f"ended trials missing from the Parquet: {sorted(missing)}")
    study = optuna.load_study(study_name=paths.name, storage=optuna_storage(paths))
    running = [x.number for x in study.trials if x.state == optuna.trial.TrialState.RUNNING]
    if running:
        problems.append(f"Optuna trials left RUNNING: {running}")
    finished = [x for x in study.trials if x.state.is_finished()]
    by_tune: dict[str, int] = {}
    for x in finished:
        tune_id = x.user_attrs.get(TUNE_ID_ATTR)
        by_tune[tune_id] = by_tune.get(tune_id, 0) + 1
    for trial_id in t["trial_id"]:
        if by_tune.get(trial_id) != 1:
            problems.append(f"trial {trial_id}: {by_tune.get(trial_id, 0)} finished Optuna trials")
    if len(finished) != c.num_samples:
        problems.append(f"{len(finished)} finished Optuna trials for {c.num_samples} Tune trials")
    return problems


def run_campaign(c: Campaign) -> tuple[int, list[Kill]]:
    """Make ``c.kills`` kills; returns (kills survived, every kill)."""
    rng = random.Random(c.seed)
    kills: list[Kill] = []
    study_no, cycle = 0, 0
    survived = 0
    while len(kills) < c.kills:
        name = f"k{c.seed}-{study_no}"
        paths = StudyPaths(c.storage, name)
        seen: dict[str, pd.DataFrame] = {}
        study_kills: list[Kill] = []
        verb_args = ["run", c.spec, "--name", name, "--num-samples", str(c.num_samples)]
        failed = False
        while True:
            cycle += 1
            if c.on_cycle is not None:
                c.on_cycle(cycle)
            killing = len(kills) < c.kills
            # the progress table on for half the kills (and half the other drivers)
            table = len(kills) % 2 == 0 if killing else cycle % 2 == 1
            if c.signals and study_kills and len(kills) % 4 == 0:
                killing = False  # let this study finish: every 4th signal meets a new study's `run`
            moment = ("uniform" if c.uniform else rng.choice(MOMENTS)) if killing else "none"
            how = rng.choice(SIGNALS) if c.signals else "SIGKILL"
            if c.signals and killing and verb_args[0] == "run" and not study_kills:
                moment = "created"  # a quarter of all signals: within 1 s of the study's creation
            log = c.log_dir / f"{name}-{cycle:03d}.log"
            proc = _driver(c, [*verb_args, *([] if table else ["--quiet"])], log)
            started = time.monotonic()
            poll = 0.05 if is_remote(c.storage) else 0.002
            reached = killing and _wait(proc, _moment_reached(c, paths, moment, rng), 600, poll)
            if reached:
                at = time.monotonic() - started
                kill = Kill(len(kills) + 1, name, verb_args[0], table, f"{moment}, {how}", at)
                kill.problems += _stop(proc, how, log)
                pasted = _pasted_command(log) if c.signals and not kill.problems else None
                if c.signals and not kill.problems and (pasted is None or pasted[0] != "ponder-study"):
                    kill.problems.append("its last line is not a command to continue")
                kill.problems += _snapshot(paths, seen)
                kills.append(kill)
                study_kills.append(kill)
                c.echo(
                    f"kill {kill.number}/{c.kills}: {name} {kill.verb} ({'table' if table else 'quiet'}) "
                    f"at {kill.moment}, {kill.at_s:.1f} s"
                    + (f": {'; '.join(kill.problems)}" if kill.problems else "")
                )
                if pasted is not None and pasted[1:2] == ["resume"]:
                    verb_args = pasted[1:]  # what the driver said to run, as a shell splits it
                elif paths.exists() and verb_args[0] == "run":  # before the spec: the user runs it again
                    verb_args = ["resume", name]
                continue
            rc = proc.wait(timeout=900)
            if rc == 0 and verb_args[0] == "run":  # a whole study in one driver
                c.lives.append(time.monotonic() - started)
            if rc != 0:
                tail = log.read_text(errors="replace")[-2000:]
                problem = (
                    f"{verb_args[0]} exited {rc}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"
                )
                c.echo(f"  {name}: {problem} (log {log})")
                if study_kills:
                    study_kills[-1].problems.append(problem)
                failed = True
            break
        if not failed:
            problems = _final_problems(c, paths, seen)
            if problems:
                c.echo(f"  {name}: " + "; ".join(problems))
                if study_kills:
                    study_kills[-1].problems += problems
            else:
                c.echo(f"  {name}: finished after {len(study_kills)} kills, every check held")
        ok = not failed and all(not k.problems for k in study_kills)
        survived += len(study_kills) if ok else 0  # a study that failed counts none of its kills
        study_no += 1
    return survived, kills


def _moto(c: Campaign) -> Any:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "PONDER_STUDY_CACHE": tempfile.mkdtemp(prefix="kill-campaign-cache-"),
    }
    os.environ.update(env)  # this process reads the results too, and Ray's nodes inherit them
    import pyarrow.fs as pafs

    bucket = f"kill-campaign-{os.getpid()}"
    pafs.S3FileSystem(endpoint_override=env["AWS_ENDPOINT_URL"], allow_bucket_creation=True).create_dir(
        bucket
    )
    c.storage = f"s3://{bucket}"
    return server


def fused_mnist_smoke(where: Path, name: str, fuse: int) -> str:
    """The shipped MNIST spec ``name`` at a smoke study's size, its trials trained in fused groups of
    ``fuse`` on one CPU each, ``fuse`` at a time; saved as ``<name>.toml`` in ``where``, its path."""
    import re

    from study.spec.spec import load_spec, parse_spec

    source = load_spec(name).source
    sizes = {"iterations": 60, "eval_interval": 10, "grace_period": 10, "batch_size": 32, "n_hidden": 16}
    for key, value in {**sizes, "max_concurrent": fuse}.items():
        source, made = re.subn(rf"^{key} = .*$", f"{key} = {value}", source, flags=re.MULTILINE)
        assert made == 1, f"{name}: no {key} line to rewrite"
    source = source.replace("[config]\n", "[config]\nn_embed = 16\neval_samples = 200\n", 1)
    source = source.replace("gpu = 0\n", f"gpu = 0\nfuse = {fuse}\n", 1)
    assert parse_spec(source, name).resources.fuse == fuse
    path = where / f"{name}.toml"
    path.write_text(source)
    return str(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", help="comma-separated seeds: one campaign of --kills each, one total")
    p.add_argument("--uniform", action="store_true", help="kill at uniform random times, not at moments")
    p.add_argument("--horizon", type=float, default=30.0, help="--uniform: kill within this many seconds")
    p.add_argument("--num-samples", type=int, default=8)
    p.add_argument("--spec", default="parity-smoke")
    p.add_argument("--storage", help="a local directory (default: a new temporary one)")
    p.add_argument("--s3", action="store_true", help="storage on S3 (moto's server on loopback)")
    p.add_argument("--cluster", action="store_true", help="a 3-node local Ray cluster; one worker removed")
    p.add_argument(
        "--fuse",
        type=int,
        default=1,
        help="train the smoke (or --spec mnist[-rotation]) study's trials fused, K a group",
    )
    p.add_argument(
        "--signals",
        action="store_true",
        help="stop drivers with SIGINT (once or twice), SIGTERM and SIGHUP instead of SIGKILL",
    )
    args = p.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    total, made = 0, 0
    for seed in seeds:
        survived, kills = _campaign(args, seed)
        total, made = total + survived, made + len(kills)
        if len(seeds) > 1:
            print(f"seed {seed}: survived {survived}/{len(kills)}", flush=True)
    print(f"{'signals' if args.signals else 'kills'} survived {total}/{made}")


def _campaign(args: argparse.Namespace, seed: int) -> tuple[int, list[Kill]]:
    spec = args.spec
    if args.fuse > 1:
        where = Path(tempfile.mkdtemp(prefix="kill-campaign-spec-"))
        if spec in ("mnist", "mnist-rotation"):
            spec = fused_mnist_smoke(where, spec, args.fuse)
        elif spec == "parity-smoke":
            from tests.study.conftest import smoke_spec

            spec = smoke_spec(where, at_once=args.fuse, fuse=args.fuse)
        else:
            raise SystemExit(
                "--fuse rewrites parity-smoke, mnist or mnist-rotation: give one of them as --spec"
            )
    c = Campaign(
        storage=args.storage or tempfile.mkdtemp(prefix="kill-campaign-storage-"),
        kills=args.kills,
        seed=seed,
        spec=spec,
        num_samples=args.num_samples,
        signals=args.signals,
        uniform=args.uniform,
        horizon=args.horizon,
    )
    server = _moto(c) if args.s3 else None
    cluster = None
    if args.cluster:
        import ray
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        workers = [cluster.add_node(num_cpus=2, num_gpus=2) for _ in range(2)]
        cluster.wait_for_nodes()
        c.address = cluster.address
        remove_at = max(2, args.kills // 3)

        def on_cycle(cycle: int) -> None:
            if cycle == remove_at and len(workers) == 2:

                def remove() -> None:  # a lost machine, mid-study, while a driver runs
                    cluster.remove_node(workers.pop())
                    c.echo(f"(cycle {cycle}: a worker node removed)")

                threading.Timer(10.0, remove).start()

        c.on_cycle = on_cycle
    c.echo(f"storage {c.storage}; logs {c.log_dir}")
    t0 = time.monotonic()
    try:
        survived, kills = run_campaign(c)
    finally:
        if cluster is not None:
            import ray

            ray.shutdown()
            cluster.shutdown()
        if server is not None:
            server.stop()
    moments = {m: sum(1 for k in kills if k.moment.startswith(m)) for m in (*MOMENTS, "created", "uniform")}
    c.echo(f"moments: {json.dumps(moments)}; {time.monotonic() - t0:.0f} s")
    return survived, kills


if __name__ == "__main__":
    main()
