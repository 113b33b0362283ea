"""``ponder-study evaluate``: one trial's checkpoint run with real early exit, against the full unroll.

Training and its reports evaluate the full unroll of ``max_steps`` and take each sample's
prediction at a halting step sampled from p. Here the trial's last checkpoint is loaded
(``weights_only=True``) and `PonderNet.infer` runs on the same fixed evaluation sets: every
sample flips its Bernoulli(lambda_n) coin after each step and leaves the batch when it halts,
so the step function runs only as often as the samples need. Per set this reports the halted
accuracy (beside the one recorded in the study's Parquet), the mean halting step, the step
calls made, and the wall time of the early-exit pass against the full unroll: each the median of
``repeats`` timings, printed with their range, since a busy machine moves one timing by tens of
times. A ratio of the two is printed only where their ranges do not overlap, and no cause of it
is printed: the figures show the step calls made, not why a pass took the time it did.

No Ray here: it reads the study's files (`study.storage.storage`) and runs `ponder` on this machine.
"""

from __future__ import annotations

import io
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ponder.halting import sample_halting_step
from ponder.model import HaltedOutput, PonderNet
from ponder.tasks import accuracy
from ponder.trainer import Trainer, device_label
from study.records.records import EndRecord
from study.reports.trial_choice import ChosenTrial, EvaluateError, choose_trial
from study.storage.storage import CHECKPOINT_FILE, StudyPaths, join, read_bytes

__all__ = [
    "CHECKPOINT_FILE",
    "ChosenTrial",
    "EvaluateError",
    "Evaluation",
    "SetEvaluation",
    "choose_trial",
    "evaluate_trial",
    "format_evaluation",
    "load_trainer",
    "saved_steps",
]

HALTING_SEED = 104_729
"""Added to the trial's seed (and the set's index) to seed the halting coins: the same draws on every
evaluation of a checkpoint, independent ones for each set."""


@dataclass(frozen=True)
class SetEvaluation:
    """One evaluation set run with real early exit, and with the full unroll."""

    name: str
    n: int
    """Samples in the set (all run as one batch, as in training's evaluation)."""
    halted_accuracy: float
    """Accuracy of the prediction at each sample's halting step, early exit."""
    mean_halting_step: float
    """Mean halting step of the early-exit pass, counted from 1."""
    step_calls_per_sample: float
    """Step evaluations per sample in the early-exit pass, counted at the step module: a sample
    that halted at step n was run n times, so this equals `mean_halting_step`."""
    step_calls_per_batch: int
    """Calls of the step function on the (shrinking) batch: the loop ends when every sample has
    halted, at the latest after ``max_steps``."""
    early_exit_times: tuple[float, ...]
    """Wall times of the early-exit pass over the set, one per repeat."""
    full_unroll_accuracy: float
    """Halted accuracy as training computes it: the full unroll's prediction at a halting step
    sampled from p (training's own evaluation, so it reproduces the recorded value)."""
    full_unroll_times: tuple[float, ...]
    """Wall times of the full unroll of ``max_steps`` over the set, with the halting step sampled
    and the prediction at it taken, one per repeat."""
    recorded_halted_accuracy: float | None
    """``<set>/halted_accuracy`` in the study's trials Parquet; None when it has none."""

    @property
    def early_exit_s(self) -> float:
        """The early-exit pass's median time."""
        return statistics.median(self.early_exit_times)

    @property
    def full_unroll_s(self) -> float:
        """The full unroll's median time."""
        return statistics.median(self.full_unroll_times)

    @property
    def speedup(self) -> float:
        """``full_unroll_s / early_exit_s`` (medians): above 1 when early exit is faster."""
        return self.full_unroll_s / self.early_exit_s if self.early_exit_s > 0 else math.inf

    @property
    def times_differ(self) -> bool:
        """Whether the two passes' timings are apart: every early-exit timing below every full
        unroll's, or above. Where their ranges overlap, the machine's noise covers the difference."""
        early, full = self.early_exit_times, self.full_unroll_times
        return max(early) < min(full) or min(early) > max(full)


def saved_steps(s: SetEvaluation, max_steps: int) -> int:
    """Step calls on the batch that early exit skipped against the full unroll's ``max_steps``:
    0 when some sample pondered to the last step, so halting saved no step."""
    return max(0, max_steps - s.step_calls_per_batch)


@dataclass(frozen=True)
class Evaluation:
    """A trial's checkpoint evaluated on every evaluation set of its task; its ``str`` is the table
    ``ponder-study evaluate`` prints."""

    study: str
    trial_id: str
    status: str
    checkpoint: str
    """The Tune checkpoint directory (a URI on remote storage); the weights are in ``trainer.pt``."""
    iteration: int
    """Training iterations the checkpoint had made."""
    lambda_p: float
    beta: float
    max_steps: int
    device: str
    repeats: int
    """Each pass was timed this many times (after one untimed run)."""
    chosen_by: str | None
    """``"<metric> (<mode>)"`` when the trial was chosen as the study's best, None when named."""
    sets: list[SetEvaluation]

    def __str__(self) -> str:
        return format_evaluation(self)


def evaluate_trial(
    name: str,
    storage: str = "results",
    trial_id: str | None = None,
    *,
    device: str = "cpu",
    repeats: int = 5,
    chosen: ChosenTrial | None = None,
) -> Evaluation:
    """Evaluate trial ``trial_id`` of study ``name`` (by default its best ended trial by the study's
    objective) with real early exit on every evaluation set, and time it against the full unroll.

    Raises `EvaluateError` for an unknown study or trial, a study without trials Parquet, a
    trial without checkpoint, or a checkpoint that is missing or not a weights-only file.
    ``chosen``: the trial `choose_trial` already picked (the CLI picks it before loading torch).
    """
    if repeats < 1:
        raise EvaluateError(f"repeats must be >= 1, got {repeats}")
    paths = StudyPaths(storage, name)
    chosen = chosen or choose_trial(name, storage, trial_id)
    row, chosen_by = chosen.row, chosen.chosen_by
    trainer, loaded = load_trainer(row, device, paths)

    full = trainer.evaluate()  # training's own path: full unroll, halting step sampled from p
    trainer.model.eval()  # evaluate() leaves it in train mode
    sets = [
        _evaluate_set(
            trainer,
            set_name,
            seed=trainer.config.seed + HALTING_SEED + i,
            full_unroll_accuracy=float(full[f"{set_name}/halted_accuracy"]),
            recorded=_finite(row.get(f"{set_name}/halted_accuracy")),
            repeats=repeats,
        )
        for i, set_name in enumerate(trainer.eval_sets)
    ]
    return Evaluation(
        study=name,
        trial_id=str(row["trial_id"]),
        status=str(row.get("status")),
        checkpoint=loaded.removesuffix(f"/{CHECKPOINT_FILE}"),
        iteration=trainer.iteration,
        lambda_p=trainer.config.lambda_p,
        beta=trainer.config.beta,
        max_steps=trainer.config.max_steps,
        device=device_label(trainer.device),
        repeats=repeats,
        chosen_by=chosen_by,
        sets=sets,
    )


def format_evaluation(e: Evaluation) -> str:
    """The table ``ponder-study evaluate`` prints: per set, early exit against the full unroll."""
    how = f"best by {e.chosen_by}" if e.chosen_by else "as named"
    lines = [
        f"study {e.study}, trial {e.trial_id} ({e.status}, {how}), checkpoint at iteration {e.iteration}:",
        f"  {e.checkpoint}",
        f"lambda_p {e.lambda_p:.4g}, beta {e.beta:.4g}, max_steps {e.max_steps}; on {e.device}, "
        f"times: the median (range) of {e.repeats} run{'s' * (e.repeats != 1)} each",
        "",
    ]
    header = (
        "set",
        "n",
        "halted acc",
        "recorded",
        "full unroll acc",
        "mean halting step",
        "step calls/batch",
        "early exit",
        "full unroll",
        "full / early",
    )
    table = [header]
    for s in e.sets:
        recorded = "-" if s.recorded_halted_accuracy is None else f"{s.recorded_halted_accuracy:.3f}"
        table.append(
            (
                s.name,
                str(s.n),
                f"{s.halted_accuracy:.3f}",
                recorded,
                f"{s.full_unroll_accuracy:.3f}",
                f"{s.mean_halting_step:.2f} of {e.max_steps}",
                f"{s.step_calls_per_batch} of {e.max_steps}",
                _spread(s.early_exit_times),
                _spread(s.full_unroll_times),
                f"{s.speedup:.2f}x" if s.times_differ else "-",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        cells = [row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))]
        lines.append("  ".join(cells).rstrip())
    lines.append("")
    lines.append(
        "halted acc: early exit, each sample's coins seeded; recorded: the trials Parquet; full unroll acc: "
        "training's path (all max_steps, halting step sampled from p); full / early: the full unroll's "
        "median time over early exit's, '-' where their ranges overlap (no difference measured)"
    )
    for s in e.sets:
        if not saved_steps(s, e.max_steps):
            lines.append(
                f"{s.name}: halting saved no step call: some sample pondered to step {e.max_steps} "
                f"(max_steps), so early exit called the step function {s.step_calls_per_batch} times on "
                "the batch, as the full unroll does"
            )
    return "\n".join(lines)


# -- the trial and its checkpoint ------------------------------------------------------------------


def _checkpoint_candidates(row: dict[str, Any], paths: StudyPaths) -> list[str]:
    """Where the trial's checkpoint may be, most trusted first: its end record's path (relative
    to the storage root, so true wherever the study was copied), the Parquet's, and the Parquet's
    moved under this storage's ``tune/<name>/`` (a Parquet written before the study was moved)."""
    out = []
    record = read_bytes(paths.end_record(str(row["trial_id"])))
    if record is not None:
        relative = EndRecord.from_json(record).checkpoint
        if relative and "://" not in relative and not relative.startswith("/"):
            out.append(join(paths.root, relative))
    where = row.get("checkpoint_path")
    if where:
        out.append(str(where))
        marker = f"/tune/{paths.name}/"
        if marker in str(where):
            out.append(paths.experiment + "/" + str(where).split(marker, 1)[1])
    return [c.rstrip("/") for c in dict.fromkeys(out)]


def load_trainer(row: dict[str, Any], device: str, paths: StudyPaths) -> tuple[Trainer, str]:
    """The trainer of the trial whose Parquet row is ``row``, from its ``<checkpoint>/trainer.pt``
    (local or remote, weights only), and where that file was; `EvaluateError` if it cannot be."""
    trial = f"trial {row['trial_id']} ({row.get('status')})"
    candidates = _checkpoint_candidates(row, paths)
    if not candidates:
        raise EvaluateError(f"{trial} has no checkpoint: it made no report yet; pick another with --trial ID")
    path, data = f"{candidates[0]}/{CHECKPOINT_FILE}", None
    for where in candidates:
        data = read_bytes(f"{where}/{CHECKPOINT_FILE}")
        if data is not None:
            path = f"{where}/{CHECKPOINT_FILE}"
            break
    if data is None:
        raise EvaluateError(
            f"{trial}: checkpoint file {path} is missing; was the study's tune/ directory moved or pruned? "
            "pick another trial with --trial ID"
        )
    try:
        return Trainer.from_checkpoint(io.BytesIO(data), device=device), path
    except Exception as exc:  # torch.load's UnpicklingError, a truncated file, a state that does not fit
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise EvaluateError(
            f"{trial}: cannot load {path} as a weights-only checkpoint ({type(exc).__name__}: {first}); "
            "it is not a file ponder wrote, or it is damaged"
        ) from exc


# -- measuring -------------------------------------------------------------------------------------


def _evaluate_set(
    trainer: Trainer,
    name: str,
    *,
    seed: int,
    full_unroll_accuracy: float,
    recorded: float | None,
    repeats: int,
) -> SetEvaluation:
    """One set: a counted early-exit pass, then both paths timed on the same inputs and coins."""
    model, device, s = trainer.model, trainer.device, trainer.eval_sets[name]

    def coins() -> torch.Generator:  # the same draws on every pass
        return _generator(device, seed)

    with torch.inference_mode():
        out, calls, sample_calls = _counted_infer(model, s.x, coins())
        early = _times(lambda: model.infer(s.x, coins()), device, repeats)
        full = _times(lambda: _unroll_and_halt(model, s.x, coins()), device, repeats)
    n = int(s.y.shape[0])
    return SetEvaluation(
        name=name,
        n=n,
        halted_accuracy=float(accuracy(out.y_hat, s.y).mean()),
        mean_halting_step=float(out.halting_step.float().mean()),
        step_calls_per_sample=sample_calls / n,
        step_calls_per_batch=calls,
        early_exit_times=early,
        full_unroll_accuracy=full_unroll_accuracy,
        full_unroll_times=full,
        recorded_halted_accuracy=recorded,
    )


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _counted_infer(
    model: PonderNet, x: torch.Tensor, generator: torch.Generator
) -> tuple[HaltedOutput, int, int]:
    """`PonderNet.infer` with its step module's calls counted by a forward hook: (output, calls
    on the batch, samples summed over calls)."""
    counts = [0, 0]

    def count(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        counts[0] += 1
        counts[1] += int(args[1].shape[0])  # (ctx, h): h has one row per sample still pondering

    handle = model.step.register_forward_hook(count)
    try:
        out = model.infer(x, generator)
    finally:
        handle.remove()
    return out, counts[0], counts[1]


def _unroll_and_halt(model: PonderNet, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The full unroll's answer: all ``max_steps``, then the prediction at a sampled halting step."""
    out = model(x)
    step = sample_halting_step(out.log_p, generator).clamp_min(0)  # [B]; NO_STEP only when p is NaN
    y_hat: torch.Tensor = out.y_hat[step, torch.arange(step.shape[0], device=step.device)]
    return y_hat


def _times(fn: Callable[[], object], device: torch.device, repeats: int) -> tuple[float, ...]:
    """The wall time of each of ``repeats`` calls of ``fn``, after one untimed call (warm-up)."""
    times = []
    for i in range(repeats + 1):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        if i > 0:
            times.append(time.perf_counter() - start)
    return tuple(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _finite(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _spread(times: tuple[float, ...]) -> str:
    """The median of ``times`` and, for more than one, their range: ``1.07 ms (0.98-1.30)``, or
    ``900 us (660 us-44.50 ms)`` where the ends need other units."""
    median = _seconds(statistics.median(times))
    if len(times) < 2:
        return median
    low, high = _seconds(min(times)), _seconds(max(times))
    unit = median.split()[-1]
    if low.split()[-1] == high.split()[-1] == unit:
        low, high = low.split()[0], high.split()[0]
    return f"{median} ({low}-{high})"


def _seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"
