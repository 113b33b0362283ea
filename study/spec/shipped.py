"""The specs shipped with the package: where they live, their names, and the names they had.

`study.spec.spec.load_spec` loads one by name; these need neither pydantic nor the spec's models.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SPECS_DIR", "SPEC_ALIASES", "list_specs"]

SPECS_DIR = Path(__file__).parent / "specs"
"""Where the shipped specs live, one ``<name>.toml`` each, beside ``spec.schema.json``."""

SPEC_ALIASES = {
    "ponder-difficulty-seeds": "ponder-difficulty-reference",
    "ponder-extrapolation-seeds": "ponder-extrapolation",
}
"""A shipped spec's former name -> its name now. "seeds" said both the reference implementations'
formulation and random seeds; the old names still load, and a study run by one is named by it,
so its later commands (``status``, ``resume``) find it as before."""


def list_specs() -> list[str]:
    """Names of the shipped specs, sorted."""
    return sorted(p.stem for p in SPECS_DIR.glob("*.toml"))
