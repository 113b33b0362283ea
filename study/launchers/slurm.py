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
from pathlib import Path
from typing import NoReturn

from study.launchers.slurm_script import SlurmJob, render
from study.spec.spec import SpecError, StudySpec, list_specs, load_spec
from study.storage.commands import command_name
from study.storage.storage import (
    StorageError,
    check_reachable,
    check_writable,
    expand_storage,
    is_remote,
    is_shared,
)

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
        metavar="URI",
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
    p.add_argument("--num-samples", type=int, metavar="N", help="number of trials (default: the spec's)")
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


def _check_args(args: argparse.Namespace) -> None:
    """The counts, the time limit and the sbatch options of ``args``, or `SlurmError` at the first
    bad one; and sbatch on the PATH unless ``--dry-run``."""
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


def _cpus_per_node(spec: StudySpec, args: argparse.Namespace, notes: list[str]) -> int:
    """The CPUs each node gives trials (``--cpus-per-node`` or `_cpus`), once the spec's GPUs and
    CPUs per trial are checked against what the nodes have (`SlurmError` where they do not fit)."""
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
    cpus: int | None = args.cpus_per_node
    if cpus is None:
        cpus = _cpus(spec, args.nodes, args.gpus_per_node)
    if spec.resources.cpu > cpus:
        raise SlurmError(
            f"spec {spec.name!r} gives each trial {spec.resources.cpu:g} CPUs, "
            f"more than --cpus-per-node {cpus}"
        )
    return cpus


def plan(args: argparse.Namespace, notes: list[str] | None = None) -> SlurmJob:
    """The job the arguments ask for, or `SlurmError` at the first problem (nothing written yet).
    ``notes`` collects what the user should know but that is not an error."""
    notes = [] if notes is None else notes
    _check_args(args)
    storage = _storage(args.storage, args.nodes)
    try:
        spec = load_spec(args.spec).with_overrides(
            name=args.name, num_samples=args.num_samples, storage=storage
        )
    except SpecError as e:
        raise SlurmError(str(e)) from None
    cpus = _cpus_per_node(spec, args, notes)
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
