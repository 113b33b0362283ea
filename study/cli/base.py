"""What every ``ponder-study`` verb is made of: the `Command` base class, argparse as the CLI
wants it (one-line errors, help wrapped at spaces), the options several verbs share, and the
checks of ``--storage`` every verb that reads or writes a study makes first."""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, NoReturn

from study.run.stops import caused_by_ctrl_c
from study.storage.commands import PROG
from study.storage.hints import DEFAULT_STORAGE, STORAGE_ENV

__all__ = [
    "EXIT_CODES",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OUTPUT_CLOSED",
    "EXIT_USAGE",
    "PROG",
    "STORAGE_ENV",
    "Command",
    "Parser",
    "Versions",
    "WordsCommand",
    "add_address",
    "add_storage",
    "caused_by_ctrl_c",
    "fail",
    "must_exist",
    "output_closed",
    "reach",
    "refusing",
    "storage_arg",
]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_OUTPUT_CLOSED = 141
"""128 + SIGPIPE: what a shell reports for ``cat file | head`` once ``head`` has exited."""
EXIT_CODES = {
    0: "done (`status --watch` left with Ctrl-C too)",
    EXIT_ERROR: "an error (a full disk, a storage outage, a bug: one line naming it, a study's traceback "
    "kept in `studies/<name>/logs/`), or a study that ended with errored trials, which `resume` retries",
    EXIT_USAGE: "bad input, refused before Ray starts (an unknown spec key, a range outside the config's, "
    "an existing name for `run`, a storage that cannot be reached, a study another driver holds): one line "
    "on stderr naming the key and the fix; nothing on disk changed",
    EXIT_INTERRUPTED: "stopped by Ctrl-C, `kill` (SIGTERM) or a closed terminal (SIGHUP), at any moment; "
    "the last line is the command that continues (the same command for a verb that only reads)",
    EXIT_OUTPUT_CLOSED: "the output's reader went (`| head` that has its lines, a pager that quit): `run` "
    "and `resume` stop resumable and say so on stderr; the other verbs end in silence, as `cat` does",
}
"""Every exit code of ``ponder-study`` and what it means (the CLI reference is generated from it)."""


class Command:
    """One verb of ``ponder-study``: its name and help, its arguments, and what it does.

    `main` builds one sub-command per entry of its registry and hands the parsed arguments to
    the chosen one's `run`; ``args.storage`` is by then --storage (or ``$PONDER_STUDY_STORAGE``)
    expanded and checked, None when neither is set."""

    name: ClassVar[str]
    help: ClassVar[str]
    description: ClassVar[str]
    add_help: ClassVar[bool] = True
    names_a_study: ClassVar[bool] = True
    """Whether ``args.name`` (where the verb has one) is an existing study's name, checked as one
    before `run`; ``run --name`` names a new study, checked with its spec."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this verb's arguments to its sub-command's parser."""

    def run(self, args: argparse.Namespace) -> int:
        """Do what the verb does; returns the exit code (bad input exits 2 through `fail`)."""
        raise NotImplementedError


class WordsCommand(Command):
    """A verb with its own parser: `main` hands it its words before parsing anything, and the
    registry's sub-command is only there for the top-level ``--help``."""

    def run_words(self, words: list[str]) -> int:
        """Parse ``words`` (what follows the verb) and do what the verb does; the exit code."""
        raise NotImplementedError

    def run(self, args: argparse.Namespace) -> int:
        raise AssertionError(f"`main` hands `{self.name}` its words before parsing")


class _Formatter(argparse.HelpFormatter):
    """argparse's help, wrapped at spaces only: a spec's name (``ponder-honest-search``) is never
    split at its hyphens across two lines."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = self._split_lines(text, width - len(indent))
        return "\n".join(indent + line for line in lines)


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (what is wrong, where to look), exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


_output_closed = False


def output_closed(error: BaseException) -> bool:
    """Whether ``error`` is stdout's reader gone (``| head`` that has read its lines, a pager that
    quit), not a broken connection to a storage or to Ray. If so, stdout now goes to /dev/null,
    so that nothing later (the exit's flush included) fails on it again."""
    global _output_closed
    if not isinstance(error, BrokenPipeError):
        return False
    if _output_closed:
        return True
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        gone = any(events & select.POLLERR for _, events in poll.poll(0))  # a pipe with no reader
    except (OSError, ValueError, AttributeError):  # no stdout, or one without a descriptor
        return False
    if gone:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
        _output_closed = True
    return gone


def fail(message: str) -> NoReturn:
    """Refuse bad input: one line on stderr, exit code 2."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


@contextlib.contextmanager
def refusing(*errors: type[Exception]) -> Iterator[None]:
    """Any of ``errors`` raised inside is bad input: its message refused in one line (`fail`)."""
    try:
        yield
    except errors as e:
        fail(str(e))


class Versions(argparse.Action):
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


def add_storage(parser: argparse.ArgumentParser, from_spec: bool = False) -> None:
    """``--storage``; ``from_spec``: the verb reads a spec, whose [run] storage is the default."""
    fallback = "the spec's [run] storage" if from_spec else f"{DEFAULT_STORAGE} (the spec is not read)"
    parser.add_argument(
        "--storage",
        default=None,
        metavar="URI",
        help="where studies live: a local directory, or for a multi-node cluster shared storage: "
        "s3://bucket/prefix, gs://..., or file:///mnt/nfs/... for a filesystem every node mounts; "
        f"~ and $VARS are expanded (default: ${STORAGE_ENV}, else {fallback})",
    )


def add_address(parser: argparse.ArgumentParser) -> None:
    """``--address``: the Ray cluster a run or resume joins."""
    parser.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join ('auto' for the cluster this machine is part of); "
        "default: $RAY_ADDRESS, else a local Ray instance",
    )


def storage_arg(args: argparse.Namespace) -> str | None:
    """--storage, else $PONDER_STUDY_STORAGE, expanded and checked; None when neither is set."""
    from study.storage.storage import StorageError, expand_storage

    value: str | None = getattr(args, "storage", None)
    where = "--storage"
    if value is None and os.environ.get(STORAGE_ENV, "").strip():
        value, where = os.environ[STORAGE_ENV], f"${STORAGE_ENV}"
    if value is None:
        return None
    if not value.strip():
        fail(f"{where} must not be empty")
    try:
        return expand_storage(value)
    except StorageError as e:
        fail(f"{where}: {e}")


def reach(storage: str, write: bool = False) -> None:
    """Refuse, in one line, a storage that cannot be reached (or, with ``write``, written)."""
    from study.storage.storage import StorageError, check_reachable, check_writable

    try:
        check_reachable(storage)
        if write:
            check_writable(storage)
    except StorageError as e:
        fail(str(e))


def must_exist(storage: str, given: bool) -> None:
    """Refuse, in one line, a local storage to read studies from that is not a folder: without
    this a typo or a file answered "no study named ..." (or, for ``list``, none yet, exit 0).
    ``given``: the storage was named (--storage or its variable), not the default."""
    from study.storage.storage import is_remote

    if is_remote(storage):  # an object store has no folders: check_reachable checks its bucket
        return
    path = Path(storage.removeprefix("file://"))
    try:
        if path.is_dir():
            return
        exists = path.exists()
    except OSError as e:
        fail(f"storage {storage} cannot be read ({e.strerror or e}); give the folder your studies are in")
    state = "is a file, not a folder" if exists else "does not exist"
    if given:
        fail(f"storage {storage} {state}; give the folder your studies are in")
    fail(
        f"storage {storage} (the default, no --storage given) {state} here; run from the folder "
        "your studies were started in, or give --storage"
    )
