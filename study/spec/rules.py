"""The checks of a spec across keys, which the models (and the JSON Schema) cannot express: the
budget against the evaluation interval, the space against ``[config]``, every corner of the space
(`study.spec.space.check_corners`), the grid sampler's size, the objectives' and ASHA's metrics
(reported by the task at every point of the space) and their modes, ASHA's grace period, a CUDA
device without a GPU, and a fused study's data streams. Each refuses in one line naming the key
(`study.spec.errors.SpecError`)."""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any

from ponder.config import CONFIGS
from ponder.metrics import SET_LIST_METRICS, SET_METRICS, TRAIN_METRICS
from ponder.tasks import get_task
from study.spec.errors import fail
from study.spec.models import SchedulerSpec, SearchSpec, field_types, toml_key
from study.spec.space import Dimension, check_corners, dimension

__all__ = ["Checked", "checked", "field_default"]


@dataclass(frozen=True)
class Checked:
    """What the checks make of a spec document: its fields as `study.spec.spec.StudySpec` holds them."""

    config: dict[str, Any]
    """The fixed config fields, in their field types."""
    space: tuple[Dimension, ...]
    search: SearchSpec
    """``[search]``; with the grid sampler, its trial count the size of the grid."""
    scheduler: SchedulerSpec | None
    """ASHA with its grace period set; None for a multi-objective study."""
    pareto_objectives: tuple[tuple[str, str], ...]


def checked(doc: Any, raw: dict[str, Any]) -> Checked:
    """The spec document ``doc`` (validated by the models), parsed from ``raw``, checked across keys."""
    task = doc.task
    fixed = {k: getattr(doc.config, k) for k in raw.get("config", {})}
    fixed = {k: tuple(v) if isinstance(v, list) else v for k, v in fixed.items()}
    iterations = fixed.get("iterations", field_default(task, "iterations"))
    eval_interval = fixed.get("eval_interval", field_default(task, "eval_interval"))
    if eval_interval > iterations:
        fail(
            "config.eval_interval",
            f"eval_interval ({eval_interval}) is above iterations ({iterations}): a trial would report "
            "only at its end, leaving ASHA nothing to compare; lower eval_interval",
        )
    kinds = field_types(task)
    space = tuple(dimension(n, getattr(doc.space, n), kinds[n] is int) for n in raw["space"])
    for d in space:
        if d.name in fixed:
            fail(f"space.{d.name}", f"{d.name} is also fixed in [config]; remove it from one of the two")
    sets = check_corners(task, fixed, space)
    search = doc.search
    if search.sampler == "grid":  # every point once: the size of the grid is the trial count
        search = _grid_search(search, space, given="num_samples" in raw.get("search", {}))
    objectives = tuple(doc.objectives.items())
    for metric, mode in objectives:
        _check_metric(metric, f"objectives.{toml_key(metric)}", task, sets)
        _check_mode(mode, metric, f"objectives.{toml_key(metric)}")
    if len(objectives) == 1:
        fail(
            "objectives",
            "one objective is a single-objective study: set it as [scheduler] metric and mode (with "
            'ASHA), or add another, e.g. "test/mean_halting_step" = "min"',
        )
    scheduler = None
    if objectives and "scheduler" in raw:
        fail(
            "scheduler",
            "ASHA compares trials on one metric, and [objectives] asks for several: a multi-objective "
            "study runs every trial to its budget; remove [scheduler] (or [objectives])",
        )
    if not objectives:
        scheduler = _checked_scheduler(doc.scheduler, task, sets, iterations, eval_interval)
    device = fixed.get("device", "auto")
    if device.startswith("cuda") and doc.resources.gpu == 0:
        fail(
            "config.device",
            f"device {device!r} needs resources.gpu > 0: Ray hides the GPUs from a trial "
            'that asks for none; set [resources] gpu, or device = "auto"',
        )
    if doc.resources.fuse > 1:  # a fused step, on every data stream the trials may draw from
        searched = next((d.values or () for d in space if d.name == "data_stream"), None)
        streams = searched or (fixed.get("data_stream", field_default(task, "data_stream")),)
        if (refusal := get_task(task).fuse_refusal(*map(str, streams))) is not None:
            fail("resources.fuse", refusal)
    return Checked(
        config=fixed, space=space, search=search, scheduler=scheduler, pareto_objectives=objectives
    )


def _checked_scheduler(
    scheduler: SchedulerSpec, task: str, sets: list[str], iterations: int, eval_interval: int
) -> SchedulerSpec:
    _check_metric(scheduler.metric, "scheduler.metric", task, sets)
    _check_mode(scheduler.mode, scheduler.metric, "scheduler.mode")
    grace = scheduler.grace_period
    if grace is None:  # a quarter of the budget, on the evaluation grid
        grace = max(eval_interval, iterations // 4 // eval_interval * eval_interval)
    if grace > iterations:
        fail(
            "scheduler.grace_period",
            f"grace_period ({grace}) is above the budget, config.iterations ({iterations}); lower it",
        )
    if grace < eval_interval:
        fail(
            "scheduler.grace_period",
            f"grace_period ({grace}) is below config.eval_interval ({eval_interval}): ASHA sees a trial "
            f"only at its evaluations; use a multiple of {eval_interval}",
        )
    return scheduler.model_copy(update={"grace_period": grace})


def _grid_search(search: SearchSpec, space: tuple[Dimension, ...], given: bool) -> SearchSpec:
    ranges = [d.name for d in space if d.values is None]
    if ranges:
        fail(
            f"space.{ranges[0]}",
            "the grid sampler tries listed values: give every searched field values = [...] "
            '(or use sampler = "tpe" for a range)',
        )
    size = math.prod(len(d.values or ()) for d in space)
    if given and search.num_samples != size:
        fail("search.num_samples", f"the grid has {size} points; set num_samples = {size}, or leave it out")
    return search.model_copy(update={"num_samples": size})


# the direction a metric is always optimised in: the other would keep the worst trials
_MODE_OF = {
    "halted_accuracy": "max",
    "best_step_accuracy": "max",
    "stable_accuracy": "max",
    "loss": "min",
    "loss_rec": "min",
}


def _check_metric(metric: str, key: str, task: str, sets: list[str]) -> None:
    """``metric`` is a number every trial reports: ``<set>/<metric>`` of an evaluation set the
    config has at every point of the space, or ``train/<metric>``."""
    reported = [f"{s}/{m}" for s in sets for m in SET_METRICS] + [f"train/{m}" for m in TRAIN_METRICS]
    if metric not in reported:
        set_name, _, m = metric.partition("/")
        close = difflib.get_close_matches(metric, reported, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        if m in SET_LIST_METRICS:
            why = f"{metric!r} is a per-step list, not a number trials can be compared on"
        elif set_name == "train":
            why = f"{metric!r} is not reported; training metrics: train/{', train/'.join(TRAIN_METRICS)}"
        elif set_name not in sets:
            why = (
                f"{metric!r}: this {task} config has no evaluation set {set_name!r} at every point of the "
                f"space; sets: {', '.join(sets)} (or train)"
            )
        else:
            why = f"{metric!r} is not reported; per-set metrics: {', '.join(SET_METRICS)}"
        fail(key, f"{why}; {hint}".rstrip("; "))


def _check_mode(mode: str, metric: str, key: str) -> None:
    want = _MODE_OF.get(metric.partition("/")[2])
    if want is not None and mode != want:
        fail(key, f'mode = "{mode}" would keep the worst {metric}; use mode = "{want}"')


def field_default(task: str, name: str) -> Any:
    """The default of the task's config field ``name``."""
    (f,) = (f for f in dataclasses.fields(CONFIGS[task]) if f.name == name)
    return f.default
