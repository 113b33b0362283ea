"""The reference tables of the docs, generated from the code, and the command that writes them.

- `cli_reference`: every ``ponder-study`` verb, its arguments and flags (read from the parsers),
  where ``--storage`` comes from, and the exit codes (`study.cli.base.EXIT_CODES`);
- `study.spec.reference.spec_reference`: every spec key, its type, default and meaning;
- `study.api.reference.api_reference`: every name of ``import study`` (docs/api.md).

A docs page holds a table between two markers, ``<!-- generated: NAME -->`` and ``<!-- end of
generated: NAME -->``; `fill` puts the table the code gives there. ``make generate`` (``python -m
study.cli.reference``) rewrites every page under ``docs/`` and the shipped specs' JSON Schema
(``study/spec/specs/spec.schema.json``, ``ponder-study schema``'s output); ``--check`` only says
which differ, as the tests do. No Ray, no torch.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from study.api.reference import api_reference
from study.cli.base import EXIT_CODES, STORAGE_ENV, WordsCommand
from study.spec.models import schema_text
from study.spec.reference import spec_reference
from study.spec.spec import SPECS_DIR
from study.storage.commands import PROG

__all__ = ["BLOCKS", "REGENERATE", "cli_reference", "fill", "main", "verb_rows"]

REGENERATE = "make generate"
"""The one command that writes every generated table into the docs."""

MARK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end of generated: \2 -->)", re.S)


def verb_rows() -> list[tuple[str, str, str, str]]:
    """(verb, its arguments, what it does, where its ``--storage`` defaults to) for every verb, in
    the order ``--help`` lists them."""
    from study.cli.verbs import COMMANDS, build_parser
    from study.launchers.slurm import build_parser as slurm_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    rows = []
    for command in COMMANDS:
        parser = slurm_parser() if isinstance(command, WordsCommand) else sub.choices[command.name]
        actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
        usage = " ".join(_usage(a) for a in actions)
        storage = next((_default_of(a.help or "") for a in actions if "--storage" in a.option_strings), "-")
        rows.append((f"`{command.name}`", f"`{usage}`" if usage else "", _cell(command.help), storage))
    return rows


def _usage(action: argparse.Action) -> str:
    """One argument as a usage line writes it: ``SPEC``, ``[--quiet]``, ``[--top K]``, ``run|resume``."""
    if not action.option_strings:
        if action.nargs == argparse.REMAINDER:
            return "ARGS..."
        return "\\|".join(action.choices) if action.choices else _metavar(action)
    flag = action.option_strings[-1]
    shown = flag if action.nargs == 0 else f"{flag} {_metavar(action)}"
    return shown if action.required else f"[{shown}]"


def _metavar(action: argparse.Action) -> str:
    metavar = action.metavar if isinstance(action.metavar, str) else None
    return metavar or action.dest.upper()


def _default_of(help_text: str) -> str:
    """The ``default: ...`` an option's help ends with, in a table cell."""
    found = re.search(r"\(default: (.*)\)\s*$", " ".join(help_text.split()))
    if not found:
        return "-"
    fallback = re.sub(r"\s*\([^)]*\)", "", found.group(1))  # "results (the spec is not read)"
    return re.sub(r"(\$\w+|\[run\] storage|results\b)", r"`\1`", fallback)


def _cell(text: str) -> str:
    """Text in a Markdown table's cell: a ``|``, even inside a code span, would end the cell."""
    return text.replace("|", "\\|")


def cli_reference() -> str:
    """The verbs' table, the order ``--storage`` is resolved in, and the exit codes' table."""
    rows = verb_rows()
    lines = [
        "| verb | arguments | what it does | `--storage` default |",
        "| --- | --- | --- | --- |",
        *(f"| {' | '.join(row)} |" for row in rows),
        "",
        f"Where a study lives: `--storage` where it is given, else `${STORAGE_ENV}`, else the last column's "
        f"fallback. `{PROG} VERB --help` says what each flag does.",
        "",
        "| exit code | meaning |",
        "| --- | --- |",
        *(f"| {code} | {_cell(meaning)} |" for code, meaning in EXIT_CODES.items()),
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {
    "spec-keys": spec_reference,
    "cli": cli_reference,
    "api": api_reference,
}
"""Each generated table by the name its markers give."""


def fill(text: str) -> str:
    """``text`` with every generated block holding what the code gives now. An unknown block's
    name is an error (a marker misspelt would otherwise keep a stale table)."""

    def block(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in BLOCKS:
            raise KeyError(f"no generated table named {name!r}; known: {', '.join(BLOCKS)}")
        return f"{match.group(1)}{BLOCKS[name]()}\n{match.group(4)}"

    return MARK.sub(block, text)


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the generated tables of every page under ``docs/`` and the shipped JSON Schema (or
    only the pages given); with ``--check``, write nothing and exit 1 naming each file that
    differs from the code."""
    parser = argparse.ArgumentParser(prog="python -m study.cli.reference", description=main.__doc__)
    parser.add_argument("pages", nargs="*", type=Path, help="Markdown pages (default: docs/*.md)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    args = parser.parse_args(argv)
    wanted: dict[Path, Callable[[str], str]] = {page: fill for page in args.pages}
    if not args.pages:
        wanted = {page: fill for page in sorted(Path("docs").glob("*.md"))}
        wanted[SPECS_DIR / "spec.schema.json"] = lambda _: schema_text()
    stale = []
    for path, generate in wanted.items():
        text = path.read_text()
        new = generate(text)
        if new != text:
            stale.append(str(path))
            if not args.check:
                path.write_text(new)
    for path_name in stale:
        print(f"{path_name}: {'differs from the code' if args.check else 'rewritten'}", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
