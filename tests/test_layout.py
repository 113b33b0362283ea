"""The shape of the code a reader takes in: study/ in a few folders, no module over 600 lines, no
function over 80 (counted from its ``def`` to its last line), in ponder/ and study/.

study/'s top holds its ``__init__.py`` and ``__main__.py`` and a folder a layer (storage, spec,
records, search, launchers, run, reports, api, cli); ``py.typed``, PEP 561's marker, is no code."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ponder", "study")
MAX_STUDY_ENTRIES = 11
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def test_study_has_few_entries_at_its_top() -> None:
    entries = sorted(p.name for p in (REPO / "study").iterdir() if p.name not in ("__pycache__", "py.typed"))
    assert len(entries) <= MAX_STUDY_ENTRIES, entries


def test_every_folder_of_study_is_a_package_that_says_what_lives_there() -> None:
    for folder in sorted(p for p in (REPO / "study").iterdir() if p.is_dir() and p.name != "__pycache__"):
        init = folder / "__init__.py"
        assert init.is_file(), f"study/{folder.name} has no __init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"study/{folder.name}/__init__.py has no docstring"


def test_no_module_is_over_600_lines() -> None:
    lines = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in _modules()}
    long = {module: n for module, n in lines.items() if n > MAX_MODULE_LINES}
    assert not long, f"split these modules (lines): {long}"


def test_no_function_is_over_80_lines() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = lines
    assert not long, f"split these functions (lines): {long}"
