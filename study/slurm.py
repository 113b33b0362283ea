"""``ponder-study slurm``: a study on a Slurm allocation, written as a batch script and submitted.

The script follows Ray's "Deploying on Slurm" pattern: a Ray head on the batch node (the
allocation's first), one Ray worker per other node through ``srun``, and the study's driver on
the head, ``run`` the first time and ``resume`` once the study exists, so the same script
continues a study however often it is submitted. Slurm's warning signal (``--signal=B:USR1@S``)
stops the study cleanly before the time limit (Tune saves, the driver exits 130); with
``--requeue`` the script then requeues its own job (``scontrol requeue``), and the next
allocation resumes the study, until it is finished. docs/slurm.md is the user's side of it.

Nothing here imports Ray or torch: the script is written and submitted on a login node.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from study.commands import command_name
from study.spec import SpecError, StudySpec, list_specs, load_spec
from study.storage import StorageError, check_reachable, check_writable, expand_storage, is_remote, is_shared

__all__ = ["SlurmError", "SlurmJob", "build_parser", "main", "parse_time", "plan", "render"]

PROG = "ponder-study slurm"
EXIT_USAGE = 2
EXIT_ERROR = 1
STORAGE_ENV = "PONDER_STUDY_STORAGE"
DEFAULT_STOP_BEFORE_S = 180
"""Seconds before the time limit at which Slurm asks the study to stop: Tune's last save and the
driver's Parquet take seconds; Slurm may send the signal up to a minute early (its timer)."""
NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm", "/scratch/local", "/local")
"""Path prefixes that are each node's own disk on most clusters (a note, not a refusal)."""


class SlurmError(ValueError):
    """Bad input for ``slurm``; the message says what and how to fix it, in one line."""


@dataclass(frozen=True)
class SlurmJob:
    """Everything the batch script is written from."""

    spec: StudySpec
    """The spec with the command's overrides (name, trials, storage) in its source."""
    storage: str
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    time: str
    stop_before_s: int
    out_dir: Path
    workdir: Path
    partition: str | None = None
    account: str | None = None
    requeue: bool = False
    setup: tuple[str, ...] = ()
    sbatch_options: tuple[str, ...] = ()
    fallback_bin: str | None = None
    """The folder of the ``ponder-study`` that wrote the script: used when the job's PATH has none."""

    @property
    def study(self) -> str:
        return self.spec.name

    @property
    def script(self) -> Path:
        return self.out_dir / f"{self.study}.sbatch"

    @property
    def spec_copy(self) -> Path:
        """The spec as submitted (with the overrides), which the first allocation's ``run`` reads."""
        return self.out_dir / f"{self.study}.toml"


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line, exit code 2 (as the rest of the CLI)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``ponder-study slurm``."""
    p = _Parser(
        prog=PROG,
        description="Write a Slurm batch script that runs a study on an allocation (a Ray head on the first "
        "node, a Ray worker on each other one, the driver on the head) and submit it with sbatch. The "
        "script runs the study, or resumes it if it exists: submitting it again continues the study. "
        "Before the time limit Slurm signals it and the study stops cleanly; with --requeue the job "
        "requeues itself and its next allocation resumes the study, until it is finished.",
    )
    p.add_argument("spec", help=f"a shipped spec ({', '.join(list_specs())}) or a path to a .toml file")
    p.add_argument("--nodes", type=int, default=1, help="nodes of the allocation (default: 1)")
    p.add_argument("--gpus-per-node", type=int, default=0, metavar="G", help="GPUs on each node (default: 0)")
    p.add_argument(
        "--cpus-per-node",
        type=int,
        default=None,
        metavar="C",
        help="CPUs on each node for trials (default: what the spec's trials at once need, over the nodes)",
    )
    p.add_argument(
        "--time",
        required=True,
        help="the allocation's time limit, as Slurm writes it: HH:MM:SS, MM, MM:SS, D-HH[:MM[:SS]]",
    )
    p.add_argument(
        "--storage",
        default=None,
        help="where the study lives, reached from every node: a folder they all mount, as "
        "file://$HOME/ponder-results (a plain path will do for one node), or s3://bucket/prefix "
        "(default: $PONDER_STUDY_STORAGE)",
    )
    p.add_argument("--partition", help="the Slurm partition (default: the site's)")
    p.add_argument("--account", help="the Slurm account to charge (default: yours)")
    p.add_argument(
        "--requeue",
        action="store_true",
        help="at the time limit's warning, stop the study and requeue the job (scontrol requeue): the next "
        "allocation resumes it, until it is finished",
    )
    p.add_argument(
        "--stop-before",
        type=int,
        default=DEFAULT_STOP_BEFORE_S,
        metavar="S",
        help=f"seconds before the time limit at which Slurm signals the job to stop the study (default: "
        f"{DEFAULT_STOP_BEFORE_S}; Slurm may signal up to 60 s earlier)",
    )
    p.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="LINE_OR_VENV",
        help="a line the job runs before anything (module load cuda/12.4), or a venv folder on the shared "
        "disk (its bin/activate is sourced); repeat for more",
    )
    p.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPTION",
        help="one more #SBATCH option, written --sbatch=--mem=32G (repeat for more)",
    )
    p.add_argument("--name", help="the study's name (default: the spec's name)")
    p.add_argument("--num-samples", type=int, help="number of trials (default: the spec's)")
    p.add_argument(
        "--out", help="the folder for the script, the spec's copy and the job's output (default: slurm/NAME)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="write the script and print its path; do not submit it"
    )
    return p


_TIME = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")


def parse_time(text: str) -> int:
    """Slurm's time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``)
    in seconds; `SlurmError` for anything else."""
    m = _TIME.match(text.strip())
    if m is None:
        raise SlurmError(
            f"--time {text!r} is not a Slurm time limit; write HH:MM:SS (02:00:00), or D-HH:MM:SS"
        )
    days, d_hours, d_minutes, d_seconds, a, b, c = m.groups()
    if days is not None:
        seconds = int(days) * 86400 + int(d_hours) * 3600 + int(d_minutes or 0) * 60 + int(d_seconds or 0)
    elif c is not None:  # HH:MM:SS
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    else:  # MM or MM:SS
        seconds = int(a) * 60 + int(b or 0)
    if seconds <= 0:
        raise SlurmError(f"--time {text!r} is no time at all; give the allocation's time limit")
    return seconds


def _storage(value: str | None, nodes: int) -> str:
    """The storage as the job writes it (a local path made absolute), refused in one line where
    the nodes could not share it."""
    where = "--storage"
    if value is None and os.environ.get(STORAGE_ENV, "").strip():
        value, where = os.environ[STORAGE_ENV], f"${STORAGE_ENV}"
    if value is None:
        raise SlurmError(
            "give --storage: a folder every node of the job reaches (file://$HOME/results) or s3://bucket/prefix"
        )
    try:
        storage = expand_storage(value)
    except StorageError as e:
        raise SlurmError(f"{where}: {e}") from None
    if not is_remote(storage):
        local = os.path.abspath(storage.removeprefix("file://"))
        storage = f"file://{local}" if storage.startswith("file://") else local
    if nodes > 1 and not is_shared(storage):
        raise SlurmError(
            f"storage {storage} is a path on one machine's disk, and the {nodes} nodes' trials all write the "
            f"study: give a filesystem every node mounts as file://{storage} (if it is one), or s3://bucket/prefix"
        )
    try:
        check_reachable(storage)
        check_writable(storage)
    except StorageError as e:
        raise SlurmError(str(e)) from None
    return storage


def _setup_lines(values: Sequence[str]) -> tuple[str, ...]:
    """``--setup`` values as the script's lines: a venv folder becomes ``source VENV/bin/activate``."""
    lines: list[str] = []
    for value in values:
        text = value.strip()
        if not text:
            continue
        looks_like_a_path = not re.search(r"\s", text) and ("/" in text or text.startswith(("~", ".")))
        if looks_like_a_path:
            venv = Path(os.path.expanduser(text)).absolute()
            if not (venv / "bin" / "activate").is_file():
                raise SlurmError(
                    f"--setup {value}: no venv there ({venv}/bin/activate is missing); give a venv folder, "
                    "or a shell line such as 'module load cuda'"
                )
            lines.append(f"source {shlex.quote(str(venv / 'bin' / 'activate'))}")
        else:
            lines.extend(text.splitlines())
    return tuple(lines)


def _fallback_bin() -> str | None:
    """The folder of this ``ponder-study`` (and of the ``ray`` beside it): a venv's bin."""
    here = Path(sys.executable).parent
    if (here / "ponder-study").is_file():
        return str(here.absolute())
    found = shutil.which("ponder-study")
    return str(Path(found).absolute().parent) if found else None


def _cpus(spec: StudySpec, nodes: int, gpus: int) -> int:
    """CPUs per node for the spec's trials at once, spread over the nodes (GPUs may cap them)."""
    per_node = math.ceil(spec.search.max_concurrent / nodes)
    if spec.resources.gpu > 0 and gpus > 0:
        per_node = max(1, min(per_node, int(gpus // spec.resources.gpu)))
    return max(1, math.ceil(per_node * spec.resources.cpu))


def plan(args: argparse.Namespace, notes: list[str] | None = None) -> SlurmJob:
    """The job the arguments ask for, or `SlurmError` at the first problem (nothing written yet).
    ``notes`` collects what the user should know but that is not an error."""
    notes = [] if notes is None else notes
    if args.nodes < 1:
        raise SlurmError(f"--nodes must be >= 1, got {args.nodes}")
    if args.gpus_per_node < 0:
        raise SlurmError(f"--gpus-per-node must be >= 0, got {args.gpus_per_node}")
    if args.cpus_per_node is not None and args.cpus_per_node < 1:
        raise SlurmError(f"--cpus-per-node must be >= 1, got {args.cpus_per_node}")
    if args.num_samples is not None and args.num_samples < 1:
        raise SlurmError(f"--num-samples must be >= 1, got {args.num_samples}")
    time_s = parse_time(args.time)
    if args.stop_before < 1:
        raise SlurmError(f"--stop-before must be >= 1 second, got {args.stop_before}")
    if time_s <= args.stop_before + 60:
        raise SlurmError(
            f"--time {args.time} leaves no time to run: Slurm signals the stop {args.stop_before} s "
            "(and up to 60 s more) before the limit; give a longer --time or a smaller --stop-before"
        )
    for option in args.sbatch:
        if not option.startswith("-") or "\n" in option:
            raise SlurmError(f"--sbatch {option!r}: give one sbatch option, written --sbatch=--mem=32G")
    if not args.dry_run and shutil.which("sbatch") is None:
        raise SlurmError(
            "sbatch is not on this machine's PATH: run this on a Slurm login node, or add --dry-run to "
            "write the script only"
        )
    storage = _storage(args.storage, args.nodes)
    try:
        spec = load_spec(args.spec).with_overrides(
            name=args.name, num_samples=args.num_samples, storage=storage
        )
    except SpecError as e:
        raise SlurmError(str(e)) from None
    gpu = spec.resources.gpu
    if gpu > 0 and args.gpus_per_node == 0:
        raise SlurmError(
            f"spec {spec.name!r} gives each trial {gpu:g} GPU ([resources] gpu), and no GPU is asked for: "
            "add --gpus-per-node"
        )
    if gpu > args.gpus_per_node:
        raise SlurmError(
            f"spec {spec.name!r} gives each trial {gpu:g} GPUs, "
            f"more than --gpus-per-node {args.gpus_per_node}"
        )
    if gpu == 0 and args.gpus_per_node > 0:
        notes.append(
            f"spec {spec.name!r} gives its trials no GPU ([resources] gpu = 0): they will leave the GPUs idle"
        )
    cpus = args.cpus_per_node
    if cpus is None:
        cpus = _cpus(spec, args.nodes, args.gpus_per_node)
    if spec.resources.cpu > cpus:
        raise SlurmError(
            f"spec {spec.name!r} gives each trial {spec.resources.cpu:g} CPUs, "
            f"more than --cpus-per-node {cpus}"
        )
    if not is_remote(storage):
        path = storage.removeprefix("file://")
        if any(path == p or path.startswith(p + "/") for p in NODE_LOCAL):
            notes.append(
                f"{path} is usually each node's own disk: the study is written on the compute node and "
                "`status` on this one will not see it (a folder on the shared disk does)"
            )
    bin_dir = _fallback_bin()
    setup = _setup_lines(args.setup)
    if bin_dir is None and not setup:
        notes.append("no ponder-study found here: give --setup with the venv the job should use")
    out_dir = Path(os.path.expanduser(args.out) if args.out else Path("slurm") / spec.name).absolute()
    return SlurmJob(
        spec=spec,
        storage=storage,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        cpus_per_node=cpus,
        time=args.time.strip(),
        stop_before_s=args.stop_before,
        out_dir=out_dir,
        workdir=Path.cwd(),
        partition=args.partition,
        account=args.account,
        requeue=args.requeue,
        setup=setup,
        sbatch_options=tuple(args.sbatch),
        fallback_bin=bin_dir,
    )


def _study_exists(job: SlurmJob) -> str:
    """The script's ``study_exists`` function: the study's spec file, or ``status`` on an object store."""
    if is_remote(job.storage):
        return 'study_exists() { "$ponder" status "$study" --storage "$storage" >/dev/null 2>&1; }'
    spec = os.path.join(job.storage.removeprefix("file://"), "studies", job.study, "spec.toml")
    return f"study_exists() {{ [ -f {shlex.quote(spec)} ]; }}"


def render(job: SlurmJob, written: datetime | None = None) -> str:
    """The batch script's text: its #SBATCH lines and settings from ``job``, then `_BODY`."""
    q = shlex.quote
    when = (written or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    sbatch = [
        f"--job-name=ponder-{job.study}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={job.cpus_per_node}",
        *([f"--gpus-per-node={job.gpus_per_node}"] if job.gpus_per_node else []),
        f"--time={job.time}",
        f"--signal=B:USR1@{job.stop_before_s}",
        f"--chdir={job.workdir}",
        f"--output={job.out_dir}/{job.study}-%j.out",
        "--open-mode=append",
        "--requeue" if job.requeue else "--no-requeue",
        *([f"--partition={job.partition}"] if job.partition else []),
        *([f"--account={job.account}"] if job.account else []),
        *job.sbatch_options,
    ]
    lines = [
        "#!/bin/bash",
        f"# Written by `ponder-study slurm` ({when}): study {job.study} on {job.nodes} node(s).",
        "# `sbatch` this file to run the study, or to continue it: it resumes a study that exists.",
        *(f"#SBATCH {option}" for option in sbatch),
        "",
        "# -- the study (written by ponder-study slurm; change them here, or write the script again) --",
        f"study={q(job.study)}",
        f"storage={q(job.storage)}",
        f"spec={q(str(job.spec_copy))}   # the spec as submitted: what the first allocation runs",
        f"script={q(str(job.script))}",
        f"out_dir={q(str(job.out_dir))}",
        f"cpus={job.cpus_per_node}   # per node, for trials (the driver shares the first node's)",
        f"gpus={job.gpus_per_node}   # per node",
        f"requeue={int(job.requeue)}   # 1: at the time limit's warning, requeue the job to resume the study",
        f"fallback_bin={q(job.fallback_bin or '')}   # ponder-study and ray, if the PATH has none",
        _study_exists(job),
        "",
        "# -- your site's set-up (--setup): modules, a venv on the shared disk --",
        *(job.setup or ("# (none)",)),
        "",
    ]
    return "\n".join(lines) + _BODY


_BODY = r"""
# -- from here on the same for every study --
set -u
export PYTHONUNBUFFERED=1                      # the driver's lines reach this output as they come
say() { printf 'ponder-study slurm: %s\n' "$*"; }
words() { local w out=""; for w in "$@"; do out+="${out:+ }$(printf '%q' "$w")"; done; printf '%s' "$out"; }

job=${SLURM_JOB_ID:?this is a Slurm batch script: submit it with sbatch}
allocation=$((${SLURM_RESTART_COUNT:-0} + 1))
if ponder=$(command -v ponder-study); then shown=ponder-study
else ponder=$fallback_bin/ponder-study; shown=$ponder; fi
if [ ! -x "$ponder" ]; then
    say "no ponder-study on this node's PATH, nor at $ponder: give the job a shared venv (--setup)"
    exit 2
fi
export PATH="$(dirname "$ponder"):$PATH"       # ray from the same install as ponder-study
follow=$(words "$shown" status "$study" --storage "$storage")
continue_line="continue it with: $(words sbatch "$script")"

# USR1: the time limit is near (--signal), or `scancel --batch --signal=USR1`: stop, then requeue.
# INT: `scancel --batch --signal=INT`: stop, no requeue. The driver takes SIGTERM as Ctrl-C: Tune
# saves, the driver exits 130. TERM (`scancel`, the limit itself) reaches every process of the job
# from Slurm, the driver included: it is only noted here.
stopping="" signalled="" work=""
on_signal() {
    [ -n "$stopping" ] && return
    stopping=$1
    case $1 in
        USR1) say "SIGUSR1 at $(date +%T): the time limit is near; stopping the study cleanly" ;;
        INT) say "SIGINT at $(date +%T): stopping the study cleanly" ;;
        TERM) say "SIGTERM at $(date +%T): Slurm is ending the job; the driver stops as on Ctrl-C"; return ;;
    esac
    stop_driver
}
stop_driver() {
    if [ -z "$signalled" ] && [ -s "$work/driver.pid" ]; then
        signalled=1
        kill -TERM "$(cat "$work/driver.pid")" 2>/dev/null
    fi
}
trap 'on_signal USR1' USR1
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM

mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${SLURMD_NODENAME:-${nodes[0]}}      # this node: the driver runs beside the head
workers=()
for node in "${nodes[@]}"; do [ "$node" != "$head_node" ] && workers+=("$node"); done
say "job $job (allocation $allocation) on ${SLURM_JOB_NODELIST}: study $study, storage $storage"
say "follow it from a login node: $follow"

# this job's own Ray: its files under /tmp (short: Ray's socket paths are limited), a token of its own
work=$(mktemp -d "/tmp/ponder-slurm-$job.XXXXXX")
ray_log="$out_dir/ray-$job.log"
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export RAY_AUTH_TOKEN
unset RAY_ADDRESS
ray_args=(--block --temp-dir="$work/ray" --num-cpus="$cpus" --num-gpus="$gpus" --disable-usage-stats)
steps=()
stop_ray() {
    local step alive
    [ ${#steps[@]} -eq 0 ] && return
    kill -TERM "${steps[@]}" 2>/dev/null
    for _ in $(seq 60); do
        alive=""
        for step in "${steps[@]}"; do kill -0 "$step" 2>/dev/null && alive=1; done
        [ -z "$alive" ] && break
        sleep 0.5
    done
}

address=""
srun --nodes=1 --ntasks=1 --cpus-per-task="$cpus" -w "$head_node" \
    ray start --head --port=0 --include-dashboard=false "${ray_args[@]}" \
    ${PONDER_STUDY_HEAD_IP:+--node-ip-address="$PONDER_STUDY_HEAD_IP"} >>"$ray_log" 2>&1 &
steps+=($!)
for _ in $(seq 900); do                        # up to 3 minutes
    [ -n "$stopping" ] && break
    kill -0 "${steps[0]}" 2>/dev/null || break
    if [ -s "$work/ray/ray_current_cluster" ]; then
        address=$(cat "$work/ray/ray_current_cluster")
        [[ $address =~ ^[^:]+:[0-9]+$ ]] && break
        address=""
    fi
    sleep 0.2
done

rc=""
if [ -z "$address" ] && [ -z "$stopping" ]; then
    say "the Ray head did not start on $head_node; its log, $ray_log, ends:"
    tail -n 5 "$ray_log" | sed 's/^/    /'
    rc=1
elif [ -n "$address" ]; then
    say "Ray head at $address on $head_node, ${#workers[@]} worker node(s); Ray's log: $ray_log"
    for node in "${workers[@]}"; do
        srun --nodes=1 --ntasks=1 --cpus-per-task="$cpus" -w "$node" \
            ray start --address="$address" "${ray_args[@]}" >>"$ray_log" 2>&1 &
        steps+=($!)
    done
fi

if [ -z "$rc" ] && [ -z "$stopping" ]; then
    if study_exists; then verb=(resume "$study"); else verb=(run "$spec"); fi
    say "$(words "$shown" "${verb[@]}" --storage "$storage" --address "$address")"
    (
        trap '' USR1 INT TERM                  # this shell only records the driver's exit code
        "$ponder" "${verb[@]}" --storage "$storage" --address "$address" &
        echo $! >"$work/driver.pid"
        wait $!
        echo $? >"$work/driver.rc"
    ) &
    driver_shell=$!
    while [ ! -s "$work/driver.pid" ] && kill -0 "$driver_shell" 2>/dev/null; do sleep 0.05; done
    [ -n "$stopping" ] && [ "$stopping" != TERM ] && stop_driver   # a signal that came as it started
    while kill -0 "$driver_shell" 2>/dev/null; do wait "$driver_shell" 2>/dev/null; done
    rc=$(cat "$work/driver.rc" 2>/dev/null)
    [ -n "$rc" ] || rc=1
fi
[ -n "$rc" ] || rc=130                         # stopped before the driver started: nothing ran
stop_ray
case $rc in 0 | 130) rm -rf "$work" ;; *) say "Ray's own logs stay in $work/ray on $head_node" ;; esac

case $rc in
    0)
        say "study $study is finished"
        say "see it with: $follow"
        exit 0
        ;;
    130) say "the study stopped; finished trials stay finished, the others resume from their checkpoints" ;;
    *) say "the driver exited $rc (the lines above say why); the study can be resumed once that is fixed" ;;
esac
if [ "$rc" = 130 ] && [ "$stopping" = USR1 ] && [ "$requeue" = 1 ]; then
    say "requeueing job $job: its next allocation resumes the study (\`scancel $job\` ends it)"
    if out=$(scontrol requeue "$job" 2>&1); then
        exit "$rc"                             # Slurm ends this allocation now
    fi
    say "could not requeue job $job: $out"
fi
say "$continue_line"
exit "$rc"
"""


def _write(job: SlurmJob) -> None:
    job.out_dir.mkdir(parents=True, exist_ok=True)
    job.spec_copy.write_text(job.spec.source, encoding="utf-8")
    job.script.write_text(render(job), encoding="utf-8")
    job.script.chmod(0o755)


def _submit(job: SlurmJob) -> tuple[int, str]:
    """``sbatch`` the script: (its exit code, the job id or sbatch's error in one line)."""
    command = ["sbatch", "--parsable", str(job.script)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return 1, "sbatch had not answered after 120 s (is the controller up?)"
    if done.returncode != 0:
        return done.returncode, " ".join((done.stderr or done.stdout).split())
    return 0, done.stdout.strip().split(";")[0]


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Write the batch script, and submit it unless ``--dry-run``; returns the exit code."""
    args = build_parser().parse_args(argv)
    notes: list[str] = []
    try:
        job = plan(args, notes)
        _write(job)
    except SlurmError as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"could not write the script in {args.out or 'slurm/'}: {e.strerror or e}")
    for note in notes:
        print(f"note: {note}")
    q = shlex.quote
    name, storage = q(job.study), q(job.storage)
    print(f"wrote {job.script} (and the spec as submitted, {job.spec_copy})")
    follow = f"{command_name()} status {name} --storage {storage}"
    if args.dry_run:
        print(f"submit it with: sbatch {q(str(job.script))}")
        return 0
    code, said = _submit(job)
    if code != 0:
        where = f"the script is {job.script}: fix it there, or write it again"
        return _fail(f"sbatch did not submit the job: {said} ({where})", EXIT_ERROR)
    print(f"submitted job {said}: study {job.study}, storage {job.storage}")
    print(f"its output: {job.out_dir}/{job.study}-{said}.out")
    print(f"follow it: {follow}")
    print(f"stop it cleanly: scancel --batch --signal=INT {said}")
    print(f"continue it (it resumes the study): sbatch {q(str(job.script))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
