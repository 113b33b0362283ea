"""A parsed spec document written back as TOML text: how ``with_overrides`` puts the overrides
into the spec's saved source (a resumed study reads that source), and what benches use to write
specs of their own.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from typing import Any

from study.spec.models import toml_key

__all__ = ["rewritten_source", "to_toml", "toml_value"]


def rewritten_source(source: str, doc: Mapping[str, Any], note: str) -> str:
    """The spec source of the document ``doc`` (``source``'s, edited): ``source``'s header comment
    kept, ``note`` added to it as a comment line."""
    header = list(itertools.takewhile(lambda line: line.startswith("#"), source.splitlines()))
    return "\n".join([*header, f"# {note}", to_toml(doc)])


def to_toml(doc: Mapping[str, Any], prefix: str = "") -> str:
    """TOML text for a parsed spec document (``tomllib.loads(spec.source)``, edited): scalars
    first, then each table under its header."""
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, value in doc.items():
        if isinstance(value, dict):
            header = f"{prefix}{toml_key(key)}"
            body = to_toml(value, header + ".")
            if any(not isinstance(v, dict) for v in value.values()) or not value:
                out += f"\n[{header}]\n"
            out += body
    return out


def toml_value(value: Any) -> str:
    """One TOML value: a bool, number, string or list of them (`TypeError` for anything else)."""
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
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")
