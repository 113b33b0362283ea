"""``ponder-study``: the command line, one `Command` a verb.

- `study.cli.launch`: the entry point (``ponder-study``, ``python -m study``), which handles
  signals before anything heavy is imported;
- `study.cli.verbs`: the verbs listed once (`COMMANDS`), `build_parser`, `main` and `entry`;
- `study.cli.base`: what every verb is made of (`Command`, the parser, exit codes);
- `study.cli.drive` (``run``, ``resume``), `study.cli.read` (``status``, ``report``,
  ``evaluate``, ``list``, ``export``), `study.cli.specs` (``check``, ``schema``, ``slurm``),
  `study.cli.jobs` (``submit``).

`study.cli.verbs`' names are re-exported here, on first use: importing `study.cli.launch`
imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from study.cli.verbs import COMMANDS, Command, build_parser, entry, main, resume_command, summary

__all__ = ["COMMANDS", "Command", "build_parser", "entry", "main", "resume_command", "summary"]


def __getattr__(name: str) -> Any:
    """`study.cli.verbs`' names, imported (the whole CLI) when first asked for."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from study.cli import verbs

    return getattr(verbs, name)
