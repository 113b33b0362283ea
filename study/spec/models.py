"""The spec document's typed models (pydantic v2), its JSON Schema, and pydantic's errors said as
the spec's one-line messages.

A spec is a union on ``task``: each task's model has its own ``[config]`` and ``[space]``, built
from that task's config dataclass (`ponder.config`), so its fields, types, choices and field
docstrings are the dataclass's. The models check keys, types and simple bounds; `study.spec.spec`
makes the checks across fields that neither they nor the schema can express.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import re
import types
from collections.abc import Iterable
from typing import (
    Annotated,
    Any,
    ClassVar,
    Generic,
    Literal,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from ponder.config import CONFIGS, fields_of
from study.storage.storage import StorageError, expand_storage

__all__ = [
    "NOT_SEARCHABLE",
    "SAMPLERS",
    "SAMPLER_NEEDS",
    "Range",
    "ResourcesSpec",
    "RunSpec",
    "SchedulerSpec",
    "SearchSpec",
    "Values",
    "document",
    "field_types",
    "first_error",
    "json_schema",
    "schema_text",
    "show",
    "spec_model",
    "toml_key",
]

SAMPLERS = ("tpe", "random", "qmc", "gp", "cmaes", "grid")
"""Optuna samplers a spec may name."""
Sampler = Literal["tpe", "random", "qmc", "gp", "cmaes", "grid"]
SAMPLER_NEEDS = {"qmc": "scipy", "gp": "scipy", "cmaes": "cmaes"}
"""The package a sampler needs that the project does not install (Optuna imports it on use)."""
Mode = Literal["max", "min"]

NOT_SEARCHABLE = {
    "iterations": "it is the trial budget (ASHA's max_t); set it in [config]",
    "eval_interval": "ASHA compares trials at evaluations, which must line up; set it in [config]",
}
"""Fields a study may not search: the budget is ASHA's max_t, the interval its reporting grid."""


class _At(ValueError):
    """A problem a validator found at ``key`` below the place it validates (pydantic adds the
    place); ``known`` lists the keys there, for an unknown key."""

    def __init__(self, key: tuple[str, ...], message: str, known: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.key, self.message, self.known = key, message, sorted(known)


class _Table(BaseModel):
    """A TOML table: strict types (no ``"10"`` for 10), finite numbers, no unknown keys."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, allow_inf_nan=False, use_attribute_docstrings=True
    )
    _also: ClassVar[tuple[str, ...]] = ()  # keys of another shape of the same table

    @model_validator(mode="before")
    @classmethod
    def _check_input(cls, data: Any) -> Any:
        if isinstance(data, dict):
            cls._check_keys(data)
        return data

    @classmethod
    def _check_keys(cls, data: dict[str, Any]) -> None:
        for key in data:
            if key not in cls.model_fields:
                close = _closest(key, list(cls.model_fields))
                hint = f"did you mean {close!r}? " if close else ""
                raise _At((key,), f"unknown key; {hint}", known=[*cls.model_fields, *cls._also])


class SearchSpec(_Table):
    """How trials are proposed: an Optuna sampler, its seed, how many trials, how many at once."""

    sampler: Sampler = "tpe"
    """the Optuna sampler; grid tries every combination of listed values once"""
    seed: int = Field(0, ge=0, lt=2**32)
    """the sampler's seed, in [0, 2**32)"""
    num_samples: int = Field(8, ge=1)
    """trials in the study; the grid sampler's is the grid's size"""
    max_concurrent: int = Field(2, ge=1)
    """trials running at once, at most"""

    @field_validator("sampler")
    @classmethod
    def _installed(cls, sampler: str) -> str:
        needs = SAMPLER_NEEDS.get(sampler)
        if needs and importlib.util.find_spec(needs) is None:
            raise _At(
                (),
                f"the {sampler} sampler needs the {needs} package: pip install {needs}, "
                'or use sampler = "tpe"',
            )
        return sampler


class SchedulerSpec(_Table):
    """ASHA: compare trials on ``metric`` at rungs from ``grace_period`` training iterations."""

    metric: str = "test/halted_accuracy"
    """what ASHA compares and the study optimises: <set>/<metric> or train/<metric>"""
    mode: Mode = "max"
    """whether a higher (max) or lower (min) metric is better"""
    grace_period: int = Field(None, ge=1)  # type: ignore[assignment]  # None until parse_spec sets it
    """training iterations before ASHA may stop a trial; default: a quarter of config.iterations,
    rounded down to a multiple of config.eval_interval (at least one eval_interval)"""
    reduction_factor: float = Field(3.0, gt=1)
    """3 keeps a third of the trials at each rung"""
    brackets: int = Field(1, ge=1)
    """ASHA's brackets: with k > 1 each trial is put in one of k, whose first rung is grace_period
    times reduction_factor to the power 0 .. k-1 (HyperBand's hedge against a too-short grace)"""


RAY_SMALLEST_SHARE = 0.0001
"""The smallest fraction of a CPU or GPU a Ray task may reserve (Ray refuses a finer one)."""


class ResourcesSpec(_Table):
    """What one trial reserves (with ``fuse``, one fused group of trials); a fractional ``gpu``
    shares a GPU between trials."""

    cpu: float = Field(1.0, gt=0)
    """CPUs per trial (with fuse > 1: per fused group)"""
    gpu: float = Field(0.0, ge=0)
    """GPUs per trial (fuse > 1: per group, at most 1); a fraction (0.25) shares a GPU; above 1, whole"""
    fuse: int = Field(1, ge=1)
    """up to this many trials trained as one model on one device (with gpu at most 1), for a task
    that fuses on the trials' data stream; 1: a process a trial"""

    @model_validator(mode="after")
    def _reservable(self) -> ResourcesSpec:
        """Whole GPUs above 1, one GPU a fused group, and no trial's share below what Ray reserves."""
        if self.gpu > 1 and not self.gpu.is_integer():
            raise _At(("gpu",), f"above 1 must be a whole number of GPUs, got {self.gpu:g}")
        if self.fuse > 1 and self.gpu > 1:
            raise _At(("gpu",), f"a fused group trains on one GPU: at most 1 with fuse > 1, got {self.gpu:g}")
        for name, amount in (("cpu", self.cpu), ("gpu", self.gpu)):
            share = amount / self.fuse  # what one trial reserves
            if 0 < share < RAY_SMALLEST_SHARE:
                where = ("fuse",) if self.fuse > 1 else (name,)
                fix = (
                    f"fuse at most {int(amount / RAY_SMALLEST_SHARE + 1e-9)} with {name} = {amount:g}"
                    if self.fuse > 1
                    else f"set {name} to at least {RAY_SMALLEST_SHARE:g}"
                )
                raise _At(
                    where,
                    f"each trial would reserve {share:.2g} {name.upper()}, below Ray's smallest share "
                    f"({RAY_SMALLEST_SHARE:g}): {fix}",
                )
        return self


class RunSpec(_Table):
    """Where results land, how often a failed trial is retried from its checkpoint, how often the
    Parquet is refreshed while the study runs, and whether TensorBoard gets every report."""

    storage: str = "results"
    """a local directory or a URI (s3://bucket/path, file:///mnt/nfs/results) holding the study"""
    max_failures: int = Field(2, ge=0)
    """retries of a trial that errors, from its last checkpoint; 0: it stays failed"""
    parquet_refresh_s: float = Field(10.0, ge=0)
    """the least seconds between two writes of the Parquet while the study runs (and never more
    than 5 % of the driver's time); the run's end writes it whole"""
    tensorboard: bool = False
    """write each trial's reports as TensorBoard scalars under tune/<name>/ as they come"""

    @field_validator("storage")
    @classmethod
    def _expand(cls, storage: str) -> str:
        if not storage.strip():
            raise _At((), f'must be a non-empty path or URI (storage = "results"), got {storage!r}')
        try:
            return expand_storage(storage)
        except StorageError as e:
            raise _At((), str(e)) from None


T = TypeVar("T")


class Range(_Table, Generic[T]):
    """A searched range, both ends included."""

    _also = ("values",)

    low: T
    """the lower end"""
    high: T
    """the upper end, above low"""
    log: bool = False
    """sample on a log scale (needs low > 0)"""

    @model_validator(mode="after")
    def _ordered(self) -> Range[T]:
        low, high = self.low, self.high
        if not low < high:  # type: ignore[operator]
            raise _At(
                ("high",),
                f"high ({high}) must be above low ({low}); to fix the field at one value, set it in [config]",
            )
        if self.log and low <= 0:  # type: ignore[operator]
            raise _At(("low",), f"log = true needs low > 0, got {low}")
        return self


class Values(_Table, Generic[T]):
    """A searched list of values, each tried as it is (categorical)."""

    values: list[T] = Field(min_length=1)
    """the values, each listed once"""

    @classmethod
    def _check_keys(cls, data: dict[str, Any]) -> None:
        for key in ("low", "high"):
            if key in data:
                raise _At((key,), "a dimension has either low/high (a range) or values (a list), not both")
        if "log" in data:
            raise _At(("log",), "log applies to a low/high range, not to values; remove it")
        super()._check_keys(data)

    @model_validator(mode="after")
    def _once(self) -> Values[T]:
        for i, v in enumerate(self.values):
            if v in self.values[:i]:
                raise _At(("values",), f"{v!r} is listed twice; list each value once")
        return self


def _dimension_kind(value: Any) -> str:
    return "<values>" if isinstance(value, dict) and "values" in value else "<range>"


class _Space(_Table):
    """``[space]``: the searched fields, each a range or a list of values."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})
    _unsearchable: ClassVar[dict[str, str]] = {}  # field -> why it cannot be searched
    _strings: ClassVar[dict[str, tuple[str, ...]]] = {}  # string fields -> their choices

    @classmethod
    def _check_keys(cls, data: dict[str, Any]) -> None:
        if not data:
            raise _At((), "no searched fields; add at least one [space.<field>] table, e.g. [space.lambda_p]")
        for name, value in data.items():
            if name in cls._unsearchable:
                raise _At((name,), f"{name} cannot be searched: {cls._unsearchable[name]}")
            if name not in cls.model_fields:
                super()._check_keys({name: value})
            if not isinstance(value, dict):
                raise _At(
                    (name,),
                    f"must be a table ([space.{name}] with low/high or values), got {show(value)}; "
                    f"to fix {name} at one value, set it in [config]",
                )
            if name in cls._strings and "values" not in value:
                choices = cls._strings[name]
                one_of = f" (one of {', '.join(choices)})" if choices else ""
                raise _At(
                    (name,), f"{name} is a string field: search it with values = [...]{one_of}, not low/high"
                )


class _Config(_Table):
    """``[config]``: fixed fields of the task's config."""

    @classmethod
    def _check_keys(cls, data: dict[str, Any]) -> None:
        if "task" in data:
            raise _At(("task",), 'the task is set at the top of the spec (task = "..."), not in [config]')
        super()._check_keys(data)


class _Spec(_Table):
    """What every task's spec holds; `spec_model` adds ``task``, ``[config]`` and ``[space]``."""

    description: str = Field("", pattern=r"^[^\n]*$")
    """a one-line summary, shown by `ponder-study list`"""
    task: str  # each task's model narrows these three (`spec_model`)
    config: Any = None
    space: Any
    search: SearchSpec = SearchSpec()
    """how trials are proposed"""
    scheduler: SchedulerSpec = SchedulerSpec()
    """ASHA, which stops poor trials early; not with [objectives]"""
    objectives: dict[str, Mode] = {}
    """two or more "<metric>" = "max" | "min": a multi-objective study (no ASHA), the primary first"""
    resources: ResourcesSpec = ResourcesSpec()
    """what one trial reserves"""
    run: RunSpec = RunSpec()
    """where the results go, how often a failed trial is retried"""


def field_types(task: str) -> dict[str, Any]:
    """Each config field's TOML type: int, float, str, a Literal, or a list of floats (TOML has no
    None: an optional field's type is its values')."""
    return {
        f.name: types.GenericAlias(list, (f.item,)) if f.kind is tuple else f.type  # list[float]
        for f in fields_of(CONFIGS[task])
    }


@functools.cache
def spec_model(task: str) -> type[_Spec]:
    """The spec of one task: its ``[config]`` and ``[space]`` hold that task's config fields."""
    cls = CONFIGS[task]
    kinds = field_types(task)
    docs = {f.name: f.doc or None for f in fields_of(cls)}
    config_fields: dict[str, Any] = {}
    for f in fields_of(cls):
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        least = 1 if f.name == "iterations" else None  # a study needs a budget
        config_fields[f.name] = (kinds[f.name], Field(default, description=docs[f.name], ge=least))
    config = create_model(f"{cls.__name__}Fields", __base__=_Config, **config_fields)
    config.__doc__ = f"[config]: fixed fields of the {task} task's config (ponder.config.{cls.__name__})."
    space_fields: dict[str, Any] = {}
    unsearchable = dict(NOT_SEARCHABLE)
    strings: dict[str, tuple[str, ...]] = {}
    for name, kind in kinds.items():
        if name in NOT_SEARCHABLE:
            continue
        if get_origin(kind) is list:
            unsearchable[name] = "it is a list field; set it in [config]"
            continue
        if kind is str or get_origin(kind) is Literal:
            strings[name] = tuple(get_args(kind))
            dim: Any = Values[kind]  # type: ignore[valid-type]
        else:
            dim = Annotated[
                Union[Annotated[Range[kind], Tag("<range>")], Annotated[Values[kind], Tag("<values>")]],  # type: ignore[valid-type]  # noqa: UP007
                Discriminator(_dimension_kind),
            ]
        space_fields[name] = (dim, Field(None, description=docs.get(name)))
    space = create_model(f"{cls.__name__}Space", __base__=_Space, **space_fields)
    space._unsearchable, space._strings = unsearchable, strings
    task_type: Any = Literal[task]
    model = create_model(
        f"{cls.__name__.removesuffix('Config').capitalize()}Spec",
        __base__=_Spec,
        task=(task_type, Field(description=f"the task: {cls.__doc__}")),
        config=(config, Field(config(), description=config.__doc__)),
        space=(space, Field(description="[space.<field>]: the searched fields, each a range or values")),
    )
    model.__doc__ = f"A study of the {task} task."
    return model


@functools.cache
def document() -> TypeAdapter[_Spec]:
    """The whole spec document: a union of the tasks' models, told apart by ``task``.

    Built at first use, not at import: the task models are made with `create_model`, and pydantic
    looks for each one's field docstrings by walking the caller's frames, each frame that is not
    a module's file (an import's) costing a scan of ``sys.modules``. Built at import, under the
    frames of Ray's and this project's imports, that was 0.6 s of CPU at the start of every Ray
    worker that runs trials (profiled), and a trial never parses a spec."""
    models = tuple(spec_model(task) for task in CONFIGS)
    any_task: Any = Annotated[Union[models], Field(discriminator="task")]  # noqa: UP007
    return TypeAdapter(any_task)


_TABLE_MODELS: dict[str, type[_Table]] = {
    "search": SearchSpec,
    "scheduler": SchedulerSpec,
    "resources": ResourcesSpec,
    "run": RunSpec,
}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a spec's TOML document (``ponder-study schema``, ``specs/spec.schema.json``)."""
    schema = _drop_null_defaults(document().json_schema())
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "ponder-study spec",
        "description": (
            "A ponder-study spec: one hyperparameter study of a PonderNet task (ponder-study run SPEC). "
            "The schema checks keys, types and simple bounds per task. It cannot express the checks "
            "across fields that `ponder-study check SPEC` makes: the ranges the task's config accepts "
            "(lambda_p in (0, 1], ...) at every corner of the search space, a field both fixed and "
            "searched, metrics the task reports at every point of the space, ASHA's grace_period "
            "against the budget, the grid sampler's values and size, [scheduler] with [objectives], "
            "a cuda device without resources.gpu, the storage URI's scheme."
        ),
        **schema,
    }


def schema_text() -> str:
    """`json_schema` as the text of ``specs/spec.schema.json``."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def _drop_null_defaults(node: Any) -> Any:
    """TOML has no null (a field without a value is left out), and a table's default is each of
    its fields' own: neither ``"default": null`` nor a table's default says anything."""
    if isinstance(node, dict):
        return {
            k: _drop_null_defaults(v)
            for k, v in node.items()
            if not (k == "default" and (v is None or isinstance(v, dict)))
        }
    if isinstance(node, list):
        return [_drop_null_defaults(v) for v in node]
    return node


def first_error(exc: ValidationError) -> tuple[str, str]:
    """The first of pydantic's errors as the spec's one line: (the key, ``"<key>: <what is wrong
    and how to fix it>"``)."""
    error = exc.errors(include_url=False)[0]
    loc = [p for p in error["loc"][1:] if isinstance(p, str)]  # [0]: the task's tag; ints: list items
    if len(loc) >= 3 and loc[0] == "space" and loc[2] in ("<range>", "<values>"):
        del loc[2]  # the tag of a range or a list of values
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, _At):
        where = loc
        loc = [*loc, *cause.key]
        message = cause.message
        if cause.known:
            section = f"[{'.'.join(where)}]" if where else "the top level"
            message += f"keys of {section}: {', '.join(cause.known)}"
    else:
        message = _problem(error, tuple(loc))
    if error["type"].startswith("union_tag"):
        loc = ["task"]
    key = ".".join(toml_key(k) for k in loc)
    return key, " ".join(f"{key}: {message}".split()) if key else message


_MISSING = {
    "low": "a range needs low and high (or give values = [...] instead)",
    "high": "a range needs low and high (or give values = [...] instead)",
    "space": "add at least one [space.<field>] table, e.g. [space.lambda_p]",
}


def _problem(error: ErrorDetails, loc: tuple[str, ...]) -> str:
    """What pydantic's ``error`` at ``loc`` means, said as the spec's author would fix it."""
    kind, value, ctx = error["type"], error["input"], error.get("ctx") or {}
    if kind == "union_tag_not_found":
        return f'missing; set task = "parity" at the top (tasks: {", ".join(CONFIGS)})'
    if kind == "union_tag_invalid":
        return f"must be one of {', '.join(CONFIGS)}, got {ctx['tag']!r}"
    what = loc[-1] if loc else ""
    if loc[:1] == ("space",) and len(loc) >= 2:  # name the field: "max_steps low must be ..."
        what = f"{loc[1]} {loc[2]}" if len(loc) >= 3 and loc[2] in ("low", "high") else loc[1]
    if kind.startswith("int_"):
        return _not_an_int(value, what)
    if kind.startswith("float_"):
        return _not_a_number(value, what)
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", ctx["expected"])
        if choices == ["max", "min"]:
            return f'must be "max" or "min", got {value!r}'
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{what} must be one of {', '.join(choices)}, got {value!r}{hint}"
    if kind in ("greater_than_equal", "greater_than", "less_than"):
        bound = {"ge": ">= {}", "gt": "above {}", "lt": "below {}"}
        (op, limit), *_ = ((bound[k], v) for k, v in ctx.items() if k in bound)
        model = _TABLE_MODELS.get(loc[0]) if len(loc) == 2 else None
        info = model.model_fields.get(loc[-1]) if model else None
        why = f" ({info.description})" if info and info.description else ""
        return f"{what} must be {op.format(f'{limit:g}')}, got {value!r}{why}"
    problems = {
        "finite_number": f"{what} must be a finite number, got {value!r}",
        "string_type": f"{what} must be a {'one-line ' * (what == 'description')}string, got {show(value)}",
        "string_pattern_mismatch": f"{what} must be one line, got {value!r}",
        "bool_type": f"must be true or false, got {value!r}",
        "list_type": f"{what} must be a list, got {show(value)}",
        "too_short": f"must be a non-empty list of {what} values, got {value!r}",
        "model_type": f"must be a table ([{'.'.join(loc)}] on a line of its own), got {show(value)}",
        "missing": f"missing; {_MISSING.get(loc[-1], 'add it')}",
    }
    return problems.get(kind, f"{error['msg']}, got {show(value)}")


def _not_an_int(value: Any, what: str) -> str:
    if isinstance(value, float) and value.is_integer():
        return f"{what} must be an integer, got {value!r}; write {int(value)}"
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
        return f"{what} must be an integer, got the string {value!r}; remove the quotes"
    return f"{what} must be an integer, got {show(value)}"


def _not_a_number(value: Any, what: str) -> str:
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            pass
        else:
            return f"{what} must be a number, got the string {value!r}; remove the quotes"
    return f"{what} must be a number, got {show(value)}"


def show(value: Any) -> str:
    """A value and its TOML type, for messages."""
    kinds = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array"}
    kind = kinds.get(type(value), "a table" if isinstance(value, dict) else type(value).__name__)
    return f"{value!r} ({kind})"


def _closest(key: str, known: list[str]) -> str | None:
    """The known key ``key`` most likely misspells: the one containing it (``grace`` for
    ``grace_period``) or contained in it (``gpus``), else the closest by difflib."""
    within = [k for k in known if len(key) >= 3 and (key in k or k in key)]
    if len(within) == 1:
        return within[0]
    close = difflib.get_close_matches(key, known, n=1)
    return close[0] if close else None


def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)
