"""The verbs that read a study and change none: ``status``, ``report``, ``evaluate``, ``list``,
and ``export``, which rewrites a study's Parquet from its Tune experiment. Each imports what it
needs when it runs (Ray only for ``export``, torch only for ``evaluate``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import ClassVar

from study.cli.base import (
    EXIT_INTERRUPTED,
    PROG,
    Command,
    add_storage,
    caused_by_ctrl_c,
    fail,
    must_exist,
    output_closed,
    reach,
    refusing,
)
from study.reports.summary import listing, summary
from study.run.lease import LeaseHeld
from study.spec.spec import SpecError
from study.storage.commands import run_again
from study.storage.hints import DEFAULT_STORAGE, count

__all__ = ["Evaluate", "Export", "List", "Report", "Status", "StudyReader"]


class StudyReader(Command):
    """A verb that reads the studies under a storage: the storage is checked first, and its input
    errors, a storage that cannot be read and a Ctrl-C are each answered in one line."""

    default_may_be_missing: ClassVar[bool] = False
    """The default storage may be missing: a fresh clone's ``list`` shows the specs, no studies."""
    interrupted: ClassVar[str] = ""
    """What the line for a Ctrl-C adds: what a stop part-way left behind."""

    def read(self, args: argparse.Namespace, storage: str) -> int:
        """Do what the verb does with the studies under ``storage``; the exit code."""
        raise NotImplementedError

    def run(self, args: argparse.Namespace) -> int:
        given = args.storage is not None
        storage = args.storage or DEFAULT_STORAGE
        try:
            reach(storage)
            if given or not self.default_may_be_missing:
                must_exist(storage, given)
            try:
                return self.read(args, storage)
            except OSError as e:  # pyarrow's errors reaching a remote storage (credentials, bucket, network)
                if output_closed(e):  # not the storage: `status | head` has its lines (`entry`)
                    raise
                fail(f"could not read or write storage {storage}: {' '.join(str(e).split())}")
            except (SpecError, LeaseHeld) as e:
                fail(str(e))
        except (KeyboardInterrupt, Exception) as e:  # a Ctrl-C, also one wrapped by an import's class body
            if not caused_by_ctrl_c(e):  # a bug: its traceback as it was
                raise
            # these commands change no study: running them again is the cure
            print(f"{PROG}: interrupted{self.interrupted}; run it again: {run_again()}", file=sys.stderr)
            return EXIT_INTERRUPTED


def _add_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the study's name")


class Status(StudyReader):
    """``status``: the summary table and the fields that mattered, or every trial live."""

    name = "status"
    help = "trials by status, the best trial, which searched field mattered; --watch: live"
    description = (
        "Trials by status and the top trials (from the Parquet, rewritten as trials end), "
        "then which searched field mattered for the objective (Optuna's fANOVA importance from the "
        "study's journal, once enough trials have ended). --watch shows every trial as it runs instead, "
        "from what Tune has written so far (each trial's result.json), without starting Ray."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_name(parser)
        add_storage(parser)
        parser.add_argument(
            "--watch",
            action="store_true",
            help="redraw every trial, running ones included (iteration, objective, NaN events, mean "
            "halting step, ASHA rung), every --interval seconds until Ctrl-C; one snapshot per refresh "
            "when stdout is not a terminal",
        )
        parser.add_argument(
            "--interval", type=float, default=None, metavar="S", help="seconds between refreshes (default: 2)"
        )

    def read(self, args: argparse.Namespace, storage: str) -> int:
        from study.records.records import StudyError, load_study_spec

        with refusing(StudyError):
            if args.interval is not None and not (args.interval > 0 and args.interval < 86400):
                fail(f"--interval must be a number of seconds above 0, got {args.interval:g}")
            if args.interval is not None and not args.watch:
                fail("--interval is for --watch: add --watch, or leave --interval out")
            spec, paths = load_study_spec(args.name, storage)  # the records alone, no Ray
            if args.watch:
                from study.reports.live import DEFAULT_INTERVAL_S, watch

                return watch(spec, paths, args.interval or DEFAULT_INTERVAL_S)
            print(summary(paths, spec.metric, spec.mode))
            from study.reports.importance import importances

            print("\n".join(importances(spec, paths).lines()))
            return 0


class Export(StudyReader):
    """``export``: the study's Parquet rewritten from its Tune experiment (no trial runs)."""

    name = "export"
    help = "rewrite a study's Parquet from its Tune experiment"
    description = "Rewrite a study's Parquet from its Tune experiment on disk (no trial runs)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_name(parser)
        add_storage(parser)

    def read(self, args: argparse.Namespace, storage: str) -> int:
        from study.records.records import StudyError

        with refusing(StudyError):
            from study.run import runner  # imports Ray (without starting it): Tune reads its experiment

            paths = runner.export(args.name, storage)
            print(f"wrote {paths.trials_parquet} and {paths.table_dir('history')}/")
            return 0


class Report(StudyReader):
    """``report``: the study's plots as PNGs and one index.html."""

    name = "report"
    help = "plots of a study: PNGs and an index.html"
    description = (
        "Write a study's plots (sensitivity to lambda_p, accuracy against thinking time with "
        "the Pareto front, the best trial's halting distribution against the geometric prior, per-step "
        "accuracy, learning curves, how far ASHA let each trial run) as PNGs and one index.html."
    )
    # a report is written plot by plot: stopped part-way, its folder mixes old and new ones
    interrupted = "; the report is incomplete"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_name(parser)
        add_storage(parser)
        parser.add_argument(
            "--out", metavar="DIR", help="the report's directory (default: <storage>/reports/<name>)"
        )

    def read(self, args: argparse.Namespace, storage: str) -> int:
        from study.reports.report import ReportError, write_report

        with refusing(ReportError):
            out = os.path.expanduser(args.out) if args.out else None
            if out is not None and Path(out).exists() and not Path(out).is_dir():
                fail(f"--out {args.out} is a file; give a directory (it is created if missing)")
            written = write_report(args.name, storage, out=out)
            missing = written.missing
            empty = f" ({len(missing)} without data: {', '.join(missing)})" if missing else ""
            print(f"wrote {count(written.drawn, 'plot')}{empty} and {written.index}")
            if written.importance is not None:
                print("\n".join(written.importance.lines()))
            return 0


class Evaluate(StudyReader):
    """``evaluate``: a trial's checkpoint run with real early exit against the full unroll."""

    name = "evaluate"
    help = "evaluate a trial's checkpoint with early exit"
    description = (
        "Load a trial's last checkpoint (weights only) and evaluate it on the task's "
        "evaluation sets with real early exit (the step function runs until every sample has halted); "
        "print accuracy, mean halting step and wall time against the full unroll of max_steps."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_name(parser)
        parser.add_argument("--trial", metavar="ID", help="a trial id (default: the study's best trial)")
        parser.add_argument(
            "--device", default="cpu", metavar="DEVICE", help="cpu, cuda or cuda:N (default: cpu)"
        )
        parser.add_argument(
            "--repeats",
            type=int,
            default=5,
            metavar="N",
            help="time each pass this many times; the median and the range are printed (default: 5)",
        )
        add_storage(parser)

    def read(self, args: argparse.Namespace, storage: str) -> int:
        from study.reports.trial_choice import EvaluateError, choose_trial

        with refusing(EvaluateError):
            if args.repeats < 1:
                fail(f"--repeats must be >= 1, got {args.repeats}")
            chosen = choose_trial(args.name, storage, args.trial)  # a wrong name: answered without torch
            _check_device(args.device)
            from study.reports.evaluate import evaluate_trial, format_evaluation

            result = evaluate_trial(
                args.name, storage, args.trial, device=args.device, repeats=args.repeats, chosen=chosen
            )
            print(format_evaluation(result))
            return 0


def _check_device(device: str) -> None:
    """What torch can run on here, checked before a checkpoint is loaded."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        fail(f"--device {device!r} is not a device; use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            fail(f"--device {device}: CUDA is not available on this machine; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            fail(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        fail(f"--device {device!r}: ponder-study evaluates on cpu or cuda, not {dev.type}")


class List(StudyReader):
    """``list``: the shipped specs and the studies under the storage."""

    name = "list"
    help = "the shipped specs and the studies under --storage"
    description = (
        "List the shipped specs, each with its one-line description (what `run` takes: "
        "a name here, or the path of a spec file of your own), and the studies started under the "
        "storage, which `status`, `resume`, `report` and `evaluate` take by name."
    )
    default_may_be_missing = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_storage(parser)

    def read(self, args: argparse.Namespace, storage: str) -> int:
        print(listing(storage))
        return 0
