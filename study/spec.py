"""Study specs: one TOML file per named hyperparameter study, checked in full before Ray starts.

A spec names a task, fixes some of the task's config fields, searches others, and says how to
search (an Optuna sampler), when to stop poor trials early (ASHA), what a trial may use and where
the results go. Field names are the config dataclass's own (``lambda_p``, ``max_steps``), the
same names as the ``ponder.train`` flags and the Parquet columns::

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

Every table but ``[space]`` is optional. Validation is complete and strict: an unknown key, a
value of the wrong type or out of range, a search space with a corner the config itself refuses,
or a metric the task does not report is a `SpecError` whose one-line message starts with the
key (``space.lambda_p.high: lambda_p must be in (0, 1], got 1.5``) and says how to fix it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import itertools
import json
import math
import re
import tomllib
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn, Union, get_args, get_origin, get_type_hints

from ponder.config import CONFIGS, ConfigError, TaskConfig
from ponder.metrics import SET_LIST_METRICS, SET_METRICS, TRAIN_METRICS, eval_set_names
from study.storage import StorageError, expand_storage

__all__ = [
    "NAME_PATTERN",
    "SAMPLERS",
    "SPECS_DIR",
    "Dimension",
    "ResourcesSpec",
    "RunSpec",
    "SchedulerSpec",
    "SearchSpec",
    "SpecError",
    "StudySpec",
    "check_name",
    "list_specs",
    "load_spec",
    "parse_spec",
    "to_toml",
]

SPECS_DIR = Path(__file__).parent / "specs"
"""Where the shipped specs live, one ``<name>.toml`` each."""

SAMPLERS = ("tpe", "random", "qmc", "gp", "cmaes", "grid")
"""Optuna samplers a spec may name."""

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A study name: it becomes a directory name and a Parquet partition value (``study=<name>``)."""
MAX_NAME_LENGTH = 255 - len("study=")
"""The longest name whose longest file-name component, ``study=<name>``, fits in 255 bytes
(names are ASCII: a character is a byte)."""

_MAX_CORNERS = 4096  # past this many corners of the space, check each dimension's ends alone

# fields a study may not search: the budget is ASHA's max_t, the interval its reporting grid
_NOT_SEARCHABLE = {
    "iterations": "it is the trial budget (ASHA's max_t); set it in [config]",
    "eval_interval": "ASHA compares trials at evaluations, which must line up; set it in [config]",
}

_TABLES = ("config", "space", "search", "scheduler", "objectives", "resources", "run")
_TOP_KEYS = ("description", "task", *_TABLES)
_DIMENSION_KEYS = ("low", "high", "log", "values")


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
class SearchSpec:
    """How trials are proposed: an Optuna sampler, its seed, how many trials, how many at once."""

    sampler: str = "tpe"
    seed: int | None = 0
    num_samples: int = 8
    max_concurrent: int = 2


@dataclass(frozen=True)
class SchedulerSpec:
    """ASHA: compare trials on ``metric`` at rungs from ``grace_period`` training iterations."""

    metric: str = "test/halted_accuracy"
    mode: str = "max"
    grace_period: int = 500
    """Training iterations before a trial can be stopped; a spec without one gets a quarter
    of its budget, on the evaluation grid."""
    reduction_factor: float = 3.0
    brackets: int = 1


@dataclass(frozen=True)
class ResourcesSpec:
    """What one trial reserves; a fractional ``gpu`` shares a GPU between trials."""

    cpu: float = 1.0
    gpu: float = 0.0


@dataclass(frozen=True)
class RunSpec:
    """Where results land and how often a failed trial is retried from its checkpoint."""

    storage: str = "results"
    max_failures: int = 2


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
            _positive_int(num_samples, "search.num_samples", "num_samples")
            doc.setdefault("search", {})["num_samples"] = num_samples
            changes.append(f"num_samples = {num_samples}")
        if storage is not None and storage != self.run.storage:
            _storage(storage, "run.storage")
            doc.setdefault("run", {})["storage"] = storage
            changes.append(f"storage = {_toml_value(storage)}")
        if not changes:
            return dataclasses.replace(self, name=new_name)
        header = list(itertools.takewhile(lambda line: line.startswith("#"), self.source.splitlines()))
        header.append(f"# spec {self.name!r} with overrides: {', '.join(changes)}")
        return parse_spec("\n".join(header) + "\n" + to_toml(doc), new_name)


# -- loading ------------------------------------------------------------------------------------


def list_specs() -> list[str]:
    """Names of the shipped specs, sorted."""
    return sorted(p.stem for p in SPECS_DIR.glob("*.toml"))


def load_spec(name_or_path: str) -> StudySpec:
    """A shipped spec by name (``parity``) or a spec file by path (``my/study.toml``)."""
    is_path = name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path
    path = Path(name_or_path) if is_path else SPECS_DIR / f"{name_or_path}.toml"
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
    return parse_spec(text, path.stem, origin=str(path))


def parse_spec(text: str, name: str, *, origin: str | None = None) -> StudySpec:
    """Parse and check a spec's TOML text; ``name`` is the study's name, ``origin`` the file (for
    syntax errors). Raises `SpecError` at the first problem."""
    check_name(name, "name")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        _fail("", f"{origin or f'spec {name!r}'}: not valid TOML: {exc}")
    _check_keys(doc, _TOP_KEYS, "")
    tables = {t: _table(doc, t) for t in _TABLES}

    task = doc.get("task")
    if task is None:
        _fail("task", f'missing; set task = "parity" at the top (tasks: {", ".join(CONFIGS)})')
    if not isinstance(task, str) or task not in CONFIGS:
        _fail("task", f"must be one of {', '.join(CONFIGS)}, got {task!r}")
    description = doc.get("description", "")
    if not isinstance(description, str) or "\n" in description:
        _fail("description", f"must be a one-line string, got {description!r}")

    kinds = _field_kinds(task)
    fixed = _parse_config(tables["config"], kinds)
    iterations = fixed.get("iterations", _field_default(task, "iterations"))
    eval_interval = fixed.get("eval_interval", _field_default(task, "eval_interval"))
    if iterations < 1:
        _fail("config.iterations", f"a study needs iterations >= 1 (ASHA's budget), got {iterations}")
    if eval_interval > iterations:
        _fail(
            "config.eval_interval",
            f"eval_interval ({eval_interval}) is above iterations ({iterations}): a trial would report "
            "only at its end, leaving ASHA nothing to compare; lower eval_interval",
        )
    space = _parse_space(tables["space"], fixed, kinds)
    set_names = _check_corners(task, fixed, space)
    search = _parse_search(tables["search"])
    if search.sampler == "grid":  # every point once: the size of the grid is the trial count
        search = _grid_search(search, space, given="num_samples" in tables["search"])
    objectives = _parse_objectives(tables["objectives"], task, set_names)
    if objectives and "scheduler" in doc:
        _fail(
            "scheduler",
            "ASHA compares trials on one metric, and [objectives] asks for several: a multi-objective "
            "study runs every trial to its budget; remove [scheduler] (or [objectives])",
        )
    scheduler = None
    if not objectives:
        scheduler = _parse_scheduler(tables["scheduler"], task, set_names, iterations, eval_interval)
    resources = _parse_resources(tables["resources"])
    run = _parse_run(tables["run"])
    device = fixed.get("device", "auto")
    if device.startswith("cuda") and resources.gpu == 0:
        _fail(
            "config.device",
            f"device {device!r} needs resources.gpu > 0: Ray hides the GPUs from a trial "
            'that asks for none; set [resources] gpu, or device = "auto"',
        )
    return StudySpec(
        name=name,
        task=task,
        description=description,
        config=fixed,
        space=space,
        search=search,
        scheduler=scheduler,
        resources=resources,
        run=run,
        source=text,
        pareto_objectives=objectives,
    )


# -- the sections -------------------------------------------------------------------------------


def _parse_config(table: dict[str, Any], kinds: Mapping[str, _Kind]) -> dict[str, Any]:
    if "task" in table:
        _fail("config.task", 'the task is set at the top of the spec (task = "..."), not in [config]')
    _check_keys(table, kinds, "config")
    return {key: _coerce(value, kinds[key], f"config.{key}", key) for key, value in table.items()}


def _parse_space(
    table: dict[str, Any], fixed: Mapping[str, Any], kinds: Mapping[str, _Kind]
) -> tuple[Dimension, ...]:
    if not table:
        _fail("space", "no searched fields; add at least one [space.<field>] table, e.g. [space.lambda_p]")
    dims = []
    for name, spec in table.items():
        key = f"space.{name}"
        if name in _NOT_SEARCHABLE:
            _fail(key, f"{name} cannot be searched: {_NOT_SEARCHABLE[name]}")
        if name not in kinds:
            searchable = [
                k for k, kind in kinds.items() if k not in _NOT_SEARCHABLE and kind.kind != "floats"
            ]
            _check_keys({name: None}, searchable, "space")
        if name in fixed:
            _fail(key, f"{name} is also fixed in [config]; remove it from one of the two")
        if not isinstance(spec, dict):
            _fail(
                key,
                f"must be a table ([{key}] with low/high or values), got {_show(spec)}; "
                f"to fix {name} at one value, set it in [config]",
            )
        _check_keys(spec, _DIMENSION_KEYS, key)
        dims.append(_parse_dimension(name, spec, kinds[name], key))
    return tuple(dims)


def _parse_dimension(name: str, spec: dict[str, Any], kind: _Kind, key: str) -> Dimension:
    if kind.kind == "floats":
        _fail(key, f"{name} is a list field and cannot be searched; set it in [config]")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        _fail(f"{key}.log", f"must be true or false, got {log!r}")
    if "values" in spec:
        if "log" in spec:
            _fail(f"{key}.log", "log applies to a low/high range, not to values; remove it")
        extra = [k for k in ("low", "high") if k in spec]
        if extra:
            _fail(
                f"{key}.{extra[0]}", "a dimension has either low/high (a range) or values (a list), not both"
            )
        values = spec["values"]
        if not isinstance(values, list) or not values:
            _fail(f"{key}.values", f"must be a non-empty list of {name} values, got {values!r}")
        coerced = tuple(_coerce(v, kind, f"{key}.values", name) for v in values)
        for i, v in enumerate(coerced):
            if v in coerced[:i]:
                _fail(f"{key}.values", f"{v!r} is listed twice; list each value once")
        return Dimension(name, None, None, values=coerced, integer=kind.kind == "int")
    if kind.kind == "str":
        choices = f" (one of {', '.join(kind.choices)})" if kind.choices else ""
        _fail(key, f"{name} is a string field: search it with values = [...]{choices}, not low/high")
    for end in ("low", "high"):
        if end not in spec:
            _fail(f"{key}.{end}", "missing; a range needs low and high (or give values = [...] instead)")
    low = _coerce(spec["low"], kind, f"{key}.low", f"{name} low")
    high = _coerce(spec["high"], kind, f"{key}.high", f"{name} high")
    if not low < high:
        _fail(
            f"{key}.high",
            f"high ({high}) must be above low ({low}); to fix {name} at one value, set it in [config]",
        )
    if log and low <= 0:
        _fail(f"{key}.low", f"log = true needs low > 0, got {low}")
    return Dimension(name, low, high, log=log, integer=kind.kind == "int")


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


def _parse_search(table: dict[str, Any]) -> SearchSpec:
    _check_keys(table, [f.name for f in dataclasses.fields(SearchSpec)], "search")
    default = SearchSpec()
    sampler = table.get("sampler", default.sampler)
    if sampler not in SAMPLERS:
        close = difflib.get_close_matches(str(sampler), SAMPLERS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        _fail("search.sampler", f"must be one of {', '.join(SAMPLERS)}, got {sampler!r}{hint}")
    needs = {"cmaes": "cmaes", "qmc": "scipy", "gp": "scipy"}.get(sampler)
    if needs and importlib.util.find_spec(needs) is None:
        _fail(
            "search.sampler",
            f'the {sampler} sampler needs the {needs} package: pip install {needs}, or use sampler = "tpe"',
        )
    seed = table.get("seed", default.seed)
    if seed is not None:
        seed = _int(seed, "search.seed", "seed")
        if not 0 <= seed < 2**32:
            _fail("search.seed", f"must be in [0, 2**32), got {seed}")
    num_samples = _positive_int(
        table.get("num_samples", default.num_samples), "search.num_samples", "num_samples"
    )
    max_concurrent = _positive_int(
        table.get("max_concurrent", default.max_concurrent), "search.max_concurrent", "max_concurrent"
    )
    return SearchSpec(sampler=sampler, seed=seed, num_samples=num_samples, max_concurrent=max_concurrent)


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
    return dataclasses.replace(search, num_samples=size)


# the direction a metric is always optimised in: the other would keep the worst trials
_MODE_OF = {
    "halted_accuracy": "max",
    "best_step_accuracy": "max",
    "stable_accuracy": "max",
    "loss": "min",
    "loss_rec": "min",
}


def _check_metric(metric: Any, key: str, task: str, sets: list[str]) -> None:
    """``metric`` is a number every trial reports: ``<set>/<metric>`` of an evaluation set the
    config has at every point of the space, or ``train/<metric>``."""
    if not isinstance(metric, str):
        _fail(key, f'must be a string like "test/halted_accuracy", got {metric!r}')
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


def _check_mode(mode: Any, metric: str, key: str) -> None:
    if mode not in ("max", "min"):
        _fail(key, f'must be "max" or "min", got {mode!r}')
    want = _MODE_OF.get(metric.partition("/")[2])
    if want is not None and mode != want:
        _fail(key, f'mode = "{mode}" would keep the worst {metric}; use mode = "{want}"')


def _parse_objectives(table: dict[str, Any], task: str, sets: list[str]) -> tuple[tuple[str, str], ...]:
    """``[objectives]``: ``"<metric>" = "max" | "min"``, two or more, the primary first."""
    if not table:
        return ()
    for metric, mode in table.items():
        key = f'objectives."{metric}"'
        _check_metric(metric, key, task, sets)
        _check_mode(mode, metric, key)
    if len(table) < 2:
        _fail(
            "objectives",
            "one objective is a single-objective study: set it as [scheduler] metric and mode (with "
            'ASHA), or add another, e.g. "test/mean_halting_step" = "min"',
        )
    return tuple((metric, mode) for metric, mode in table.items())


def _parse_scheduler(
    table: dict[str, Any], task: str, sets: list[str], iterations: int, eval_interval: int
) -> SchedulerSpec:
    _check_keys(table, [f.name for f in dataclasses.fields(SchedulerSpec)], "scheduler")
    default = SchedulerSpec()
    metric = table.get("metric", default.metric)
    _check_metric(metric, "scheduler.metric", task, sets)
    mode = table.get("mode", default.mode)
    _check_mode(mode, metric, "scheduler.mode")
    if "grace_period" in table:
        grace = _positive_int(table["grace_period"], "scheduler.grace_period", "grace_period")
    else:  # a quarter of the budget, on the evaluation grid
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
    factor = _number(table.get("reduction_factor", default.reduction_factor), "scheduler.reduction_factor")
    if not factor > 1:
        _fail("scheduler.reduction_factor", f"must be above 1 (3 keeps a third at each rung), got {factor}")
    brackets = _positive_int(table.get("brackets", default.brackets), "scheduler.brackets", "brackets")
    return SchedulerSpec(
        metric=metric, mode=mode, grace_period=grace, reduction_factor=factor, brackets=brackets
    )


def _parse_resources(table: dict[str, Any]) -> ResourcesSpec:
    _check_keys(table, [f.name for f in dataclasses.fields(ResourcesSpec)], "resources")
    default = ResourcesSpec()
    cpu = _number(table.get("cpu", default.cpu), "resources.cpu")
    if not cpu > 0:
        _fail("resources.cpu", f"must be above 0 (CPUs per trial), got {cpu:g}")
    gpu = _number(table.get("gpu", default.gpu), "resources.gpu")
    if gpu < 0:
        _fail("resources.gpu", f"must be >= 0 (GPUs per trial), got {gpu:g}")
    if gpu > 1 and not gpu.is_integer():
        _fail("resources.gpu", f"above 1 must be a whole number of GPUs, got {gpu:g}")
    return ResourcesSpec(cpu=cpu, gpu=gpu)


def _parse_run(table: dict[str, Any]) -> RunSpec:
    _check_keys(table, [f.name for f in dataclasses.fields(RunSpec)], "run")
    default = RunSpec()
    storage = _storage(table.get("storage", default.storage), "run.storage")
    failures = _int(table.get("max_failures", default.max_failures), "run.max_failures", "max_failures")
    if failures < 0:
        _fail("run.max_failures", f"must be >= 0 (0: a trial that errors stays failed), got {failures}")
    return RunSpec(storage=storage, max_failures=failures)


# -- values -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Kind:
    """What TOML value a config field takes: int, float, str (maybe from a fixed set), or floats."""

    kind: Literal["int", "float", "str", "floats"]
    choices: tuple[str, ...] = ()


def _field_kinds(task: str) -> dict[str, _Kind]:
    cls = CONFIGS[task]
    hints = get_type_hints(cls)
    kinds: dict[str, _Kind] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if isinstance(hint, types.UnionType) or get_origin(hint) is Union:
            (hint,) = (a for a in get_args(hint) if a is not type(None))
        if get_origin(hint) is Literal:
            kinds[f.name] = _Kind("str", tuple(str(a) for a in get_args(hint)))
        elif get_origin(hint) is tuple:
            kinds[f.name] = _Kind("floats")
        elif hint is int:
            kinds[f.name] = _Kind("int")
        elif hint is float:
            kinds[f.name] = _Kind("float")
        elif hint is str:
            kinds[f.name] = _Kind("str")
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no TOML kind for {hint!r}")
    return kinds


def _field_default(task: str, name: str) -> Any:
    (f,) = (f for f in dataclasses.fields(CONFIGS[task]) if f.name == name)
    return f.default


def _config_error_field(exc: ConfigError) -> str:
    """The field a `ConfigError` names: its messages start with it (``lambda_p must be ...``)."""
    return str(exc).split(" ", 1)[0]


def _coerce(value: Any, kind: _Kind, key: str, what: str) -> Any:
    """``value`` as the field's type; ``what`` names the value in the message."""
    if kind.kind == "int":
        return _int(value, key, what)
    if kind.kind == "float":
        return _number(value, key, what)
    if kind.kind == "floats":
        if not isinstance(value, list):
            _fail(key, f"{what} must be a list of numbers, got {_show(value)}")
        return tuple(_number(v, key, f"each of {what}") for v in value)
    if not isinstance(value, str):
        _fail(key, f"{what} must be a string, got {_show(value)}")
    if kind.choices and value not in kind.choices:
        close = difflib.get_close_matches(value, kind.choices, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        _fail(key, f"{what} must be one of {', '.join(kind.choices)}, got {value!r}{hint}")
    return value


def _int(value: Any, key: str, what: str = "") -> int:
    what = what or key.rsplit(".", 1)[-1]
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        _fail(key, f"{what} must be an integer, got {value!r}; write {int(value)}")
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
        _fail(key, f"{what} must be an integer, got the string {value!r}; remove the quotes")
    _fail(key, f"{what} must be an integer, got {_show(value)}")


def _number(value: Any, key: str, what: str = "") -> float:
    what = what or key.rsplit(".", 1)[-1]
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            _fail(key, f"{what} must be a finite number, got {value!r}")
        return float(value)
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            pass
        else:
            _fail(key, f"{what} must be a number, got the string {value!r}; remove the quotes")
    _fail(key, f"{what} must be a number, got {_show(value)}")


def _positive_int(value: Any, key: str, what: str) -> int:
    number = _int(value, key, what)
    if number < 1:
        _fail(key, f"{what} must be >= 1, got {number}")
    return number


def _storage(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        _fail(key, f'must be a non-empty path or URI (storage = "results"), got {_show(value)}')
    try:
        return expand_storage(value)
    except StorageError as e:
        _fail(key, str(e))


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


def _show(value: Any) -> str:
    """A value and its TOML type, for messages."""
    kinds = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array"}
    kind = kinds.get(type(value), "a table" if isinstance(value, dict) else type(value).__name__)
    return f"{value!r} ({kind})"


def _table(doc: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        _fail(key, f"must be a table ([{key}] on a line of its own), got {_show(value)}")
    return value


def _check_keys(table: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    known = list(known)
    for key in table:
        if key not in known:
            close = _closest(key, known)
            hint = f"did you mean {close!r}? " if close else ""
            path = f"{where}.{key}" if where else key
            section = f"[{where}]" if where else "the top level"
            _fail(path, f"unknown key; {hint}keys of {section}: {', '.join(sorted(known))}")


def _closest(key: str, known: list[str]) -> str | None:
    """The known key ``key`` most likely misspells: the one containing it (``grace`` for
    ``grace_period``) or contained in it (``gpus``), else the closest by difflib."""
    within = [k for k in known if len(key) >= 3 and (key in k or k in key)]
    if len(within) == 1:
        return within[0]
    close = difflib.get_close_matches(key, known, n=1)
    return close[0] if close else None


# -- writing TOML (for overrides) ---------------------------------------------------------------


def to_toml(doc: Mapping[str, Any], prefix: str = "") -> str:
    """TOML text for a parsed spec document (``tomllib.loads(spec.source)``, edited): scalars
    first, then each table under its header."""
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, value in doc.items():
        if isinstance(value, dict):
            header = f"{prefix}{_toml_key(key)}"
            body = to_toml(value, header + ".")
            if any(not isinstance(v, dict) for v in value.values()) or not value:
                out += f"\n[{header}]\n"
            out += body
    return out


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            repr(value)
            if math.isfinite(value)
            else ("nan" if math.isnan(value) else f"{'-' if value < 0 else ''}inf")
        )
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")
