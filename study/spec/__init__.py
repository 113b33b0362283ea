"""The study spec: one TOML file per named study, checked in full before Ray starts.

- `study.spec.spec`: `StudySpec`, `load_spec`, `parse_spec`, `SpecError`;
- `study.spec.errors`: `SpecError`, one line naming the key and the fix;
- `study.spec.space`: a searched field (`Dimension`), and every corner of the space built as a config;
- `study.spec.rules`: the checks across keys that the models cannot express;
- `study.spec.shipped`: the shipped specs (``specs/*.toml``, `SPECS_DIR`, `list_specs`) and their
  former names (`SPEC_ALIASES`);
- `study.spec.reference`: every spec key as the Markdown table of docs/specs.md;
- `study.spec.models`: the document's typed models (pydantic) and its JSON Schema;
- `study.spec.toml`: a parsed spec written back as TOML text (overrides kept in its source);
- `study.spec.check`: ``ponder-study check``, what running a spec would cost (not imported here:
  its estimate trains a few steps with torch).

`study.spec.spec`'s names (its ``__all__``) are re-exported here, on first use (a study pickled
before the folders names ``study.spec.StudySpec``: `study.storage.lazy`); importing a module of
this folder imports only those it needs. No Ray, no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from study.storage.lazy import public_names

if TYPE_CHECKING:  # its names, typed, for mypy and editors
    from study.spec.spec import *  # noqa: F403

__getattr__ = public_names(__name__, "study.spec.spec")
