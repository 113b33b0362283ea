"""One schema for the whole ``trials/`` (and ``history/``) dataset, whatever studies it holds.

Readers of a directory of Parquet files take their columns from one file: pandas and
``pyarrow.dataset`` from the first in sort order, DuckDB too unless told ``union_by_name``, and
polars refuses files that differ; none reads ``_common_metadata`` on its own (pyarrow 26, polars
2.1, DuckDB 2.0: ``docs/parquet.md``). So every file of the dataset has the same columns in the
same order: the union of every column any study has written, kept in
``<dataset>/_common_metadata`` (a footer without rows; readers skip names starting with ``_``).

A study writes each of its files (its compacted file, one fragment per trial ended since) with
that schema, a column it lacks as nulls. A table with new columns extends the schema file and
adds them, as nulls, to every other file: another study's under that study's lease
(`study.run.lease.hold_lease`), or, while its driver holds the lease, at that driver's next write.
"""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from study.run.lease import LeaseHeld, hold_lease
from study.storage.storage import (
    StudyPaths,
    join,
    parquet_from_bytes,
    read_bytes,
    read_table,
    resolve,
    table_files,
    to_uri,
    write_bytes,
    write_parquet,
)

__all__ = ["COMMON_METADATA", "conform", "dataset_schema", "write_study_table"]

COMMON_METADATA = "_common_metadata"
"""The dataset's schema file, beside the ``study=<name>`` directories."""


def dataset_schema(dataset: str) -> pa.Schema | None:
    """The schema every file of ``dataset`` (``<root>/trials`` or ``<root>/history``) has, if
    one was written."""
    data = read_bytes(join(dataset, COMMON_METADATA))
    return None if data is None else pq.read_schema(pa.BufferReader(data))


def _union(schema: pa.Schema | None, table: pa.Table) -> pa.Schema:
    """``schema``'s columns in its order, then ``table``'s new ones in theirs; a column's type is
    the dataset's (a study written by an older schema may differ: its values are cast)."""
    if schema is None:
        return pa.schema(list(table.schema))
    known = set(schema.names)
    return pa.schema([*schema, *(f for f in table.schema if f.name not in known)])


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns, in its order: a column it lacks is null."""
    if table.schema.equals(schema, check_metadata=False):
        return table
    columns = []
    names = set(table.column_names)
    for f in schema:
        if f.name in names:
            column = table.column(f.name)
            columns.append(column if column.type == f.type else column.cast(f.type, safe=False))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=pa.schema(list(schema)))


def write_study_table(paths: StudyPaths, kind: str, table: pa.Table, file: str | None = None) -> None:
    """Write study ``paths.name``'s ``kind`` table (``trials`` or ``history``) atomically with the
    dataset's schema, to ``file`` (default the study's compacted ``<kind>.parquet``; a trial's
    fragment is `StudyPaths.fragment`), extending the schema (and widening every other file of
    this study and of every other idle study) when ``table`` has columns the dataset has not
    seen. The caller holds the study's own lease."""
    dataset = join(paths.root, kind)
    target = file or _file(paths.root, kind, paths.name)
    current = dataset_schema(dataset)
    schema = _union(current, table)
    if current is not None and schema.names == current.names:  # the common case: nothing new
        write_parquet(target, conform(table, schema))
        return
    others = [name for name in _studies(dataset) if name != paths.name]
    if current is None:  # no schema file yet (studies written before schema 3): theirs count too
        for name in others:
            for uri in table_files(StudyPaths(paths.root, name), kind):
                if (older := read_table(uri)) is not None:
                    schema = _union(schema, older)
    write_parquet(target, conform(table, schema))
    sink = pa.BufferOutputStream()
    pq.write_metadata(schema, sink)
    write_bytes(join(dataset, COMMON_METADATA), sink.getvalue().to_pybytes())
    _widen_files(paths, kind, schema, skip=target)  # this study's other files: its lease is held
    for name in others:
        _widen(StudyPaths(paths.root, name), kind, schema)


def _file(root: str, kind: str, name: str) -> str:
    return join(root, kind, f"study={name}", f"{kind}.parquet")


def _studies(dataset: str) -> list[str]:
    fs, path = resolve(dataset)
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return []
    names = []
    for info in fs.get_file_info(pafs.FileSelector(path)):
        base = info.path.rstrip("/").rsplit("/", 1)[-1]
        if info.type == pafs.FileType.Directory and base.startswith("study="):
            names.append(base.removeprefix("study="))
    return sorted(names)


def _widen_files(paths: StudyPaths, kind: str, schema: pa.Schema, skip: str | None = None) -> None:
    """Give each file of the study's ``kind`` folder the dataset's columns (its values unchanged)."""
    fs, _ = resolve(paths.root)
    skipped = resolve(skip)[1] if skip else None
    for path in table_files(paths, kind):
        if path == skipped:
            continue
        with fs.open_input_stream(path) as f:
            table = parquet_from_bytes(f.readall())
        if table.schema.names != schema.names:
            # a column only it has (written meanwhile) stays: conforming never drops data
            conformed = conform(table, _union(schema, table))
            sink = pa.BufferOutputStream()
            pq.write_table(conformed, sink)
            write_bytes(_uri(paths.root, path), sink.getvalue().to_pybytes())


def _uri(root: str, fs_path: str) -> str:
    """A path inside the root's filesystem as a URI `resolve` takes back to it."""
    return to_uri(root, fs_path)


def _widen(other: StudyPaths, kind: str, schema: pa.Schema) -> None:
    """Give another study's file the dataset's columns (its own values unchanged), under its lease;
    skipped while its driver holds the lease: that driver conforms at its next write."""
    with contextlib.suppress(LeaseHeld), hold_lease(other, "export"):
        _widen_files(other, kind, schema)
