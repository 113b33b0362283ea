"""The verbs that drive Tune: ``run`` starts a study, ``resume`` finishes one.

However the driver stops, the study stays resumable, the exit code says how it stopped (0 done,
1 an error or errored trials, 2 bad input, 130 a signal), and the last line is the command that
continues it. No traceback reaches the terminal: it is kept in a log file under the study, whose
path the error line gives. Bad input is refused before Ray is even imported (0.7 s of a
refusal's 1.2 s went to importing it, measured).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from study.api.driving import finished, start, warm_points
from study.cli.base import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OUTPUT_CLOSED,
    PROG,
    Command,
    add_address,
    add_storage,
    caused_by_ctrl_c,
    fail,
    must_exist,
    output_closed,
    reach,
)
from study.reports.summary import summary
from study.run.diskspace import full_disk
from study.run.lease import LeaseHeld
from study.run.stops import raise_a_swallowed_stop
from study.spec.spec import SpecError, StudySpec, list_specs, load_spec
from study.storage.commands import run_again
from study.storage.hints import DEFAULT_STORAGE, count, resume_command
from study.storage.storage import StudyPaths, has_scheme

if TYPE_CHECKING:
    from study.run.runner import StudyOutcome

__all__ = ["Driver", "Resume", "Run"]


class _Continue:
    """What the last line tells the user to do next: resume the study once it is known (its
    name and storage) and written, else run this command line again. A `run` stopped while Ray
    starts has written nothing yet, and ``resume`` would find no study."""

    def __init__(self, study: tuple[str, str] | None = None) -> None:
        self.study = study
        self.written = True  # the study is on the storage (a `run` sets it once its spec is saved)

    def hint(self) -> str:
        if self.study and self.written:
            return f"resume it with: {resume_command(*self.study)}"
        return f"run it again: {run_again()}"


class Driver(Command):
    """A verb that runs trials: SIGTERM and SIGHUP stop it as Ctrl-C does, every way it can end is
    answered in one line, and the study's summary follows the trials."""

    def drive(self, args: argparse.Namespace, then: _Continue) -> StudyOutcome | None:
        """Check the input, then run the trials (setting ``then.study`` once the study is known);
        None when there is nothing to run."""
        raise NotImplementedError

    def run(self, args: argparse.Namespace) -> int:
        then = _Continue()
        handlers = {sig: signal.signal(sig, _as_ctrl_c) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            outcome = self.drive(args, then)
            if outcome is None:
                return 0
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted; {then.hint()}", file=sys.stderr)
            return EXIT_INTERRUPTED
        except _refused() as e:
            fail(str(e))
        except Exception as e:  # a full disk, a storage outage, a bug: one line, the traceback kept
            if caused_by_ctrl_c(e):  # a Ctrl-C inside an import's class body (`caused_by_ctrl_c`)
                print(f"{PROG}: interrupted; {then.hint()}", file=sys.stderr)
                return EXIT_INTERRUPTED
            if output_closed(e):  # a pipe into `head` that has its lines, a pager that quit
                print(
                    f"{PROG}: its output was closed (its reader exited), so it stopped; {then.hint()}",
                    file=sys.stderr,
                )
                return EXIT_OUTPUT_CLOSED
            return _failed(e, then)
        finally:
            for sig, previous in handlers.items():
                signal.signal(sig, previous)
            # Tune leaves its own Ctrl-C handler behind: a Ctrl-C at the summary is a plain interrupt
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return _ended(outcome, then)
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted; {then.hint()}", file=sys.stderr)
            return EXIT_INTERRUPTED


def _refused() -> tuple[type[Exception], ...]:
    """The errors a run or resume refuses in one line, exit 2 (bad input, a study another driver
    holds, a study or a warm start that cannot go on); read when an error is raised, so that the
    study's records are not imported before."""
    from study.records.records import StudyError
    from study.search.warmstart import WarmStartError

    return (SpecError, LeaseHeld, StudyError, WarmStartError)


def _runner() -> ModuleType:
    """`study.run.runner`, which imports Ray: only for the commands that need it."""
    import optuna

    from study.run import runner

    raise_a_swallowed_stop()  # a Ctrl-C during that import
    # stderr is for what went wrong: Optuna's INFO notices ("A new study created in Journal ...",
    # at every run) are not the user's business; from Python, Optuna's verbosity is left as it is
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return runner


def _ended(outcome: StudyOutcome, then: _Continue) -> int:
    """The study's summary, then one line on stderr if it did not end as it should; the exit code."""
    print(summary(outcome.paths, outcome.spec.metric, outcome.spec.mode))
    errored = outcome.statuses.get("errored", 0)
    if errored:
        print(
            f"{PROG}: {count(errored, 'trial')} errored (see their error column); {then.hint()}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    if not outcome.finished:
        print(
            f"{PROG}: the study was interrupted before all its trials finished; {then.hint()}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    return 0


def _failed(error: Exception, then: _Continue) -> int:
    """One line for an unexpected error, its traceback kept in a log file; exit code 1."""
    log = _log_failure(*(then.study if then.study and then.written else (None, None)))
    what = " ".join(f"{type(error).__name__}: {error}".split())[:300]
    if (full := full_disk(error, then.study[1] if then.study else None)) is not None:
        where, free = full
        # a library that met the full disk first may have gone on and failed later, reading
        # a file the disk cut short (Tune's copy of its state, seen: a JSONDecodeError)
        what = f"no space left on the device of {where}" + (f" ({free}; then {what})" if free else "")
    print(f"{PROG}: error: {what} (traceback in {log}); once fixed, {then.hint()}", file=sys.stderr)
    return EXIT_ERROR


def _log_failure(name: str | None, storage: str | None) -> str:
    """The current exception's traceback in a log file, under the study where possible."""
    import tempfile
    import traceback
    from datetime import UTC, datetime

    text = traceback.format_exc()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if name and storage and not has_scheme(storage):
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


class Run(Driver):
    """``run``: a new study from a spec, optionally seeded with an earlier study's best trials."""

    name = "run"
    help = "start a new study from a spec"
    description = "Start a new study from a spec."
    names_a_study = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "spec", help=f"a shipped spec ({', '.join(list_specs())}) or a path to a .toml file"
        )
        parser.add_argument("--name", help="the study's name (default: the spec's name); must be new")
        parser.add_argument(
            "--num-samples", type=int, metavar="N", help="number of trials (default: the spec's)"
        )
        add_storage(parser, from_spec=True)
        add_address(parser)
        parser.add_argument("--quiet", action="store_true", help="no progress table, just the summary")
        parser.add_argument(
            "--warm-start",
            metavar="STUDY",
            help="an earlier study (same storage) whose best trials, by its own objective, are this "
            "study's first trials (only the fields this spec searches; a trial with a value outside this "
            "spec's space is skipped, with a note saying what to widen)",
        )
        parser.add_argument(
            "--top",
            type=int,
            default=5,
            metavar="K",
            help="how many of --warm-start's best trials (default: 5)",
        )

    def drive(self, args: argparse.Namespace, then: _Continue) -> StudyOutcome:
        if args.num_samples is not None and args.num_samples < 1:
            fail(f"--num-samples must be >= 1, got {args.num_samples}")
        if args.top < 1:
            fail(f"--top must be a positive integer, got {args.top}")
        spec = load_spec(args.spec).with_overrides(
            name=args.name, num_samples=args.num_samples, storage=args.storage
        )
        storage = spec.run.storage
        reach(storage, write=True)
        _runner()
        points = _warm_start(args.warm_start, storage, spec, args.top) if args.warm_start else []
        then.study, then.written = (spec.name, storage), False

        def written() -> None:  # from here on `resume` continues the study
            then.written = True

        outcome: StudyOutcome = start(  # `study.run`'s path too
            spec,
            points=points,
            address=args.address,
            verbose=0 if args.quiet else 1,
            resume_hint=resume_command(spec.name, storage),
            on_written=written,
        )
        return outcome


def _warm_start(name: str, storage: str, spec: StudySpec, top: int) -> list[dict[str, Any]]:
    """The study ``name``'s best trials as ``spec``'s first points, what goes first printed."""
    return warm_points(name, storage, spec, top, print)


class Resume(Driver):
    """``resume``: an interrupted study finished, or a study given more trials."""

    name = "resume"
    help = "finish an interrupted study"
    description = (
        "Finish an interrupted study: finished trials are not run again, unfinished ones "
        "continue from their last checkpoint, Optuna's and ASHA's state are kept."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="the study's name")
        add_storage(parser)
        add_address(parser)
        parser.add_argument(
            "--more",
            type=int,
            default=None,
            metavar="N",
            help="add N trials to the study, finished or not: Optuna's sampler goes on with every "
            "earlier trial, ASHA's rungs keep their results, finished trials do not run again",
        )
        parser.add_argument(
            "--quiet",
            action="store_true",
            help="no progress table if Tune had saved nothing yet; a restored study keeps the setting "
            "it was started with (run --quiet)",
        )

    def drive(self, args: argparse.Namespace, then: _Continue) -> StudyOutcome | None:
        storage = args.storage or DEFAULT_STORAGE
        then.study = (args.name, storage)
        if args.more is not None and args.more < 1:
            fail(f"--more must be a positive integer, got {args.more}")
        reach(storage, write=True)
        must_exist(storage, args.storage is not None)
        if not args.more and _nothing_to_resume(args.name, storage):
            return None
        outcome: StudyOutcome = _runner().resume_study(  # `study.resume`'s path too
            args.name, storage, address=args.address, verbose=0 if args.quiet else 1, more=args.more or 0
        )
        return outcome


def _nothing_to_resume(name: str, storage: str) -> bool:
    """A finished study's summary and one line saying so, before Ray starts (`finished`, as
    `study.resume` reads it); False if the study has work left, or is not readable here (the
    resume then says what is wrong)."""
    done = finished(name, storage)
    if done is None:
        return False
    text, n = done
    print(text)
    print(
        f"{PROG}: study {name!r} is finished ({count(n, 'trial')}): nothing to resume; "
        f"to add trials: {resume_command(name, storage)} --more N"
    )
    return True
