"""Where a study's files live, and the command lines that reach a study again: the bottom layer,
which imports nothing else of study.

- `study.storage.storage`: the facade every other folder uses: `StudyPaths`, the tables read
  whole, files read and replaced atomically, local or on an object store;
- `study.storage.paths`: `StudyPaths`, one property a file of a study under its storage root;
- `study.storage.filesystems`: a storage root as a path or URI and the pyarrow filesystem behind it;
- `study.storage.files`: whole files read in one go, replaced atomically, created only once;
- `study.storage.commands`, `study.storage.hints`: ``ponder-study`` as the user's shell reaches
  it, and the command lines printed to paste (which name ``--storage`` when not the default).

`study.storage.storage`'s names are re-exported here, on first use (a study pickled before the folders names
``study.storage.StudyPaths``), and the entry point imports `study.storage.commands` before anything
heavy: importing a module of this folder imports no other. No Ray, no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from study.storage.storage import (
        CHECKPOINT_FILE,
        FRAGMENT_PREFIX,
        JOURNAL_CACHE_ENV,
        StorageError,
        StudyPaths,
        check_reachable,
        check_writable,
        create_bytes,
        expand_storage,
        has_scheme,
        is_remote,
        is_shared,
        join,
        journal_cache,
        list_studies,
        nearest_existing,
        parquet_from_bytes,
        parquet_state,
        read_bytes,
        read_json,
        read_study_table,
        read_table,
        replaced_folder,
        resolve,
        save_reports,
        share_filesystems_when_copied,
        table_files,
        to_uri,
        trial_reports,
        write_bytes,
        write_json,
        write_parquet,
    )

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
    "save_reports",
    "share_filesystems_when_copied",
    "table_files",
    "to_uri",
    "trial_reports",
    "write_bytes",
    "write_json",
    "write_parquet",
]


def __getattr__(name: str) -> Any:
    """`study.storage.storage`'s names, imported when first asked for."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from study.storage import storage

    return getattr(storage, name)
