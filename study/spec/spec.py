"""Study specs: one TOML file per named hyperparameter study, checked in full before Ray starts.

A spec names a task, fixes some of the task's config fields, searches others, and says how to
search (an Optuna sampler), when to stop poor trials early (ASHA), what a trial may use and where
the results go. Field names are the config dataclass's own (``lambda_p``, ``max_steps``), the
same names as the ``ponder.train`` flags and the Parquet columns::

    #:schema ./spec.schema.json  # editors (taplo, Even Better TOML) complete and check as you type
    description = "One line shown by `ponder-study list`."
    task = "parity"              # a key of ponder.config.CONFIGS

    [config]                     # fixed fields of the task's config
    n_elems = 8
    iterations = 3000            # the trial budget, and ASHA's max_t
    eval_interval = 250          # trials report (and ASHA decides) at every evaluation

    [space.lambda_p]             # a searched field: a range ...
    low = 0.05
    high = 0.9
    [space.beta]
    low = 1e-4
    high = 0.1
    log = true                   # sample on a log scale (needs low > 0)
    [space.max_steps]            # an int field gives an inclusive integer range
    low = 4
    high = 20
    [space.kl_direction]         # ... or a list of values (categorical)
    values = ["forward", "reverse"]

    [search]                     # sampler = tpe | random | qmc | gp | cmaes | grid (values only)
    sampler = "tpe"
    seed = 0
    num_samples = 8
    max_concurrent = 2

    [scheduler]                  # ASHA; grace_period in training iterations
    metric = "test/halted_accuracy"
    mode = "max"
    grace_period = 750
    reduction_factor = 3
    brackets = 1

    # or, instead of [scheduler], two or more objectives: Optuna's multi-objective search, every
    # trial to its budget (ASHA compares trials on one metric), the Pareto front marked in Parquet
    [objectives]
    "test/halted_accuracy" = "max"
    "test/mean_halting_step" = "min"

    [resources]                  # per trial; gpu may be a fraction (0.25: four trials a GPU)
    cpu = 1
    gpu = 0

    [run]
    storage = "results"          # a local directory or a URI (s3://bucket/path)
    max_failures = 2             # retries of a trial that errors, from its last checkpoint
    parquet_refresh_s = 10       # the Parquet written at most this often while trials end
    tensorboard = false          # true: TensorBoard scalars of every report, as they come

Every table but ``[space]`` is optional. Validation is complete and strict, in two layers:

- typed pydantic models of the document (a union on ``task``: each task's ``[config]`` and
  ``[space]`` fields are its config dataclass's own): unknown keys, types, bounds. They are also
  the JSON Schema editors read (`json_schema`, ``ponder-study schema``);
- cross-field checks in `parse_spec` that a schema cannot express: every corner of the search
  space is built as a config (the config's own validation speaks), metrics the task reports at
  every point of the space, the grid sampler's rules, ASHA's grace period against the budget.

Either way a bad spec is a `SpecError` whose one-line message starts with the key
(``space.lambda_p.high: lambda_p must be in (0, 1], got 1.5``) and says how to fix it.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from ponder.config import CONFIGS, ConfigError, TaskConfig
from ponder.metrics import SET_LIST_METRICS, SET_METRICS, TRAIN_METRICS, eval_set_names
from ponder.tasks import get_task
from study.spec.models import (
    SAMPLERS,
    Range,
    ResourcesSpec,
    RunSpec,
    SchedulerSpec,
    SearchSpec,
    Values,
    document,
    field_types,
    first_error,
    json_schema,
    schema_text,
    toml_key,
)
from study.spec.shipped import SPEC_ALIASES, SPECS_DIR, list_specs
from study.spec.toml import rewritten_source, to_toml, toml_value

__all__ = [
    "NAME_PATTERN",
    "SAMPLERS",
    "SPECS_DIR",
    "SPEC_ALIASES",
    "Dimension",
    "ResourcesSpec",
    "RunSpec",
    "SchedulerSpec",
    "SearchSpec",
    "SpecError",
    "StudySpec",
    "check_name",
    "json_schema",
    "list_specs",
    "load_spec",
    "parse_spec",
    "schema_text",
    "to_toml",
]

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A study name: it becomes a directory name and a Parquet partition value (``study=<name>``)."""
MAX_NAME_LENGTH = 255 - len("study=")
"""The longest name whose longest file-name component, ``study=<name>``, fits in 255 bytes
(names are ASCII: a character is a byte)."""

_MAX_CORNERS = 4096  # past this many corners of the space, check each dimension's ends alone


class SpecError(ValueError):
    """A spec that cannot run; the message is one line naming the key and the fix."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key
        """The offending key path (``space.lambda_p.high``), empty for a whole-file problem."""

    def __reduce__(self) -> tuple[type[SpecError], tuple[str, str]]:
        return type(self), (str(self), self.key)


def _fail(key: str, message: str) -> NoReturn:
    line = " ".join(f"{key}: {message}".split("\n")) if key else " ".join(message.split("\n"))
    raise SpecError(line, key)


@dataclass(frozen=True)
class Dimension:
    """One searched config field: an inclusive range (``low``/``high``) or a list of ``values``."""

    name: str
    """The config field, e.g. ``lambda_p``."""
    low: float | None
    """Lower end of the range (an int for an integer field); None for a categorical dimension."""
    high: float | None
    """Upper end, inclusive; None for a categorical dimension."""
    log: bool = False
    """Sample the range on a log scale."""
    values: tuple[Any, ...] | None = None
    """The choices of a categorical dimension; None for a range."""
    integer: bool = False
    """The config field is an int (``max_steps``, ``n_hidden``): the range holds integers."""

    @property
    def categorical(self) -> bool:
        """Whether the dimension is a list of values rather than a range."""
        return self.values is not None

    def coerce(self, value: Any) -> Any:
        """A sampled (or stored) value in the field's own type: ``5.0`` becomes ``5`` for an int field."""
        if self.integer and isinstance(value, float) and value.is_integer():
            return int(value)
        if (
            not self.integer
            and self.values is None
            and isinstance(value, int)
            and not isinstance(value, bool)
        ):
            return float(value)
        return value


@dataclass(frozen=True)
class StudySpec:
    """A validated study: the task, its fixed and searched config fields, and how to run it."""

    name: str
    """The spec's name (its file stem): the study's name unless overridden."""
    task: str
    """A key of ``ponder.config.CONFIGS``."""
    description: str
    config: Mapping[str, Any] = field(hash=False)
    """Fixed config fields by name (``task`` not included), in their field types."""
    space: tuple[Dimension, ...]
    search: SearchSpec
    scheduler: SchedulerSpec | None
    """ASHA; None for a multi-objective study (ASHA compares trials on one metric)."""
    resources: ResourcesSpec
    run: RunSpec
    source: str = field(repr=False)
    """The TOML text the spec was parsed from: saved beside a study so that resuming uses it."""
    pareto_objectives: tuple[tuple[str, str], ...] = ()
    """``[objectives]``: (metric, mode) pairs Optuna's multi-objective search trades off; empty
    for an ASHA study."""

    def config_for(self, params: Mapping[str, Any]) -> TaskConfig:
        """The task config of one trial: the fixed fields plus ``params``, one value per dimension."""
        dims = {d.name: d for d in self.space}
        unknown = sorted(set(params) - set(dims))
        if unknown:
            _fail(f"params.{unknown[0]}", f"not a searched field of this study; searched: {', '.join(dims)}")
        missing = [name for name in dims if name not in params]
        if missing:
            _fail(f"params.{missing[0]}", f"missing; a trial needs a value for each of {', '.join(dims)}")
        values = {name: d.coerce(params[name]) for name, d in dims.items()}
        try:
            return CONFIGS[self.task](**self.config, **values)
        except ConfigError as exc:
            field_name = _config_error_field(exc)
            key = f"params.{field_name}" if field_name in dims else f"config.{field_name}"
            _fail(key, str(exc))

    @property
    def objectives(self) -> tuple[tuple[str, str], ...]:
        """(metric, mode) pairs the study optimises, the primary first; one for an ASHA study."""
        if self.pareto_objectives:
            return self.pareto_objectives
        assert self.scheduler is not None  # parse_spec gives a study one or the other
        return ((self.scheduler.metric, self.scheduler.mode),)

    @property
    def front_objectives(self) -> tuple[tuple[str, str], ...]:
        """What the trials table's ``pareto`` column trades off: the study's objectives; for a
        study of one ``<set>/halted_accuracy``, that against the set's mean halting step (the
        PonderNet question: accuracy for how much thinking)."""
        if self.multi_objective:
            return self.objectives
        metric, mode = self.objectives[0]
        set_name, _, name = metric.partition("/")
        if name == "halted_accuracy":
            return ((metric, mode), (f"{set_name}/mean_halting_step", "min"))
        return self.objectives

    @property
    def multi_objective(self) -> bool:
        """Whether Optuna searches a Pareto front (no ASHA) rather than one best value."""
        return len(self.objectives) > 1

    @property
    def metric(self) -> str:
        """The primary objective's metric: what "best trial" means in tables and reports."""
        return self.objectives[0][0]

    @property
    def mode(self) -> str:
        """``"max"`` or ``"min"``: the primary objective's direction."""
        return self.objectives[0][1]

    @property
    def iterations(self) -> int:
        """The trial budget (ASHA's ``max_t``): ``[config] iterations`` or the task's default."""
        value = self.config.get("iterations", _field_default(self.task, "iterations"))
        assert isinstance(value, int)
        return value

    @property
    def longest_max_steps(self) -> int:
        """The longest ``max_steps`` a trial can have: the searched range's top or largest listed
        value, else the fixed one or the task's default (a compiled fused group unrolls that many
        steps from its start, so it compiles once)."""
        for d in self.space:
            if d.name == "max_steps":
                return int(max(d.values) if d.values is not None else d.high)  # type: ignore[arg-type]
        value = self.config.get("max_steps", _field_default(self.task, "max_steps"))
        assert isinstance(value, int)
        return value

    @property
    def eval_interval(self) -> int:
        """Training iterations between a trial's reports: ``[config] eval_interval`` or the default."""
        value = self.config.get("eval_interval", _field_default(self.task, "eval_interval"))
        assert isinstance(value, int)
        return value

    def with_overrides(
        self, *, name: str | None = None, num_samples: int | None = None, storage: str | None = None
    ) -> StudySpec:
        """The same spec under another name, trial count or storage, validated like a parsed one.

        ``source`` is rewritten to hold the overrides, so a resumed study runs what was started.
        """
        new_name = self.name if name is None else name
        check_name(new_name, "name")
        doc = tomllib.loads(self.source)
        changes: list[str] = []
        if num_samples is not None and num_samples != self.search.num_samples:
            doc.setdefault("search", {})["num_samples"] = num_samples
            changes.append(f"num_samples = {toml_value(num_samples)}")
        if storage is not None and storage != self.run.storage:
            doc.setdefault("run", {})["storage"] = storage
            changes.append(f"storage = {toml_value(storage)}")
        if not changes:
            return dataclasses.replace(self, name=new_name)
        note = f"spec {self.name!r} with overrides: {', '.join(changes)}"
        return parse_spec(rewritten_source(self.source, doc, note), new_name)


# -- loading ------------------------------------------------------------------------------------


def load_spec(name_or_path: str) -> StudySpec:
    """A shipped spec by name (``parity``, or a former name in `SPEC_ALIASES`) or a spec file by
    path (``my/study.toml``)."""
    is_path = name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path
    shipped_name = SPEC_ALIASES.get(name_or_path, name_or_path)
    path = Path(name_or_path) if is_path else SPECS_DIR / f"{shipped_name}.toml"
    if not path.is_file():
        shipped = list_specs()
        close = difflib.get_close_matches(name_or_path, shipped, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        what = f"no spec file {str(path)!r}" if is_path else f"no shipped spec named {name_or_path!r}"
        _fail("spec", f"{what}; {hint}shipped specs: {', '.join(shipped)} (or give the path of a .toml file)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _fail("spec", f"cannot read {str(path)!r}: {exc}")
    return parse_spec(text, path.stem if is_path else name_or_path, origin=str(path))


def parse_spec(text: str, name: str, *, origin: str | None = None) -> StudySpec:
    """Parse and check a spec's TOML text; ``name`` is the study's name, ``origin`` the file (for
    syntax errors). Raises `SpecError` at the first problem."""
    check_name(name, "name")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        _fail("", f"{origin or f'spec {name!r}'}: not valid TOML: {exc}")
    try:
        doc = document().validate_python(raw)
    except ValidationError as exc:
        key, line = first_error(exc)
        raise SpecError(line, key) from None
    return _cross_checked(doc, raw, name, text)


def _cross_checked(doc: Any, raw: dict[str, Any], name: str, text: str) -> StudySpec:
    """The checks across fields that the models (and the schema) cannot express."""
    task = doc.task
    fixed = {k: getattr(doc.config, k) for k in raw.get("config", {})}
    fixed = {k: tuple(v) if isinstance(v, list) else v for k, v in fixed.items()}
    iterations = fixed.get("iterations", _field_default(task, "iterations"))
    eval_interval = fixed.get("eval_interval", _field_default(task, "eval_interval"))
    if eval_interval > iterations:
        _fail(
            "config.eval_interval",
            f"eval_interval ({eval_interval}) is above iterations ({iterations}): a trial would report "
            "only at its end, leaving ASHA nothing to compare; lower eval_interval",
        )
    kinds = field_types(task)
    space = tuple(_dimension(n, getattr(doc.space, n), kinds[n] is int) for n in raw["space"])
    for d in space:
        if d.name in fixed:
            _fail(f"space.{d.name}", f"{d.name} is also fixed in [config]; remove it from one of the two")
    sets = _check_corners(task, fixed, space)
    search = doc.search
    if search.sampler == "grid":  # every point once: the size of the grid is the trial count
        search = _grid_search(search, space, given="num_samples" in raw.get("search", {}))
    objectives = tuple(doc.objectives.items())
    for metric, mode in objectives:
        _check_metric(metric, f"objectives.{toml_key(metric)}", task, sets)
        _check_mode(mode, metric, f"objectives.{toml_key(metric)}")
    if len(objectives) == 1:
        _fail(
            "objectives",
            "one objective is a single-objective study: set it as [scheduler] metric and mode (with "
            'ASHA), or add another, e.g. "test/mean_halting_step" = "min"',
        )
    scheduler = None
    if objectives and "scheduler" in raw:
        _fail(
            "scheduler",
            "ASHA compares trials on one metric, and [objectives] asks for several: a multi-objective "
            "study runs every trial to its budget; remove [scheduler] (or [objectives])",
        )
    if not objectives:
        scheduler = _checked_scheduler(doc.scheduler, task, sets, iterations, eval_interval)
    device = fixed.get("device", "auto")
    if device.startswith("cuda") and doc.resources.gpu == 0:
        _fail(
            "config.device",
            f"device {device!r} needs resources.gpu > 0: Ray hides the GPUs from a trial "
            'that asks for none; set [resources] gpu, or device = "auto"',
        )
    if doc.resources.fuse > 1:  # a fused step, on every data stream the trials may draw from
        searched = next((d.values or () for d in space if d.name == "data_stream"), None)
        streams = searched or (fixed.get("data_stream", _field_default(task, "data_stream")),)
        if (refusal := get_task(task).fuse_refusal(*map(str, streams))) is not None:
            _fail("resources.fuse", refusal)
    return StudySpec(
        name=name,
        task=task,
        description=doc.description,
        config=fixed,
        space=space,
        search=search,
        scheduler=scheduler,
        resources=doc.resources,
        run=doc.run,
        source=text,
        pareto_objectives=objectives,
    )


def _dimension(name: str, dim: Range[Any] | Values[Any], integer: bool) -> Dimension:
    """A validated ``[space.<name>]`` table as a `Dimension` (of an int field: ``integer``)."""
    if isinstance(dim, Values):
        return Dimension(name, None, None, values=tuple(dim.values), integer=integer)
    return Dimension(name, dim.low, dim.high, log=dim.log, integer=integer)


def _checked_scheduler(
    scheduler: SchedulerSpec, task: str, sets: list[str], iterations: int, eval_interval: int
) -> SchedulerSpec:
    _check_metric(scheduler.metric, "scheduler.metric", task, sets)
    _check_mode(scheduler.mode, scheduler.metric, "scheduler.mode")
    grace = scheduler.grace_period
    if grace is None:  # a quarter of the budget, on the evaluation grid
        grace = max(eval_interval, iterations // 4 // eval_interval * eval_interval)
    if grace > iterations:
        _fail(
            "scheduler.grace_period",
            f"grace_period ({grace}) is above the budget, config.iterations ({iterations}); lower it",
        )
    if grace < eval_interval:
        _fail(
            "scheduler.grace_period",
            f"grace_period ({grace}) is below config.eval_interval ({eval_interval}): ASHA sees a trial "
            f"only at its evaluations; use a multiple of {eval_interval}",
        )
    return scheduler.model_copy(update={"grace_period": grace})


def _grid_search(search: SearchSpec, space: tuple[Dimension, ...], given: bool) -> SearchSpec:
    ranges = [d.name for d in space if d.values is None]
    if ranges:
        _fail(
            f"space.{ranges[0]}",
            "the grid sampler tries listed values: give every searched field values = [...] "
            '(or use sampler = "tpe" for a range)',
        )
    size = math.prod(len(d.values or ()) for d in space)
    if given and search.num_samples != size:
        _fail("search.num_samples", f"the grid has {size} points; set num_samples = {size}, or leave it out")
    return search.model_copy(update={"num_samples": size})


def _check_corners(task: str, fixed: Mapping[str, Any], space: tuple[Dimension, ...]) -> list[str]:
    """Build the config at every corner of the space (each range's ends, each listed value) so that
    the config's own validation speaks before Ray starts; returns the evaluation sets reported at
    every corner."""
    cls = CONFIGS[task]
    points = [
        [("values", v) for v in d.values] if d.values is not None else [("low", d.low), ("high", d.high)]
        for d in space
    ]
    sets: list[str] | None = None
    for combo in _corners(points):
        searched: dict[str, Any] = {
            d.name: points[i][j][1] for i, (d, j) in enumerate(zip(space, combo, strict=True))
        }
        try:
            config = cls(**fixed, **searched)
        except ConfigError as exc:
            field_name = _config_error_field(exc)
            moved = [i for i, j in enumerate(combo) if j != 0]
            names = [d.name for d in space]
            if field_name in names:
                i = names.index(field_name)
                key = f"space.{field_name}.{points[i][combo[i]][0]}"
                alone = moved in ([], [i])
            elif field_name in fixed:
                key, alone = f"config.{field_name}", _fails_alone(cls, fixed, field_name)
            else:
                i = moved[0] if moved else 0
                key, alone = f"space.{names[i]}.{points[i][combo[i]][0]}", False
            at = "" if alone else " (at " + ", ".join(f"{k}={v!r}" for k, v in searched.items()) + ")"
            _fail(key, f"{exc}{at}")
        here = eval_set_names(config)
        sets = here if sets is None else [s for s in sets if s in here]
    assert sets is not None
    return sets


def _fails_alone(cls: type[TaskConfig], fixed: Mapping[str, Any], field_name: str) -> bool:
    """Whether the fixed fields, with defaults for the searched ones, fail on ``field_name`` too."""
    try:
        cls(**fixed)
    except ConfigError as exc:
        return _config_error_field(exc) == field_name
    return False


def _corners(points: list[list[tuple[str, Any]]]) -> Iterator[tuple[int, ...]]:
    """Indices into ``points``: all firsts, then each dimension's other points alone, then every
    combination (or, past `_MAX_CORNERS`, all lasts)."""
    base = tuple(0 for _ in points)
    yield base
    seen = {base}
    for i, options in enumerate(points):
        for j in range(1, len(options)):
            combo = (*base[:i], j, *base[i + 1 :])
            seen.add(combo)
            yield combo
    if math.prod(len(p) for p in points) <= _MAX_CORNERS:
        rest: Iterable[tuple[int, ...]] = itertools.product(*(range(len(p)) for p in points))
    else:
        rest = [tuple(len(p) - 1 for p in points)]
    for combo in rest:
        if combo not in seen:
            yield combo


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
        _fail(key, f"{why}; {hint}".rstrip("; "))


def _check_mode(mode: str, metric: str, key: str) -> None:
    want = _MODE_OF.get(metric.partition("/")[2])
    if want is not None and mode != want:
        _fail(key, f'mode = "{mode}" would keep the worst {metric}; use mode = "{want}"')


def _field_default(task: str, name: str) -> Any:
    (f,) = (f for f in dataclasses.fields(CONFIGS[task]) if f.name == name)
    return f.default


def _config_error_field(exc: ConfigError) -> str:
    """The field a `ConfigError` names: its messages start with it (``lambda_p must be ...``)."""
    return str(exc).split(" ", 1)[0]


def check_name(name: Any, key: str) -> None:
    """Refuse a study name that cannot name a folder and a Parquet partition (`SpecError`)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        _fail(
            key,
            f"study name {name!r} must start with an ASCII letter or digit and hold only ASCII letters "
            "(A-Z, a-z), digits, '.', '_' and '-' (it names a directory and a Parquet partition); "
            "give another --name or rename the spec file",
        )
    if not any(c.isalpha() for c in name):
        _fail(
            key,
            f"study name {name!r} must hold a letter: readers infer the study=<name> partition's type "
            "(pandas reads study=007 as the number 7, DuckDB and polars may read 2024-01-01 as a date); "
            f"give another --name, say 'study-{name}'",
        )
    if len(name) > MAX_NAME_LENGTH:
        _fail(
            key,
            f"study name is {len(name)} characters long, at most {MAX_NAME_LENGTH} fit (it becomes the "
            "folder name study=<name>, and a file name holds 255 bytes); give a shorter --name",
        )
