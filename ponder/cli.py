"""``python -m ponder.train``: flags made from the config dataclasses' fields and docstrings.

``--lambda-p`` sets ``lambda_p``: one name per knob, from CLI to config to Parquet column.
Bad input ends with one line on stderr and exit code 2, never a traceback; flags and config
values are checked before torch is loaded (two seconds of imports), so a typo answers at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from ponder.config import CONFIGS, ConfigError, PonderConfig, TaskConfig, fields_of

if TYPE_CHECKING:
    from ponder.trainer import Metrics, Trainer

__all__ = ["build_parser", "main"]

PROG = "python -m ponder.train"
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (what is wrong, where to look), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


CONFIG_FIELDS = frozenset(f.name for cls in CONFIGS.values() for f in dataclasses.fields(cls))
"""Every config field of every task: the flags that set a config rather than a run option."""


def _given_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields set on the command line (unset flags are absent: SUPPRESS)."""
    return {k: v for k, v in vars(args).items() if k in CONFIG_FIELDS}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """The parser: ``--task``, every config field of every task, and run options."""
    parser = _Parser(
        prog=PROG,
        description="Train one PonderNet and print its evaluation metrics. "
        "Flags are the config's field names; defaults are the task's.",
    )
    parser.add_argument("--task", choices=sorted(CONFIGS), default="parity", help="which task to train")
    run = parser.add_argument_group("run")
    run.add_argument("--json", action="store_true", help="print one JSON object per evaluation on stdout")
    run.add_argument("--checkpoint", metavar="PATH", help="save a checkpoint here at every evaluation")
    run.add_argument(
        "--resume",
        metavar="PATH",
        help="continue the run saved in this checkpoint; only --iterations (to train longer), "
        "--device and --compile may change",
    )
    run.add_argument("--threads", type=int, metavar="N", help="torch CPU threads (default: torch's choice)")
    owners: dict[str, list[str]] = {}  # field name -> the tasks that have it
    for task, cls in CONFIGS.items():
        for f in fields_of(cls):
            owners.setdefault(f.name, []).append(task)
    groups = {"all": parser.add_argument_group("config, all tasks")}
    groups.update({t: parser.add_argument_group(f"config, {t} only") for t in CONFIGS})
    for task, cls in CONFIGS.items():
        defaults = cls()
        for f in fields_of(cls):
            if owners[f.name][0] != task:  # added with the first task that has it
                continue
            shared = len(owners[f.name]) == len(CONFIGS)
            default = repr(getattr(defaults, f.name))
            if shared:  # say so where the tasks' defaults differ
                per_task = {t: repr(getattr(c(), f.name)) for t, c in CONFIGS.items()}
                if len(set(per_task.values())) > 1:
                    default = ", ".join(f"{t} {v}" for t, v in per_task.items())
            kwargs: dict[str, Any] = {
                "dest": f.name,
                "default": argparse.SUPPRESS,  # only flags given override the config's defaults
                "help": f"{f.doc} (default: {default})",
            }
            if f.choices:
                kwargs["choices"] = f.choices
            elif f.kind is tuple:  # eval_rotations: angles in degrees
                kwargs.update(type=f.item, nargs="*", metavar="DEG")
            else:
                kwargs.update(type=f.kind, metavar=f.name.upper())
            groups["all" if shared else task].add_argument(_flag(f.name), **kwargs)
    return parser


def _fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def _config(args: argparse.Namespace) -> TaskConfig:
    cls = CONFIGS[args.task]
    values = _given_fields(args)
    foreign = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
    if foreign:
        _fail(f"{_flag(foreign[0])} is not a flag of task {args.task}")
    return cls(**values)


RESUME_OVERRIDES = ("iterations", "device", "compile")
"""Config fields a resumed run may change: the others would make it another run (compiled and
eager steps compute the same numbers)."""


def _check_resume_flags(args: argparse.Namespace) -> None:
    refused = sorted(k for k in _given_fields(args) if k not in RESUME_OVERRIDES)
    if refused:
        _fail(
            f"{_flag(refused[0])} cannot change a resumed run; only "
            f"{', '.join(_flag(k) for k in RESUME_OVERRIDES)} can (start a new run for other values)"
        )


def _resume(args: argparse.Namespace) -> Trainer:
    given = _given_fields(args)
    from ponder.trainer import Trainer

    trainer = Trainer.from_checkpoint(args.resume, device=given.get("device"), compile=given.get("compile"))
    if "iterations" in given:
        try:
            trainer.set_iterations(given["iterations"])
        except ValueError as e:
            _fail(f"--iterations {e}")
    return trainer


def _progress(m: Metrics, total: int) -> str:
    sets = [k.split("/")[0] for k in m if k.endswith("/halted_accuracy")]
    acc = "  ".join(f"{s} {m[f'{s}/halted_accuracy']:.3f}" for s in sets)
    return (
        f"iter {m['iteration']:>6}/{total}  loss {m['train/loss']:.4f}  halted acc: {acc}  "
        f"halt step {m['test/mean_halting_step']:.2f}  nan {m['nan_events']}  "
        f"{m['iterations_per_s']:.0f} it/s"
    )


def _summary(history: list[Metrics], config: PonderConfig) -> str:
    last = history[-1]
    sets = [k.split("/")[0] for k in last if k.endswith("/halted_accuracy")]
    lines = [
        f"outcome {last['outcome']} after {last['iteration']} iterations, {last['time_s']:.1f} s training, "
        f"{last['nan_events']} NaN events",
        f"{'set':<14}{'halted acc':>11}{'best':>8}{'best-step acc':>15}{'stable acc':>12}"
        f"{'halt step':>11}{'E[steps]':>10}",
    ]
    for s in sets:
        best = max(m[f"{s}/halted_accuracy"] for m in history)
        lines.append(
            f"{s:<14}{last[f'{s}/halted_accuracy']:>11.4f}{best:>8.4f}"
            f"{last[f'{s}/best_step_accuracy']:>15.4f}{last[f'{s}/stable_accuracy']:>12.4f}"
            f"{last[f'{s}/mean_halting_step']:>11.2f}{last[f'{s}/expected_steps']:>10.2f}"
        )
    lines.append(
        "best-step acc: the best single step's; stable acc: right at the halting step and every later one"
        " (halted acc far above both: right by where it halts)"
    )
    lines.append(
        f"prior mean halting step 1/lambda_p = {1 / config.lambda_p:.2f} (max_steps {config.max_steps})"
    )
    return "\n".join(lines)


def _json_safe(m: Metrics) -> Metrics:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in m.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 completed, 1 diverged, 2 bad input)."""
    args = build_parser().parse_args(argv)
    if args.threads is not None and args.threads < 1:
        _fail(f"--threads must be >= 1, got {args.threads}")
    try:  # the flags and values first: a bad one answers before torch's imports
        config = None if args.resume else _config(args)
        if args.resume:
            _check_resume_flags(args)
    except ConfigError as e:
        _fail(str(e))
    import torch

    from ponder.data.mnist import IdxError
    from ponder.trainer import Trainer

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        trainer = _resume(args) if config is None else Trainer(config)
    except (ConfigError, IdxError) as e:
        _fail(str(e))
    except FileNotFoundError as e:
        _fail(f"{e.filename}: no such file")
    except (RuntimeError, KeyError, EOFError) as e:  # a checkpoint that is not one of ours
        _fail(f"{args.resume}: not a ponder checkpoint ({type(e).__name__}: {e})")
    config = trainer.config
    history: list[Metrics] = []
    out = sys.stdout
    if not args.json:
        print(f"{config.task}: {json.dumps(config.to_dict())}", file=out, flush=True)
    # Ctrl-C (or SIGTERM) asks the run to stop at the next iteration boundary, where the state
    # is whole: a checkpoint saved there resumes exactly
    stop = {"requested": False}

    def request_stop(signum: int, frame: object) -> None:
        if stop["requested"]:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        stop["requested"] = True

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for m in trainer.run(should_stop=lambda: stop["requested"]):
            history.append(m)
            if args.checkpoint:
                trainer.save(args.checkpoint)
            if args.json:
                print(json.dumps(_json_safe(m)), file=out, flush=True)
            else:
                print(_progress(m, config.iterations), file=out, flush=True)
    except KeyboardInterrupt:  # a second signal while evaluating or saving: no clean state to save
        print(f"\n{PROG}: stopped at once; the last checkpoint is the last evaluation's", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop["requested"] and trainer.outcome == "running":
        where = f"stopped at iteration {trainer.iteration} of {config.iterations}"
        if args.checkpoint:
            trainer.save(args.checkpoint)
            print(f"{where}; resume with: {PROG} --resume {args.checkpoint}", file=sys.stderr)
        else:
            print(f"{where}; no --checkpoint was given, so nothing was saved", file=sys.stderr)
        return 130
    if history and not args.json:
        print(_summary(history, config), file=out)
    return 1 if trainer.outcome == "diverged" else 0
