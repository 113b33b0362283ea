"""``ponder-study``: run, resume, inspect and export hyperparameter studies of PonderNet.

Exit codes: 0 done, 1 an error or errored trials (one line, the traceback in a log file, and
the command to continue), 2 bad input (one line on stderr says what and how to fix it), 130
the study was stopped by a signal (Ctrl-C, SIGTERM, SIGHUP) and can be resumed, 141 the
output's reader went (``| head`` that has its lines, a pager that quit): a study stopped so can be
resumed, and the other verbs end in silence, as ``cat`` does.

One `Command` per verb, each with its arguments beside what it does (`study.cli.drive`: run and
resume; `study.cli.read`: the verbs that read a study; `study.cli.specs`: those about a spec;
`study.cli.jobs`: a study sent to a cluster's job server),
listed once in `COMMANDS`, which `build_parser` and `main` go through.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from study.cli.base import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OUTPUT_CLOSED,
    EXIT_USAGE,
    PROG,
    Command,
    Parser,
    Versions,
    WordsCommand,
    caused_by_ctrl_c,
    fail,
    output_closed,
    storage_arg,
)
from study.cli.drive import Resume, Run
from study.cli.jobs import Submit
from study.cli.read import Evaluate, Export, List, Report, Status
from study.cli.specs import Check, Schema, Slurm
from study.reports.summary import summary
from study.spec.spec import SpecError, check_name
from study.storage.commands import run_again
from study.storage.hints import resume_command

__all__ = ["COMMANDS", "Command", "build_parser", "entry", "main", "resume_command", "summary"]

COMMANDS: tuple[Command, ...] = (
    Run(),
    Resume(),
    Status(),
    Export(),
    Report(),
    Evaluate(),
    List(),
    Check(),
    Slurm(),
    Submit(),
    Schema(),
)
"""Every verb, in the order ``--help`` lists them."""

_BY_NAME = {command.name: command for command in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser, with one sub-command per verb."""
    parser = Parser(
        prog=PROG,
        description="Hyperparameter studies of PonderNet on Ray Tune: Optuna proposes lambda_p, beta and "
        "max_steps, ASHA stops poor trials early, every trial and report lands in Parquet.",
        epilog="Results: <storage>/trials/study=<name>/ (one row per trial) and "
        "<storage>/history/study=<name>/ (one row per report); "
        "read them with pandas.read_parquet('<storage>/trials').",
    )
    parser.add_argument(
        "--version",
        action=Versions,
        help="print the versions of ponder-study and of what it runs on (torch, Ray, Optuna, ...) and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for command in COMMANDS:
        command.add_arguments(
            sub.add_parser(
                command.name, help=command.help, description=command.description, add_help=command.add_help
            )
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    own = _BY_NAME.get(words[0]) if words else None
    if isinstance(
        own, WordsCommand
    ):  # `slurm`: study.launchers.slurm's own parser, before ours reads anything
        _check_the_current_folder()
        return own.run_words(words[1:])
    args = build_parser().parse_args(argv)  # --help and --version answer wherever the shell is
    _check_the_current_folder()
    command = _BY_NAME[args.command]
    args.storage = storage_arg(args)
    name = getattr(args, "name", None) if command.names_a_study else None
    if name is not None:
        try:
            check_name(name, "name")
        except SpecError as e:
            fail(str(e))
    return command.run(args)


def _check_the_current_folder() -> None:
    """Refuse to start in a folder that was deleted or moved away under the shell: relative paths
    (the default storage) and Ray's own start (`ray.init` reads it) would fail later, less
    clearly, a `run` after its study had begun."""
    try:
        os.getcwd()
    except FileNotFoundError:
        fail(
            "the current folder no longer exists (deleted or moved since this shell entered it); "
            "cd to a folder that exists and run this again"
        )


def _unanswered(error: OSError, code: int) -> int:
    """The exit code after an I/O error no verb answered, ``code`` the one so far: 141 in
    silence when stdout's reader has gone (`cat file | head` ends so), else one line on stderr
    and 1 (output written to a full disk, say), unless ``code`` already says what went wrong."""
    if output_closed(error):
        return code or EXIT_OUTPUT_CLOSED
    if code == 0:
        print(f"{PROG}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_ERROR
    return code


def entry() -> NoReturn:
    """The ``ponder-study`` command: `main`, then an exit that skips the interpreter's C-level
    teardown.

    With libtorch and pyarrow in one process, that teardown sometimes aborts ("terminate called
    without an active exception", exit 134): a pyarrow thread-pool worker is unwound through a
    noexcept C++ frame while the interpreter finalizes (importing torch and pyarrow and reading a
    Parquet file is enough, now and then). Python's own exit work still runs
    (atexit handlers, Ray's shutdown among them; logging and the standard streams are flushed);
    only the C++ static teardown is skipped."""
    try:
        code = main()
    except SystemExit as e:  # fail and argparse exit this way
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except (KeyboardInterrupt, RuntimeError) as e:  # a Ctrl-C before a command's own handling began
        if not caused_by_ctrl_c(e):  # (also one wrapped by an import's class body), else a bug
            raise
        print(f"{PROG}: interrupted before it started; run it again: {run_again()}", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except OSError as e:  # one no verb answered: its output's reader gone, or a full disk under it
        code = _unanswered(e, 0)
    import atexit
    import logging

    # a second Ctrl-C here (Ray shutting down) must not turn a clean stop into a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    logging.shutdown()
    try:
        sys.stdout.flush()  # what was printed last is written now: its reader may have gone
    except OSError as e:
        code = _unanswered(e, code)
    sys.stderr.flush()
    os._exit(code)
