"""``ponder-study``: run, resume, inspect and export hyperparameter studies of PonderNet.

Exit codes: 0 done, 1 an error or errored trials (one line, the traceback in a log file, and
the command to continue), 2 bad input (one line on stderr says what and how to fix it), 130
the study was stopped by a signal (Ctrl-C, SIGTERM, SIGHUP) and can be resumed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from study.commands import command_name, run_again
from study.lease import LeaseHeld
from study.spec import SpecError, StudySpec, check_name, list_specs, load_spec
from study.stops import raise_a_swallowed_stop
from study.storage import StudyPaths, list_studies, nearest_existing, read_study_table

__all__ = ["build_parser", "main"]

PROG = "ponder-study"
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEFAULT_STORAGE = "results"
STORAGE_ENV = "PONDER_STUDY_STORAGE"
SUMMARY_COLUMNS = [
    "trial_id",
    "status",
    "lambda_p",
    "beta",
    "max_steps",
    "iteration",
    "test/halted_accuracy",
    "test/mean_halting_step",
    "nan_events",
    "pareto",
]


class _Formatter(argparse.HelpFormatter):
    """argparse's help, wrapped at spaces only: a spec's name (``ponder-honest-search``) is never
    split at its hyphens across two lines."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = self._split_lines(text, width - len(indent))
        return "\n".join(indent + line for line in lines)


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (what is wrong, where to look), exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


class _Versions(argparse.Action):
    """``--version``, printed when asked for (argparse's own action wraps the line at the
    terminal's width, and would read every package's metadata for every command)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(_versions())
        parser.exit()


def _versions() -> str:
    """``ponder-study X (torch ..., ray ..., ...)``: what a bug report needs, read from the installed
    packages' metadata (nothing imported)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    deps = ", ".join(f"{p} {of(p)}" for p in ("torch", "ray", "optuna", "pyarrow", "pandas"))
    return f"{PROG} {of('ponder-study')} ({deps}; Python {sys.version.split()[0]})"


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser, with one sub-command per verb."""
    parser = _Parser(
        prog=PROG,
        description="Hyperparameter studies of PonderNet on Ray Tune: Optuna proposes lambda_p, beta and "
        "max_steps, ASHA stops poor trials early, every trial and report lands in Parquet.",
        epilog="Results: <storage>/trials/study=<name>/ (one row per trial) and "
        "<storage>/history/study=<name>/ (one row per report); "
        "read them with pandas.read_parquet('<storage>/trials').",
    )
    parser.add_argument(
        "--version",
        action=_Versions,
        help="print the versions of ponder-study and of what it runs on (torch, Ray, Optuna, ...) and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    def storage(p: argparse.ArgumentParser, from_spec: bool = False) -> None:
        fallback = "the spec's [run] storage" if from_spec else f"{DEFAULT_STORAGE} (the spec is not read)"
        p.add_argument(
            "--storage",
            default=None,
            help="where studies live: a local directory, or for a multi-node cluster shared storage: "
            "s3://bucket/prefix, gs://..., or file:///mnt/nfs/... for a filesystem every node mounts; "
            f"~ and $VARS are expanded (default: ${STORAGE_ENV}, else {fallback})",
        )

    def address(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--address",
            default=None,
            help="Ray cluster to join ('auto' for the cluster this machine is part of); "
            "default: $RAY_ADDRESS, else a local Ray instance",
        )

    run = sub.add_parser(
        "run", help="start a new study from a spec", description="Start a new study from a spec."
    )
    run.add_argument("spec", help=f"a shipped spec ({', '.join(list_specs())}) or a path to a .toml file")
    run.add_argument("--name", help="the study's name (default: the spec's name); must be new")
    run.add_argument("--num-samples", type=int, help="number of trials (default: the spec's)")
    storage(run, from_spec=True)
    address(run)
    run.add_argument("--quiet", action="store_true", help="no progress table, just the summary")
    run.add_argument(
        "--warm-start",
        metavar="STUDY",
        help="an earlier study (same storage) whose best trials, by its own objective, are this study's "
        "first trials (only the fields this spec searches; a trial with a value outside this spec's "
        "space is skipped, with a note saying what to widen)",
    )
    run.add_argument(
        "--top", type=int, default=5, metavar="K", help="how many of --warm-start's best trials (default: 5)"
    )

    resume = sub.add_parser(
        "resume",
        help="finish an interrupted study",
        description="Finish an interrupted study: finished trials are not run again, unfinished ones "
        "continue from their last checkpoint, Optuna's and ASHA's state are kept.",
    )
    resume.add_argument("name", help="the study's name")
    storage(resume)
    address(resume)
    resume.add_argument(
        "--more",
        type=int,
        default=None,
        metavar="N",
        help="add N trials to the study, finished or not: Optuna's sampler goes on with every earlier "
        "trial, ASHA's rungs keep their results, finished trials do not run again",
    )
    resume.add_argument(
        "--quiet",
        action="store_true",
        help="no progress table if Tune had saved nothing yet; a restored study keeps the setting "
        "it was started with (run --quiet)",
    )

    status = sub.add_parser(
        "status",
        help="trials by status, the best trial, which searched field mattered; --watch: live",
        description="Trials by status and the top trials (from the Parquet, rewritten as trials end), "
        "then which searched field mattered for the objective (Optuna's fANOVA importance from the "
        "study's journal, once enough trials have ended). --watch shows every trial as it runs instead, "
        "from what Tune has written so far (each trial's result.json), without starting Ray.",
    )
    status.add_argument("name", help="the study's name")
    storage(status)
    status.add_argument(
        "--watch",
        action="store_true",
        help="redraw every trial, running ones included (iteration, objective, NaN events, mean halting "
        "step, ASHA rung), every --interval seconds until Ctrl-C; one snapshot per refresh when "
        "stdout is not a terminal",
    )
    status.add_argument(
        "--interval", type=float, default=None, metavar="S", help="seconds between refreshes (default: 2)"
    )

    export = sub.add_parser(
        "export",
        help="rewrite a study's Parquet from its Tune experiment",
        description="Rewrite a study's Parquet from its Tune experiment on disk (no trial runs).",
    )
    export.add_argument("name", help="the study's name")
    storage(export)

    report = sub.add_parser(
        "report",
        help="plots of a study: PNGs and an index.html",
        description="Write a study's plots (sensitivity to lambda_p, accuracy against thinking time with "
        "the Pareto front, the best trial's halting distribution against the geometric prior, per-step "
        "accuracy, learning curves, how far ASHA let each trial run) as PNGs and one index.html.",
    )
    report.add_argument("name", help="the study's name")
    storage(report)
    report.add_argument("--out", help="the report's directory (default: <storage>/reports/<name>)")

    evaluate = sub.add_parser(
        "evaluate",
        help="evaluate a trial's checkpoint with early exit",
        description="Load a trial's last checkpoint (weights only) and evaluate it on the task's "
        "evaluation sets with real early exit (the step function runs until every sample has halted); "
        "print accuracy, mean halting step and wall time against the full unroll of max_steps.",
    )
    evaluate.add_argument("name", help="the study's name")
    evaluate.add_argument("--trial", help="a trial id (default: the study's best trial)")
    evaluate.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    evaluate.add_argument(
        "--repeats", type=int, default=3, help="time each pass this many times, keep the best (default: 3)"
    )
    storage(evaluate)

    lst = sub.add_parser(
        "list",
        help="the shipped specs and the studies under --storage",
        description="List the shipped specs, each with its one-line description (what `run` takes: "
        "a name here, or the path of a spec file of your own), and the studies started under the "
        "storage, which `status`, `resume`, `report` and `evaluate` take by name.",
    )
    storage(lst)

    check = sub.add_parser(
        "check",
        help="validate a spec and say what running it would do (no Ray)",
        description="Validate a spec without starting Ray and print what `run` would do: the search "
        "space, the trial count, the budget in trial-iterations, resources, trials at once, where the "
        "results go, and a wall-time estimate from a few iterations timed on this machine.",
    )
    check.add_argument("spec", help="a shipped spec or a path to a .toml file")
    storage(check, from_spec=True)
    check.add_argument(
        "--no-estimate", action="store_true", help="skip timing a few training iterations (no torch)"
    )

    sub.add_parser(  # a stub for --help: `main` hands `slurm` to study.slurm before parsing
        "slurm",
        help="write a Slurm batch script for a study and submit it with sbatch (docs/slurm.md)",
        description="Write a Slurm batch script that runs a study on the allocation's nodes (a Ray "
        "head on the first, a worker on each other) and submit it with sbatch; with --requeue the "
        "study goes on over as many allocations as it needs (docs/slurm.md).",
        add_help=False,
    )
    sub.add_parser(
        "schema",
        help="print the JSON Schema of a spec (for editors: taplo, Even Better TOML)",
        description="Print the JSON Schema of a spec's TOML, generated from the spec's models; the "
        "shipped copy is study/specs/spec.schema.json, which every shipped spec names on its first "
        "line (#:schema ./spec.schema.json).",
    )
    return parser


def _trials(paths: StudyPaths) -> pd.DataFrame | None:
    """The study's trials table, an older schema's config nulls filled from the config's defaults."""
    from study.parquet import fill_config_defaults

    table = read_study_table(paths, "trials")
    return None if table is None else fill_config_defaults(table.to_pandas())


def _count(n: int, noun: str) -> str:
    """``1 plot``, ``2 plots``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def resume_command(name: str, storage: str) -> str:
    """The exact command that continues a study, quoted for a POSIX shell (`command_name`)."""
    command = f"{command_name()} resume {shlex.quote(name)}"
    if storage != DEFAULT_STORAGE:
        command += f" --storage {shlex.quote(storage)}"
    return command


def _warm_start(name: str, storage: str, spec: StudySpec, top: int) -> list[dict[str, object]]:
    from study.records import load_study_spec
    from study.warmstart import warm_start_points

    earlier, paths = load_study_spec(name, storage)
    table = read_study_table(paths, "trials")
    if table is None:
        raise SpecError(
            f"--warm-start {name}: it has no Parquet yet under {storage}; "
            f"run `{command_name()} export {name}`"
        )
    start = warm_start_points(spec, earlier, table.to_pandas(), top, name)
    if (note := start.note(name)) is not None:
        print(note)
    n, ids = len(start.points), ", ".join(start.trial_ids)
    print(f"warm start: {_count(n, 'best trial')} of {name} ({ids}) go{'es' if n == 1 else ''} first")
    if start.left_out:
        print(f"warm start: not searched here, so left out: {', '.join(start.left_out)}")
    return start.points


def summary(paths: StudyPaths, metric: str = "test/halted_accuracy", mode: str = "max", top: int = 10) -> str:
    """Trials by status, the top trials by ``metric`` (``mode``: which end is the top) among those
    that ended with a result, then the others (running ones first, by ``metric``: a study in
    progress shows its leaders without ranking them), from the study's Parquet.

    The study's end records are the truth: a trial they hold that the Parquet lacks or shows
    running (a driver stopped before it rewrote the Parquet) is shown ended, from its record."""
    df, stale = _with_end_records(_trials(paths), paths)
    if df is None or df.empty:
        return f"study {paths.name}: no trial has finished yet"
    df = _started_shown_running(df)
    counts = df["status"].value_counts()
    lines = [
        f"study {paths.name}: {_count(len(df), 'trial')}: " + ", ".join(f"{n} {s}" for s, n in counts.items())
    ]
    columns = [c for c in dict.fromkeys([*SUMMARY_COLUMNS, metric]) if c in df.columns]
    from study.parquet import leaderboard, ranked_trials  # the report's and evaluate's order

    ranked = ranked_trials(df, metric, mode)
    best = ranked.head(top)[columns]
    rest = leaderboard(df.drop(index=ranked.index), metric, mode).head(top)[columns]
    with pd.option_context(
        "display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format
    ):
        if best.empty:
            lines.append(f"no trial has ended with a result for {metric} yet")
        else:
            lines.append(f"top {len(best)} by {metric}:")
            lines.append(best.to_string(index=False))
        if not rest.empty:
            lines.append(f"{len(df) - len(ranked)} not ranked (no final result):")
            lines.append(rest.to_string(index=False))
    lines.append(f"Parquet: {paths.trials_parquet}  (history: {paths.history_parquet})")
    if stale:
        lines.append(
            f"{_count(stale, 'ended trial')} {'is' if stale == 1 else 'are'} not in the Parquet yet "
            "(a driver stopped before writing it): "
            f"`{command_name()} export {shlex.quote(paths.name)}"
            + (f" --storage {shlex.quote(paths.root)}`" if paths.root != DEFAULT_STORAGE else "`")
            + " writes them"
        )
    return "\n".join(lines)


def _started_shown_running(df: pd.DataFrame) -> pd.DataFrame:
    """A ``pending`` trial that has reported is shown ``running``: Tune saves a running trial as
    pending, so an interrupted study's Parquet holds its running trials as pending."""
    if "iteration" not in df.columns:
        return df
    started = (df["status"] == "pending") & (pd.to_numeric(df["iteration"], errors="coerce") > 0)
    if not started.any():
        return df
    df = df.copy()
    df.loc[started, "status"] = "running"
    return df


def _with_end_records(df: pd.DataFrame | None, paths: StudyPaths) -> tuple[pd.DataFrame | None, int]:
    """The trials table with every end record's trial shown ended; how many it had to mend."""
    from study.records import read_end_records

    ends = read_end_records(paths)
    if not ends:
        return df, 0
    shown = {} if df is None else dict(zip(df["trial_id"], df["status"], strict=True))
    mend = [
        e for e in ends.values() if shown.get(e.trial_id) not in ("completed", "early_stopped", "diverged")
    ]
    if not mend:
        return df, 0
    rows = []
    for e in mend:
        row = {k: v for k, v in e.last_result.items() if not isinstance(v, (dict, list))}
        row.update({k: v for k, v in e.config.items() if not isinstance(v, (dict, list))})
        row.update(trial_id=e.trial_id, status=e.outcome, iteration=e.iteration)
        rows.append(row)
    extra = pd.DataFrame(rows)
    if df is None:
        return extra, len(mend)
    kept = df[~df["trial_id"].isin([e.trial_id for e in mend])]
    return pd.concat([kept, extra[[c for c in extra.columns if c in df.columns]]], ignore_index=True), len(
        mend
    )


def _list(storage: str) -> str:
    """The shipped specs and the studies under ``storage``, names in one column as wide as the longest."""
    specs, studies = list_specs(), list_studies(storage)
    width = max(len(name) for name in [*specs, *studies])
    lines = ["specs (ponder-study run SPEC):"]
    for name in specs:
        lines.append(f"  {name:{width}s} {load_spec(name).description}")
    lines.append(f"studies under {storage}:" if studies else f"no studies under {storage} yet")
    for name in studies:
        df = _trials(StudyPaths(storage, name))
        counts = "" if df is None else ", ".join(f"{n} {s}" for s, n in df["status"].value_counts().items())
        lines.append(f"  {name:{width}s} {counts or 'no trial finished yet'}")
    return "\n".join(lines)


EXIT_ERROR = 1


def entry() -> NoReturn:
    """The ``ponder-study`` command: `main`, then an exit that skips the interpreter's C-level
    teardown.

    With libtorch and pyarrow in one process, that teardown sometimes aborts ("terminate called
    without an active exception", exit 134): a pyarrow thread-pool worker is unwound through a
    noexcept C++ frame while the interpreter finalizes. Three lines reproduce it (import torch,
    import pyarrow, read a Parquet file; about 4 exits in 10 on a loaded 2-core machine; once
    in a whole test suite without torch, with pyarrow and pandas alone). Python's own exit work
    still runs (atexit handlers, Ray's shutdown among them; logging and the standard streams are
    flushed); only the C++ static teardown is skipped."""
    try:
        code = main()
    except SystemExit as e:  # _fail and argparse exit this way
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:  # before a command's own handling began (its arguments being read)
        print(f"{PROG}: interrupted before it started; run it again: {run_again()}", file=sys.stderr)
        code = EXIT_INTERRUPTED
    import atexit
    import logging

    # a second Ctrl-C here (Ray shutting down) must not turn a clean stop into a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _storage_arg(args: argparse.Namespace) -> str | None:
    """--storage, else $PONDER_STUDY_STORAGE, expanded and checked; None when neither is set."""
    from study.storage import StorageError, expand_storage

    value: str | None = getattr(args, "storage", None)
    where = "--storage"
    if value is None and os.environ.get(STORAGE_ENV, "").strip():
        value, where = os.environ[STORAGE_ENV], f"${STORAGE_ENV}"
    if value is None:
        return None
    if not value.strip():
        _fail(f"{where} must not be empty")
    try:
        return expand_storage(value)
    except StorageError as e:
        _fail(f"{where}: {e}")


def _reach(storage: str, write: bool = False) -> None:
    """Refuse, in one line, a storage that cannot be reached (or, with ``write``, written)."""
    from study.storage import StorageError, check_reachable, check_writable

    try:
        check_reachable(storage)
        if write:
            check_writable(storage)
    except StorageError as e:
        _fail(str(e))


def _must_exist(storage: str, given: bool) -> None:
    """Refuse, in one line, a local storage to read studies from that is not a folder: without
    this a typo or a file answered "no study named ..." (or, for ``list``, none yet, exit 0)."""
    from study.storage import is_remote

    if is_remote(storage):  # an object store has no folders: check_reachable checks its bucket
        return
    path = Path(storage.removeprefix("file://"))
    try:
        if path.is_dir():
            return
        exists = path.exists()
    except OSError as e:
        _fail(f"storage {storage} cannot be read ({e.strerror or e}); give the folder your studies are in")
    state = "is a file, not a folder" if exists else "does not exist"
    if given:
        _fail(f"storage {storage} {state}; give the folder your studies are in")
    _fail(
        f"storage {storage} (the default, no --storage given) {state} here; run from the folder "
        "your studies were started in, or give --storage"
    )


def _check_device(device: str) -> None:
    """What torch can run on here, checked before a checkpoint is loaded."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        _fail(f"--device {device!r} is not a device; use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            _fail(f"--device {device}: CUDA is not available on this machine; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            _fail(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        _fail(f"--device {device!r}: ponder-study evaluates on cpu or cuda, not {dev.type}")


_NEARLY_FULL = 1 << 20
"""Free bytes under which a local storage's disk is taken as full, whatever the error said."""


def _full_disk(error: BaseException, storage: str | None) -> tuple[str, str] | None:
    """(where, how much is free) if ``error`` came from a full disk: an ENOSPC in the error or
    one it was raised from (free then ""), or a local storage left with under 1 MiB free."""
    import errno

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return str(seen.filename or storage or "the storage"), ""
        seen = seen.__cause__ or seen.__context__
    if storage is None or "://" in storage:
        return None
    try:
        fs = os.statvfs(nearest_existing(storage))
    except OSError:
        return None
    if fs.f_blocks == 0:  # a pseudo filesystem (/proc, /sys) has no blocks at all: not a full one
        return None
    free = fs.f_bavail * fs.f_frsize
    return (storage, f"{free // 1024} KiB free") if free < _NEARLY_FULL else None


def _log_failure(name: str | None, storage: str | None) -> str:
    """The current exception's traceback in a log file, under the study where possible."""
    import tempfile
    import traceback
    from datetime import UTC, datetime

    text = traceback.format_exc()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if name and storage and "://" not in storage:
        try:
            logs = Path(StudyPaths(storage, name).study_dir) / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            path = logs / f"driver-{stamp}-{os.getpid()}.log"
            path.write_text(text)
            return str(path)
        except OSError:
            pass
    fd, path_str = tempfile.mkstemp(prefix=f"ponder-study-{name or 'error'}-{stamp}-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path_str


def _as_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM (a job scheduler, `kill`) and SIGHUP (a closed terminal) stop a study as Ctrl-C
    does: Tune saves its state and the study can be resumed."""
    signal.raise_signal(signal.SIGINT)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["slurm"]:  # its own parser and checks, on a login node: no Ray, no torch
        from study.slurm import main as slurm_main

        return slurm_main(words[1:])
    args = build_parser().parse_args(argv)
    storage_arg = _storage_arg(args)
    name = getattr(args, "name", None) if args.command != "run" else None
    if name is not None:
        try:
            check_name(name, "name")
        except SpecError as e:
            _fail(str(e))
    if args.command in ("run", "resume"):
        return _drive(args, storage_arg, argv)
    if args.command == "schema":
        from study.spec import schema_text

        print(schema_text(), end="")
        return 0
    if args.command == "check":
        from study.check import check_spec

        try:
            print(check_spec(args.spec, storage_arg, estimate=not args.no_estimate))
        except SpecError as e:
            _fail(str(e))
        return 0
    try:
        return _read(args, storage_arg or DEFAULT_STORAGE, given=storage_arg is not None)
    except KeyboardInterrupt:  # these commands change no study: running them again is the cure
        # (a report is written plot by plot: stopped part-way, its folder mixes old and new ones)
        left = "; the report is incomplete" if args.command == "report" else ""
        print(f"{PROG}: interrupted{left}; run it again: {run_again()}", file=sys.stderr)
        return EXIT_INTERRUPTED


def _read(args: argparse.Namespace, storage: str, given: bool = True) -> int:
    """The commands that read a study (and ``export``, which rewrites its Parquet). ``given``:
    the storage was named (--storage or its variable), not the default."""
    _reach(storage)
    if given or args.command != "list":  # a fresh clone's `list`: the specs, and no studies yet
        _must_exist(storage, given)
    # each command imports what it needs (Ray only where it runs trials); their input errors,
    # one line each, are caught below once their module is loaded
    refused: tuple[type[Exception], ...] = (SpecError, LeaseHeld)
    try:
        if args.command == "list":
            print(_list(storage))
            return 0
        if args.command == "report":
            from study.report import ReportError, write_report

            refused += (ReportError,)
            out = os.path.expanduser(args.out) if args.out else None
            if out is not None and Path(out).exists() and not Path(out).is_dir():
                _fail(f"--out {args.out} is a file; give a directory (it is created if missing)")
            written = write_report(args.name, storage, out=out)
            empty = (
                f" ({len(written.missing)} without data: {', '.join(written.missing)})"
                if written.missing
                else ""
            )
            print(f"wrote {_count(written.drawn, 'plot')}{empty} and {written.index}")
            if written.importance is not None:
                print("\n".join(written.importance.lines()))
            return 0
        if args.command == "evaluate":
            from study.trial_choice import EvaluateError, choose_trial

            refused += (EvaluateError,)
            if args.repeats < 1:
                _fail(f"--repeats must be >= 1, got {args.repeats}")
            chosen = choose_trial(args.name, storage, args.trial)  # a wrong name: answered without torch
            _check_device(args.device)
            from study.evaluate import evaluate_trial, format_evaluation

            result = evaluate_trial(
                args.name, storage, args.trial, device=args.device, repeats=args.repeats, chosen=chosen
            )
            print(format_evaluation(result))
            return 0
        from study.records import StudyError, load_study_spec

        refused += (StudyError,)
        if args.command == "export":
            from study import runner  # imports Ray (without starting it): Tune reads its experiment

            paths = runner.export(args.name, storage)
            print(f"wrote {paths.trials_parquet} and {paths.history_parquet}")
            return 0
        if args.interval is not None and not (args.interval > 0 and args.interval < 86400):
            _fail(f"--interval must be a number of seconds above 0, got {args.interval:g}")
        if args.interval is not None and not args.watch:
            _fail("--interval is for --watch: add --watch, or leave --interval out")
        spec, paths = load_study_spec(args.name, storage)  # status: the records alone, no Ray
        if args.watch:
            from study.live import DEFAULT_INTERVAL_S, watch

            return watch(spec, paths, args.interval or DEFAULT_INTERVAL_S)
        print(summary(paths, spec.metric, spec.mode))
        from study.importance import importances

        print("\n".join(importances(spec, paths).lines()))
        return 0
    except OSError as e:  # pyarrow's errors reaching a remote storage (credentials, bucket, network)
        _fail(f"could not read or write storage {storage}: {' '.join(str(e).split())}")
    except refused as e:
        _fail(str(e))


def _nothing_to_resume(name: str, storage: str) -> bool:
    """A finished study's summary and one line saying so, before Ray starts; False if the study
    has work left (or is not readable here: the resume then says what is wrong)."""
    from study.records import StudyError, finished_study, load_study_spec

    try:
        spec, paths = load_study_spec(name, storage)
        if not finished_study(paths, spec.search.num_samples):
            return False
    except (StudyError, SpecError, OSError, ValueError):
        return False
    print(summary(paths, spec.metric, spec.mode))
    n = spec.search.num_samples
    print(
        f"{PROG}: study {name!r} is finished ({_count(n, 'trial')}): nothing to resume; "
        f"to add trials: {resume_command(name, storage)} --more N"
    )
    return True


def _drive(args: argparse.Namespace, storage_arg: str | None, argv: Sequence[str] | None = None) -> int:
    """``run`` and ``resume``: however the driver stops, the study stays resumable, the exit code
    says how it stopped (0 done, 1 an error or errored trials, 2 bad input, 130 a signal), and the
    last line is the command that continues it. No traceback reaches the terminal: it is kept in
    a log file under the study, whose path the error line gives."""
    study: tuple[str, str] | None = None  # (name, storage) once known: what the hint resumes
    if args.command == "resume":
        study = (args.name, storage_arg or DEFAULT_STORAGE)
    handlers = {sig: signal.signal(sig, _as_ctrl_c) for sig in (signal.SIGTERM, signal.SIGHUP)}
    refused: tuple[type[Exception], ...] = (SpecError, LeaseHeld)

    def hint() -> str:
        return f"resume it with: {resume_command(*study)}" if study else f"run it again: {run_again()}"

    try:
        # the arguments and the spec first: bad input is refused before Ray is even imported
        # (0.7 s of a refusal's 1.2 s went to importing it, measured)
        if args.command == "run":
            if args.num_samples is not None and args.num_samples < 1:
                _fail(f"--num-samples must be >= 1, got {args.num_samples}")
            if args.top < 1:
                _fail(f"--top must be a positive integer, got {args.top}")
            spec = load_spec(args.spec).with_overrides(
                name=args.name, num_samples=args.num_samples, storage=storage_arg
            )
            storage = spec.run.storage
        else:
            if args.more is not None and args.more < 1:
                _fail(f"--more must be a positive integer, got {args.more}")
            storage = storage_arg or DEFAULT_STORAGE
        _reach(storage, write=True)
        if args.command == "resume":
            _must_exist(storage, storage_arg is not None)
            if not args.more and _nothing_to_resume(args.name, storage):
                return 0

        from study import runner  # imports Ray: only for the commands that need it
        from study.warmstart import WarmStartError

        raise_a_swallowed_stop()  # a Ctrl-C during those imports

        refused += (runner.StudyError, WarmStartError)
        if args.command == "run":
            points = _warm_start(args.warm_start, storage, spec, args.top) if args.warm_start else []
            study = (spec.name, storage)
            outcome = runner.run_study(
                spec,
                address=args.address,
                verbose=0 if args.quiet else 1,
                warm_start=points,
                resume_hint=resume_command(spec.name, storage),
            )
        else:
            outcome = runner.resume_study(
                args.name, storage, address=args.address, verbose=0 if args.quiet else 1, more=args.more or 0
            )
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; {hint()}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except refused as e:
        _fail(str(e))
    except Exception as e:  # a full disk, a storage outage, a bug: one line, the traceback kept
        log = _log_failure(*(study or (None, None)))
        what = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        if (full := _full_disk(e, study[1] if study else None)) is not None:
            where, free = full
            # a library that met the full disk first may have gone on and failed later, reading
            # a file the disk cut short (Tune's copy of its state, seen: a JSONDecodeError)
            what = f"no space left on the device of {where}" + (f" ({free}; then {what})" if free else "")
        print(f"{PROG}: error: {what} (traceback in {log}); once fixed, {hint()}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        for sig, previous in handlers.items():
            signal.signal(sig, previous)
        # Tune leaves its own Ctrl-C handler behind: a Ctrl-C at the summary is a plain interrupt
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        paths = outcome.paths
        print(summary(paths, outcome.spec.metric, outcome.spec.mode))
        errored = outcome.statuses.get("errored", 0)
        if errored:
            print(
                f"{PROG}: {_count(errored, 'trial')} errored (see their error column); {hint()}",
                file=sys.stderr,
            )
            return EXIT_ERROR
        if not outcome.finished:
            print(
                f"{PROG}: the study was interrupted before all its trials finished; {hint()}", file=sys.stderr
            )
            return EXIT_INTERRUPTED
        return 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; {hint()}", file=sys.stderr)
        return EXIT_INTERRUPTED
