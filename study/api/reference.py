"""Every public name of ``import study`` as the Markdown reference of docs/api.md, generated from
the code: each function's signature and docstring, each class's fields (with their docstrings),
methods and properties, each exception's base and meaning. ``make generate`` writes it into the
page; a test fails when the page and the code differ.

Read from the modules' source (`ast`), never imported: rendering the reference of `Evaluation`
or `StudySpec` imports neither torch nor pydantic's models. No Ray, no torch.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

__all__ = ["HOMES", "api_reference"]

HOMES: dict[str, str] = {
    "run": "study.api.driving",
    "resume": "study.api.driving",
    "load": "study.api.reading",
    "list_studies": "study.api.reading",
    "list_specs": "study.api.reading",
    "check": "study.api.specs",
    "Study": "study.api.reading",
    "Freshness": "study.api.reading",
    "Check": "study.spec.check",
    "Evaluation": "study.reports.evaluate",
    "Importances": "study.reports.importance",
    "Report": "study.reports.report",
    "StudySpec": "study.spec.spec",
    "SpecError": "study.spec.errors",
    "StorageError": "study.storage.filesystems",
    "StudyError": "study.records.records",
    "LeaseHeld": "study.run.lease",
    "WarmStartError": "study.search.warmstart",
    "ReportError": "study.reports.report",
    "EvaluateError": "study.reports.trial_choice",
    "StudyInterrupted": "study.api.driving",
    "StudyWarning": "study.api.driving",
}
"""Every name of `study.__all__` but ``MOVED`` -> the module that defines it, in the page's
order (the functions, the classes they return, the exceptions): where ``study.__getattr__``
imports each from when first asked for."""


def api_reference() -> str:
    """The reference: the functions, then the classes, then a table of the exceptions."""
    out: list[str] = []
    errors: list[tuple[str, str, str]] = []
    for name, module in HOMES.items():
        node = _definition(module, name)
        if isinstance(node, ast.ClassDef) and _is_exception(node):
            base = ast.unparse(node.bases[0])
            errors.append((name, base, _first_sentence(ast.get_docstring(node) or "")))
        elif isinstance(node, ast.ClassDef):
            out += _class(name, node)
        else:
            out += [f"### `study.{name}{_signature(node)}`", "", _doc(node), ""]
    out += ["### Exceptions", "", "| exception | a kind of | raised when |", "| --- | --- | --- |"]
    out += [f"| `study.{name}` | `{base}` | {text} |" for name, base, text in errors]
    return "\n".join(out)


def _source(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return ast.parse(Path(spec.origin).read_text())


def _definition(module: str, name: str) -> ast.FunctionDef | ast.ClassDef:
    for node in _source(module).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"{module} defines no {name}")


def _is_exception(node: ast.ClassDef) -> bool:
    return any(ast.unparse(b).endswith(("Error", "Interrupt", "Warning", "Held")) for b in node.bases)


def _doc(node: ast.FunctionDef | ast.ClassDef) -> str:
    return " ".join(inspect.cleandoc(ast.get_docstring(node) or "").split("\n")).replace("  ", " ")


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    return flat.split("; ")[0].split(": the message")[0].rstrip(".")


def _signature(node: ast.FunctionDef, skip_self: bool = False) -> str:
    """``(spec, *, name=None, ...) -> Study``, as the code declares it."""
    args = node.args
    params: list[str] = []
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for arg, default in zip(positional, defaults, strict=True):
        if skip_self and arg.arg == "self":
            continue
        params.append(_param(arg, default))
    if args.vararg is not None:
        params.append(f"*{_param(args.vararg, None)}")
    elif args.kwonlyargs:
        params.append("*")
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(_param(arg, default))
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"({', '.join(params)}){returns}"


def _param(arg: ast.arg, default: ast.expr | None) -> str:
    text = arg.arg + (f": {ast.unparse(arg.annotation)}" if arg.annotation is not None else "")
    return text + (f" = {ast.unparse(default)}" if default is not None else "")


def _class(name: str, node: ast.ClassDef) -> list[str]:
    """A class: its docstring, its fields (a table), its properties and methods."""
    lines = [f"### `study.{name}`", "", _doc(node), ""]
    fields = _fields(node)
    if fields:
        lines += ["| field | type | meaning |", "| --- | --- | --- |"]
        lines += [f"| `{f}` | `{t.replace('|', chr(92) + '|')}` | {d} |" for f, t, d in fields]
    for member in node.body:
        if not isinstance(member, ast.FunctionDef) or member.name.startswith("_"):
            continue
        if any(ast.unparse(d) == "property" for d in member.decorator_list):
            returns = ast.unparse(member.returns) if member.returns is not None else ""
            if lines[-1] and not lines[-1].startswith("- "):
                lines.append("")
            lines += [f"- `.{member.name}: {returns}`: {_doc(member)}"]
            continue
        lines += ["", f"#### `{name}.{member.name}{_signature(member, skip_self=True)}`", "", _doc(member)]
    return [*lines, ""]


def _fields(node: ast.ClassDef) -> list[tuple[str, str, str]]:
    """(name, type, its docstring) for each annotated field of a class body; the docstring is
    the string right under the field, as this project writes them."""
    found: list[tuple[str, str, str]] = []
    body = node.body
    for i, statement in enumerate(body):
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            continue
        if statement.target.id.startswith("_"):
            continue
        after = body[i + 1] if i + 1 < len(body) else None
        doc = ""
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            doc = " ".join(str(after.value.value).split())
        found.append((statement.target.id, ast.unparse(statement.annotation), doc.replace("|", "\\|")))
    return found
