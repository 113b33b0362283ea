"""Every key a spec may hold, as Markdown tables generated from the spec's models: its type, its
default and what it means, so that the reference in docs/specs.md is the code's, never a copy.

`spec_reference` renders the tables (``make generate`` writes them into the docs; a test fails
when the docs and the models differ). The tables' rows come from `study.spec.models`: the
sections' models (``[search]``, ``[scheduler]``, ...) and each task's ``[config]`` fields (the
config dataclasses of `ponder.config`, with their field docstrings). No Ray, no torch.
"""

from __future__ import annotations

import re
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ponder.config import CONFIGS
from study.spec.models import SAMPLER_NEEDS, Range, Values, spec_model

__all__ = ["config_rows", "section_rows", "spec_reference"]

SECTIONS = ("search", "scheduler", "resources", "run")
"""The spec's tables whose keys are the same for every task, in the order a spec lists them."""

UNSET = "unset"
"""The default column of a key without a value of its own: its meaning says what stands in."""


def spec_reference() -> str:
    """The two tables: every key of a spec but ``[config]``'s, then every ``[config]`` field by task."""
    return "\n".join(
        [
            _table(("key", "type", "default", "meaning"), section_rows()),
            "",
            "`[config]` and `[space.<field>]` take the task's config fields (the same names as "
            "`ponder-train`'s flags and the Parquet's columns); a field not set keeps its task's default:",
            "",
            _table(
                ("field", "type", *(f"{task} default" for task in CONFIGS), "search", "meaning"),
                config_rows(),
            ),
        ]
    )


def section_rows() -> list[tuple[str, ...]]:
    """(key, type, default, meaning) for the top-level keys, ``[space.<field>]``, ``[objectives]``
    and every key of ``[search]``, ``[scheduler]``, ``[resources]`` and ``[run]``."""
    model = spec_model(next(iter(CONFIGS)))
    fields = model.model_fields
    rows: list[tuple[str, ...]] = [_row(f"`{name}`", fields[name]) for name in ("description", "task")]
    rows[1] = (
        rows[1][0],
        " \\| ".join(f'`"{task}"`' for task in CONFIGS),
        "required",
        "the task the study trains",
    )
    rows.append(
        (
            "`[space.<field>]`",
            "table",
            "required",
            "a searched field of the task's config: a range (`low`, `high`, `log`) or a list of "
            "`values`; a spec searches at least one (the fields' table below says which can be "
            "searched, and how)",
        )
    )
    for dim, name in ((Range, "low"), (Range, "high"), (Range, "log"), (Values, "values")):
        kind = {
            "low": "the field's type",
            "high": "the field's type",
            "values": "list of the field's type",
        }.get(name)
        rows.append(_row(f"`[space.<field>] {name}`", dim.model_fields[name], kind=kind))
    rows.append(
        (
            '`[objectives] "<metric>"`',
            '`"max"` \\| `"min"`',
            UNSET,
            _meaning(fields["objectives"].description or ""),
        )
    )
    for section in SECTIONS:
        table: type[BaseModel] = fields[section].annotation  # type: ignore[assignment]
        rows += [_row(f"`[{section}] {name}`", info) for name, info in table.model_fields.items()]
    by_package: dict[str, list[str]] = {}
    for sampler, package in SAMPLER_NEEDS.items():
        by_package.setdefault(package, []).append(sampler)
    needs = ", ".join(
        f"{' and '.join(samplers)} need{'s' * (len(samplers) == 1)} {package}"
        for package, samplers in by_package.items()
    )
    at = next(i for i, row in enumerate(rows) if row[0] == "`[search] sampler`")
    rows[at] = (*rows[at][:3], f"{rows[at][3]}; {needs} (`pip install` it: not installed with the project)")
    return rows


def config_rows() -> list[tuple[str, ...]]:
    """(field, type, each task's default, how it may be searched, meaning) for the union of the
    tasks' ``[config]`` fields, in the order the tasks declare them."""
    configs = {task: _table_model(task, "config") for task in CONFIGS}
    spaces = {task: _table_model(task, "space") for task in CONFIGS}
    names = list(dict.fromkeys(name for model in configs.values() for name in model.model_fields))
    rows: list[tuple[str, ...]] = []
    for name in names:
        infos = {task: model.model_fields.get(name) for task, model in configs.items()}
        first = next(info for info in infos.values() if info is not None)
        defaults = tuple(_default(info) if info else "-" for info in infos.values())
        docs = list(dict.fromkeys(info.description or "" for info in infos.values() if info))
        if len(docs) > 1:  # the field means something else in each task: say which is whose
            docs = [f"{task}: {info.description or ''}" for task, info in infos.items() if info]
        space = next(spaces[task] for task, info in infos.items() if info)
        rows.append((f"`{name}`", _type(first.annotation), *defaults, _search(name, space), _meaning(*docs)))
    return rows


def _table_model(task: str, table: str) -> Any:
    """The model of one table (``config``, ``space``) of a task's spec."""
    return spec_model(task).model_fields[table].annotation


def _search(name: str, space: Any) -> str:
    """How ``[space.<name>]`` may search the field (``space``: a task's ``[space]`` model)."""
    if name in space._unsearchable:
        return "no"
    return "values" if name in space._strings else "range or values"


def _row(key: str, info: FieldInfo, kind: str | None = None) -> tuple[str, str, str, str]:
    return (
        key,
        kind or _type(info.annotation),
        _default(info),
        _meaning(info.description or "", "" if _said(info.description or "") else _bounds(info)),
    )


def _said(description: str) -> bool:
    """Whether a key's description gives its bounds already, as an interval (``in [0, 2**32)``)."""
    return re.search(r"\bin [\[(][^\])]*[\])]", description) is not None


_BOUNDS = {"Gt": ("gt", "above"), "Ge": ("ge", "at least"), "Lt": ("lt", "below"), "Le": ("le", "at most")}
"""pydantic's bounds (``Field(gt=1)``: annotated-types' ``Gt(gt=1)`` in the field's metadata) in words."""


def _bounds(info: FieldInfo) -> str:
    """The bounds the model enforces on a key's value, in words (``above 1``), or ''."""
    said = []
    for bound in info.metadata:
        kind = _BOUNDS.get(type(bound).__name__)
        if kind is not None:
            said.append(f"{kind[1]} {_toml(getattr(bound, kind[0]))}")
    return ", ".join(said)


def _type(annotation: Any) -> str:
    """A field's TOML type, said as a reader writes it."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f'`"{value}"`' for value in get_args(annotation))
    if origin is list:
        return f"list of {_type(get_args(annotation)[0])}s"
    if origin in (Union, types.UnionType):
        return " or ".join(_type(a) for a in get_args(annotation) if a is not type(None))
    names = {bool: "bool", int: "int", float: "float", str: "string"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default(info: FieldInfo) -> str:
    value = info.default
    if value is PydanticUndefined:
        return "required"
    if value is None or value == {}:
        return UNSET
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    return f"`{_toml(value)}`"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e6:
        return f"{value:.1f}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _meaning(*docs: str) -> str:
    """Docstrings as one Markdown table cell: reST's double backquotes as code spans, a word with
    ``<...>`` (``<set>/<metric>``: HTML to Markdown) in one, ``|`` and ``*`` escaped outside them."""
    text = re.sub(r"``([^`]+)``", r"`\1`", " ".join("; ".join(d for d in docs if d).split()))
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):  # the parts outside code spans
        words = re.sub(r"(?<![\w`])([^\s`]*<[^\s`]*>[^\s`,;:)]*)", r"`\1`", parts[i])
        parts[i] = re.sub(r"([*])", r"\\\1", words)
    return "".join(parts).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
