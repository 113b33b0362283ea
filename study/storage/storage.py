"""A study's storage: its ``trials`` and ``history`` tables read whole, its table folders replaced
whole, a trial's reports saved before its end is recorded, the studies under a root listed.

Every file here is replaced atomically (`study.storage.files`): a reader sees the old version or
the new one. A study's ``trials`` and ``history`` folders are compacted whole (`replaced_folder`):
on a local disk a reader sees the old files or the new ones, never a trial in both.

Where a study's files lie is `study.storage.paths`; storage roots, URIs and their filesystems are
`study.storage.filesystems`; whole-file reads and writes are `study.storage.files`. Their names
are re-exported here, where the rest of the project imports them from.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from study.storage.files import (
    create_bytes,
    parquet_from_bytes,
    read_bytes,
    read_json,
    read_table,
    sole_writer,
    write_bytes,
    write_json,
    write_parquet,
)
from study.storage.filesystems import (
    JOURNAL_CACHE_ENV,
    StorageError,
    check_reachable,
    check_writable,
    expand_storage,
    has_scheme,
    is_remote,
    is_shared,
    join,
    journal_cache,
    nearest_existing,
    resolve,
    share_filesystems_when_copied,
    to_uri,
)
from study.storage.paths import CHECKPOINT_FILE, FRAGMENT_PREFIX, StudyPaths

__all__ = [
    "CHECKPOINT_FILE",
    "FRAGMENT_PREFIX",
    "JOURNAL_CACHE_ENV",
    "StorageError",
    "StudyPaths",
    "check_reachable",
    "check_writable",
    "create_bytes",
    "expand_storage",
    "has_scheme",
    "is_remote",
    "is_shared",
    "join",
    "journal_cache",
    "list_studies",
    "nearest_existing",
    "parquet_from_bytes",
    "parquet_state",
    "read_bytes",
    "read_json",
    "read_study_table",
    "read_table",
    "replaced_folder",
    "resolve",
    "share_filesystems_when_copied",
    "sole_writer",
    "table_files",
    "to_uri",
    "trial_reports",
    "write_bytes",
    "write_json",
    "write_parquet",
    "write_parquet_state",
]


def table_files(paths: StudyPaths, kind: str) -> list[str]:
    """The Parquet files of the study's ``kind`` folder (readers skip names starting ``.``/``_``)."""
    fs, directory = resolve(paths.table_dir(kind))
    infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    return sorted(
        i.path
        for i in infos
        if i.type == pafs.FileType.File and i.base_name.endswith(".parquet") and i.base_name[0] not in "._"
    )


def read_study_table(paths: StudyPaths, kind: str) -> pa.Table | None:
    """The study's whole ``trials`` or ``history`` table (None when it has none yet): its
    compacted file and its per-trial fragments. A trial with a fragment is taken from it (where
    a compaction cannot swap the folder whole, a driver killed in the middle leaves both; the
    fragment is the newer). A folder compacted while it is read is read again."""
    for attempt in range(3):
        try:
            return _read_study_table(paths, kind)
        except FileNotFoundError:  # listed, then compacted away before it was opened
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _read_study_table(paths: StudyPaths, kind: str) -> pa.Table | None:
    fs, _ = resolve(paths.root)
    tables: list[pa.Table] = []
    fragment_ids: set[str] = set()
    compacted: pa.Table | None = None

    def load(path: str) -> pa.Table:
        with fs.open_input_stream(path) as f:  # read whole in one go (see read_table)
            return parquet_from_bytes(f.readall())

    files = table_files(paths, kind)
    # a running study of 2,000 trials has 2,000 small files a table: read a few at once (Arrow
    # decodes, and the storage answers, without Python's lock), about one per core: more only
    # contend (2,000 history fragments on 2 cores: 6-8 s one by one, 2.3-2.9 s with 2 threads,
    # 3-5.5 s with 8)
    with ThreadPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, 8, len(files)))) as pool:
        loaded = list(pool.map(load, files))
    for path, table in zip(files, loaded, strict=True):
        if path.rsplit("/", 1)[-1].startswith(FRAGMENT_PREFIX):
            fragment_ids.update(table.column("trial_id").to_pylist())
            tables.append(table)
        else:
            compacted = table
    if compacted is not None:
        if fragment_ids:
            keep = pc.invert(pc.is_in(compacted.column("trial_id"), pa.array(sorted(fragment_ids))))
            compacted = compacted.filter(keep)
        tables.insert(0, compacted)
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="permissive")


def parquet_state(paths: StudyPaths) -> dict[str, Any] | None:
    """How current the study's Parquet is, as its last writer left it (`write_parquet_state`):
    ``written`` (UTC, ISO 8601), ``trials`` (its rows of the trials table) and ``final`` (written
    whole: a run's end, or ``export``); None for a study written before it was recorded."""
    state = read_json(paths.parquet_state)
    return state if isinstance(state, dict) else None


def write_parquet_state(paths: StudyPaths, trials: int, final: bool) -> None:
    """Record that the study's Parquet was written now, with ``trials`` rows of the trials table,
    whole (``final``) or as a refresh while the study runs (a cache's note: not synced)."""
    written = datetime.now(UTC).isoformat(timespec="seconds")
    state = {"written": written, "trials": trials, "final": final}
    write_bytes(paths.parquet_state, json.dumps(state).encode(), durable=False)


def list_studies(root: str) -> list[str]:
    """The names of the studies started under ``root`` (those whose spec was saved)."""
    fs, path = resolve(join(root, "studies"))
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return []
    names = []
    for info in fs.get_file_info(pafs.FileSelector(path)):
        if info.type == pafs.FileType.Directory:
            name = info.path.rstrip("/").rsplit("/", 1)[-1]
            if fs.get_file_info(f"{info.path}/spec.toml").type == pafs.FileType.File:
                names.append(name)
    return sorted(names)


def trial_reports(reports_dir: str, trial_id: str) -> str:
    """Where a study whose end records did not keep the reports kept one trial's reports."""
    return join(reports_dir, f"{trial_id}.jsonl")


_RENAME_EXCHANGE = 2  # linux/fs.h: renameat2 swaps the two names, both must exist


_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one atomic step (Linux's ``renameat2(RENAME_EXCHANGE)``); False where
    the system or the filesystem cannot (then nothing changed)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    return int(renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)) == 0


@contextlib.contextmanager
def replaced_folder(uri: str) -> Iterator[str]:
    """Yield a folder to write ``uri``'s new contents in; when the block ends, they replace the
    folder's whole, and what is not among them goes.

    On a local disk the new folder is a hidden sibling (readers skip names starting ``.``)
    swapped in with one `_exchange`: a reader, or a driver killed at any moment, sees the old
    files or the new ones, never a trial in both (pandas would read it twice). Where the swap
    cannot be done (an object store, a filesystem without it) the new files are put in place one
    by one, then the others are removed: a kill in between leaves both, which
    `read_study_table` resolves and the next compaction removes."""
    fs, path = resolve(uri)
    head, _, base = uri.rstrip("/").rpartition("/")
    staging = f"{head}/.{base}.new"  # hidden from readers, beside the folder (same filesystem)
    if isinstance(fs, pafs.LocalFileSystem):
        shutil.rmtree(resolve(staging)[1], ignore_errors=True)  # a kill's leftover
        os.makedirs(resolve(staging)[1])
    else:
        fs.delete_dir_contents(resolve(staging)[1], missing_dir_ok=True)
    try:
        yield staging
    except BaseException:  # the folder stays as it was; the half-written one goes
        with contextlib.suppress(OSError):
            fs.delete_dir(resolve(staging)[1])
        raise
    if isinstance(fs, pafs.LocalFileSystem):
        os.makedirs(path, exist_ok=True)
        if _exchange(resolve(staging)[1], path):
            shutil.rmtree(resolve(staging)[1], ignore_errors=True)  # the old files, behind the hidden name
            return
    _, staged = resolve(staging)
    listed = fs.get_file_info(pafs.FileSelector(staged, allow_not_found=True))
    new = [i for i in listed if i.type == pafs.FileType.File]
    for info in new:
        fs.move(info.path, f"{path.rstrip('/')}/{info.base_name}")
    names = {i.base_name for i in new}
    for info in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
        if info.type == pafs.FileType.File and info.base_name not in names:
            fs.delete_file(info.path)
    if isinstance(fs, pafs.LocalFileSystem):
        shutil.rmtree(staged, ignore_errors=True)
