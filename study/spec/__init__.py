"""The study spec: one TOML file per named study, checked in full before Ray starts.

- `study.spec.spec`: `StudySpec`, `load_spec`, `parse_spec`, `SpecError`;
- `study.spec.shipped`: the shipped specs (``specs/*.toml``, `SPECS_DIR`, `list_specs`) and their
  former names (`SPEC_ALIASES`);
- `study.spec.reference`: every spec key as the Markdown table of docs/specs.md;
- `study.spec.models`: the document's typed models (pydantic) and its JSON Schema;
- `study.spec.toml`: a parsed spec written back as TOML text (overrides kept in its source);
- `study.spec.check`: ``ponder-study check``, what running a spec would cost (not imported here:
  its estimate trains a few steps with torch).

`study.spec.spec`'s names are re-exported here, on first use (a study pickled before the folders names
``study.spec.StudySpec``); importing a module of this folder imports no other. No Ray, no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from study.spec.spec import (
        NAME_PATTERN,
        SAMPLERS,
        SPEC_ALIASES,
        SPECS_DIR,
        Dimension,
        ResourcesSpec,
        RunSpec,
        SchedulerSpec,
        SearchSpec,
        SpecError,
        StudySpec,
        check_name,
        json_schema,
        list_specs,
        load_spec,
        parse_spec,
        schema_text,
        to_toml,
    )

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


def __getattr__(name: str) -> Any:
    """`study.spec.spec`'s names, imported when first asked for."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from study.spec import spec

    return getattr(spec, name)
