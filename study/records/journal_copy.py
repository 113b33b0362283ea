"""The Optuna journal's copy in the study directory of a study on an object store.

Optuna's journal needs a file lock, which object stores lack, so the driver keeps it on its own
disk (`study.storage.storage.journal_cache`) and copies it to ``studies/<name>/optuna.journal`` for a
resume from another machine. A whole copy at every trial end would cost more per trial as the
study grows (``bench/driver_scale.py --s3``: 132 ms at 100 trials, 276 ms at 500). The journal
only grows, so a trial end uploads only the lines written since the last upload, as one part
named by its byte offset::

    studies/<name>/optuna.journal                      the whole journal when a driver last ended
    studies/<name>/optuna.journal.parts/<offset>       the lines from byte <offset> on, as they came

A reader (`read_copy`) takes the base and every part that continues it; `fold` writes the whole
journal as the base and removes the parts, once per driver, when its run ends. A driver killed
before that leaves parts, which the next one reads back (`pull`) from wherever it runs; a study
downloaded whole from the bucket carries them too, and `pull` folds them into its journal.
Needs neither Ray nor torch.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow.fs as pafs

from study.storage.storage import StudyPaths, read_bytes, resolve, write_bytes

__all__ = ["exists", "fold", "parts_dir", "pull", "push", "push_journal", "read_copy"]

log = logging.getLogger("ponder-study")

_OFFSET_DIGITS = 16
_pushed: dict[str, int] = {}
"""Per copy: how many bytes of the local journal its base and parts hold (this process's view)."""


def parts_dir(copy: str) -> str:
    """Where the parts of the copy at ``copy`` are."""
    return f"{copy}.parts"


def _parts(copy: str) -> list[tuple[int, str, int]]:
    """(offset, path in its filesystem, size) of each part, by offset."""
    fs, directory = resolve(parts_dir(copy))
    infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    found = [
        (int(i.base_name), i.path, i.size or 0)
        for i in infos
        if i.type == pafs.FileType.File and i.base_name.isdigit()
    ]
    return sorted(found)


def read_copy(copy: str) -> bytes | None:
    """The journal the copy at ``copy`` holds: its base, then each part that continues it (a part
    the base already holds, written before a fold, is skipped; one after a gap is not taken).
    None when there is neither."""
    base = read_bytes(copy)
    parts = _parts(copy)
    if base is None and not parts:
        return None
    data = bytearray(base or b"")
    fs, _ = resolve(copy)
    for offset, path, size in parts:
        if offset + size <= len(data):
            continue
        if offset > len(data):
            break
        with fs.open_input_stream(path) as f:
            data += f.readall()[len(data) - offset :]
    return bytes(data)


def exists(copy: str) -> bool:
    """Whether there is a copy at ``copy`` (its base or a part), from listings alone."""
    fs, path = resolve(copy)
    return fs.get_file_info(path).type == pafs.FileType.File or bool(_parts(copy))


def _copied(copy: str) -> int:
    """How many bytes the copy holds, from the listing alone (no part is read)."""
    fs, path = resolve(copy)
    info = fs.get_file_info(path)
    length = (info.size or 0) if info.type == pafs.FileType.File else 0
    for offset, _, size in _parts(copy):
        if offset > length:
            break
        length = max(length, offset + size)
    return length


def push(paths: StudyPaths) -> None:
    """Upload the journal's lines written since the last upload as one part (nothing for a study
    on a local disk, whose journal is the file in its study directory)."""
    copy = paths.optuna_journal_copy
    local = Path(paths.optuna_journal)
    if copy is None or not local.exists():
        return
    pushed = _pushed.get(copy)
    if pushed is None:
        pushed = _pushed[copy] = _copied(copy)
    if local.stat().st_size < pushed:  # the local journal was cut back (a torn tail): start over
        fold(paths)
        return
    with local.open("rb") as f:
        f.seek(pushed)
        new = f.read()
    new = new[: new.rfind(b"\n") + 1]  # whole lines: Optuna may be writing the next one
    if not new:
        return
    write_bytes(f"{parts_dir(copy)}/{pushed:0{_OFFSET_DIGITS}d}", new)
    _pushed[copy] = pushed + len(new)


def fold(paths: StudyPaths) -> None:
    """Write the whole local journal as the copy's base, then remove the parts it holds."""
    copy = paths.optuna_journal_copy
    local = Path(paths.optuna_journal)
    if copy is None or not local.exists():
        return
    data = local.read_bytes()
    write_bytes(copy, data)
    _pushed[copy] = len(data)
    _remove_parts(copy)


def _remove_parts(copy: str) -> None:
    fs, _ = resolve(copy)
    for _, path, _ in _parts(copy):
        fs.delete_file(path)


def pull(paths: StudyPaths) -> None:
    """Before a run: take the copy's journal if it holds more than the local one (the journal only
    grows, so the longer is the newer). A study on a local disk downloaded from an object store
    may carry parts beside its journal: they are folded into it."""
    copy = paths.optuna_journal_copy or paths.optuna_journal
    _pushed.pop(copy, None)  # another driver may have copied since: the next push lists again
    local = Path(paths.optuna_journal)
    remote = read_copy(copy)
    if remote is not None and (not local.exists() or local.stat().st_size < len(remote)):
        write_bytes(paths.optuna_journal, remote)  # atomically: locally, it is the study's journal
    if paths.optuna_journal_copy is None:
        _remove_parts(copy)


def push_journal(paths: StudyPaths, whole: bool = False) -> None:
    """Upload the Optuna journal's new lines to a remote study's directory (`push`), or with
    ``whole`` the whole journal, its parts removed (a run's end: `fold`), so that a resume from
    another machine (or a new head node) finds the search history. A failure is logged, not
    raised: the next trial's end, or the next run's, copies it again."""
    try:
        if whole:
            fold(paths)
        else:
            push(paths)
    except OSError:  # the next trial's end, or the study's, copies it again
        log.error(
            "could not copy the Optuna journal to %s; the next trial's end, or the next run's, tries again",
            paths.optuna_journal_copy,
        )
