"""The phrases ``ponder-study``'s messages share: a count with its noun, and the command lines to
paste (what continues a study, what rewrites its Parquet), which name ``--storage`` only when it
is not the default one."""

from __future__ import annotations

import shlex

from study.storage.commands import command_name

__all__ = ["DEFAULT_STORAGE", "STORAGE_ENV", "count", "export_command", "resume_command"]

DEFAULT_STORAGE = "results"
"""Where studies live when neither --storage nor $PONDER_STUDY_STORAGE says otherwise."""
STORAGE_ENV = "PONDER_STUDY_STORAGE"
"""The variable that names the storage when neither ``--storage`` nor ``storage=`` does."""


def count(n: int, noun: str) -> str:
    """``1 plot``, ``2 plots``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _storage_flag(storage: str) -> str:
    """`` --storage X`` for a storage other than the default, else nothing."""
    return "" if storage == DEFAULT_STORAGE else f" --storage {shlex.quote(storage)}"


def resume_command(name: str, storage: str) -> str:
    """The exact command that continues a study, quoted for a POSIX shell (`command_name`)."""
    return f"{command_name()} resume {shlex.quote(name)}{_storage_flag(storage)}"


def export_command(name: str, storage: str) -> str:
    """The exact command that rewrites a study's Parquet from its Tune experiment."""
    return f"{command_name()} export {shlex.quote(name)}{_storage_flag(storage)}"
