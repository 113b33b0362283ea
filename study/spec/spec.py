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
- checks across keys that a schema cannot express (`study.spec.rules`): every corner of the search
  space is built as a config (the config's own validation speaks: `study.spec.space`), metrics the
  task reports at every point of the space, the grid sampler's rules, ASHA's grace period against
  the budget, a fused study's data streams.

Either way a bad spec is a `SpecError` (`study.spec.errors`) whose one-line message starts with the key
(``space.lambda_p.high: lambda_p must be in (0, 1], got 1.5``) and says how to fix it.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ponder.config import CONFIGS, ConfigError, TaskConfig
from study.spec.errors import SpecError, config_error_field, fail
from study.spec.models import (
    SAMPLERS,
    ResourcesSpec,
    RunSpec,
    SchedulerSpec,
    SearchSpec,
    document,
    first_error,
    json_schema,
    schema_text,
)
from study.spec.rules import checked, field_default
from study.spec.shipped import SPEC_ALIASES, SPECS_DIR, list_specs
from study.spec.space import Dimension
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
            fail(f"params.{unknown[0]}", f"not a searched field of this study; searched: {', '.join(dims)}")
        missing = [name for name in dims if name not in params]
        if missing:
            fail(f"params.{missing[0]}", f"missing; a trial needs a value for each of {', '.join(dims)}")
        values = {name: d.coerce(params[name]) for name, d in dims.items()}
        try:
            return CONFIGS[self.task](**self.config, **values)
        except ConfigError as exc:
            field_name = config_error_field(exc)
            key = f"params.{field_name}" if field_name in dims else f"config.{field_name}"
            fail(key, str(exc))

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
        value = self.config.get("iterations", field_default(self.task, "iterations"))
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
        value = self.config.get("max_steps", field_default(self.task, "max_steps"))
        assert isinstance(value, int)
        return value

    @property
    def eval_interval(self) -> int:
        """Training iterations between a trial's reports: ``[config] eval_interval`` or the default."""
        value = self.config.get("eval_interval", field_default(self.task, "eval_interval"))
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
        fail("spec", f"{what}; {hint}shipped specs: {', '.join(shipped)} (or give the path of a .toml file)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail("spec", f"cannot read {str(path)!r}: {exc}")
    return parse_spec(text, path.stem if is_path else name_or_path, origin=str(path))


def parse_spec(text: str, name: str, *, origin: str | None = None) -> StudySpec:
    """Parse and check a spec's TOML text; ``name`` is the study's name, ``origin`` the file (for
    syntax errors). Raises `SpecError` at the first problem."""
    check_name(name, "name")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        fail("", f"{origin or f'spec {name!r}'}: not valid TOML: {exc}")
    try:
        doc = document().validate_python(raw)
    except ValidationError as exc:
        key, line = first_error(exc)
        raise SpecError(line, key) from None
    checks = checked(doc, raw)
    return StudySpec(
        name=name,
        task=doc.task,
        description=doc.description,
        config=checks.config,
        space=checks.space,
        search=checks.search,
        scheduler=checks.scheduler,
        resources=doc.resources,
        run=doc.run,
        source=text,
        pareto_objectives=checks.pareto_objectives,
    )


def check_name(name: Any, key: str) -> None:
    """Refuse a study name that cannot name a folder and a Parquet partition (`SpecError`)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        fail(
            key,
            f"study name {name!r} must start with an ASCII letter or digit and hold only ASCII letters "
            "(A-Z, a-z), digits, '.', '_' and '-' (it names a directory and a Parquet partition); "
            "give another --name or rename the spec file",
        )
    if not any(c.isalpha() for c in name):
        fail(
            key,
            f"study name {name!r} must hold a letter: readers infer the study=<name> partition's type "
            "(pandas reads study=007 as the number 7, DuckDB and polars may read 2024-01-01 as a date); "
            f"give another --name, say 'study-{name}'",
        )
    if len(name) > MAX_NAME_LENGTH:
        fail(
            key,
            f"study name is {len(name)} characters long, at most {MAX_NAME_LENGTH} fit (it becomes the "
            "folder name study=<name>, and a file name holds 255 bytes); give a shorter --name",
        )
