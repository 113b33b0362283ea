"""Whole files on any storage root: read in one go, replaced atomically (a reader sees the old
version or the new one, never half a file), created only where absent.

Atomic is not durable: a file renamed into place survives a kill of the process at any instant
(the kernel holds what was written), but only a file synced to the disk (``durable=True``, the
default: ``fsync`` before the rename) survives a crash of the machine. The study syncs the records
a crash must not lose and leaves the rest to the kernel (docs/resume.md, "What a kill or a crash
may cost"). On an object store every write is one PUT, durable when it returns.

Paths are those of `study.storage.filesystems` (a local path, a ``file://`` URI or an object store's).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ponder.files import temporary_beside
from study.storage.filesystems import resolve

log = logging.getLogger("ponder-study")

__all__ = [
    "create_bytes",
    "file_size",
    "parquet_from_bytes",
    "read_bytes",
    "read_json",
    "read_table",
    "sole_writer",
    "write_bytes",
    "write_json",
    "write_parquet",
]


def read_bytes(uri: str) -> bytes | None:
    """The file's bytes, or None when there is no such file. On an object store the file is
    opened at once (one HEAD, one GET; a missing key is one HEAD), see `file_size`."""
    fs, path = resolve(uri)
    if _sole is not None and (known := _sole.recall(fs, path)) is not None:
        return known  # created by this process under `sole_writer`: never replaced
    if isinstance(fs, pafs.LocalFileSystem) and fs.get_file_info(path).type != pafs.FileType.File:
        return None  # a local folder opens without error: asked first
    try:
        with fs.open_input_stream(path) as f:
            data: bytes = f.readall()
    except OSError as e:
        if _missing(fs, path, e):
            return None
        raise
    return data


def _missing(fs: pafs.FileSystem, path: str, error: OSError) -> bool:
    """Whether ``error``, raised opening ``path`` on an object store, says there is no file
    there: S3 raises FileNotFoundError (for a "directory", a prefix, too); for another store's
    way of saying it, its listing is asked."""
    return isinstance(error, FileNotFoundError) or fs.get_file_info(path).type != pafs.FileType.File


def file_size(fs: pafs.FileSystem, path: str) -> int | None:
    """The size of the file at ``path``, or None when there is none.

    On an object store, one HEAD request: ``get_file_info`` on a missing key also lists the
    prefix ``key/`` (to tell a "directory"), and the driver asks about missing keys at every
    trial's start and end (its started and end records, its saved reports). A listing's cost
    grows with the bucket on moto's S3 server (bench/driver_scale.py --s3: 3 ms at 100 trials,
    10 ms at 500), which a HEAD's does not."""
    if isinstance(fs, pafs.LocalFileSystem):
        info = fs.get_file_info(path)
        return (info.size or 0) if info.type == pafs.FileType.File else None
    try:
        with fs.open_input_file(path) as f:  # a HEAD; nothing is read
            return int(f.size())
    except OSError as e:
        if _missing(fs, path, e):
            return None
        raise


def read_table(uri: str) -> pa.Table | None:
    """A Parquet file as an Arrow table, or None when there is no such file. Read whole in one
    go: pyarrow's own path reader opens a file twice, which a running study's rewrite can tear."""
    data = read_bytes(uri)
    return None if data is None else parquet_from_bytes(data)


def parquet_from_bytes(data: bytes) -> pa.Table:
    """A whole Parquet file, in memory, as a table: `pq.ParquetFile` rather than `pq.read_table`,
    whose dataset layer costs about 1 ms a file (a third of the time of a trial's fragment), and
    Arrow's own threads only for a large file (a small one's columns are decoded faster than
    handed out)."""
    return pq.ParquetFile(pa.BufferReader(data)).read(use_threads=len(data) > 1 << 20)


def write_bytes(uri: str, data: bytes, *, durable: bool = True) -> None:
    """Replace the file atomically: temporary file then rename locally, one PUT on object stores.
    ``durable``: synced to the disk once in place (see the module docstring)."""
    _write(*resolve(uri), data, durable=durable)


def _placed(path: str, data: bytes, place: Callable[[str], bool], durable: bool) -> bool:
    """Write ``data`` to a new temporary file beside ``path``, put it in place with ``place(tmp)``
    (a rename or a link: False when it would not), then, if ``durable``, sync it with one
    ``fsync`` of the file: on a journaling filesystem (ext4, XFS) the commit that makes its bytes
    durable also makes its new name durable, which a sync before the rename would leave to the
    next commit. Returns what ``place`` returned."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temporary_beside(path)  # the mode a plain open gives, not mkstemp's 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            placed = place(tmp)
            if placed and durable:
                os.fsync(f.fileno())
        return placed
    finally:
        Path(tmp).unlink(missing_ok=True)  # a link's other name, or what a failed rename left


def _rename(path: str) -> Callable[[str], bool]:
    def rename(tmp: str) -> bool:
        os.replace(tmp, path)
        return True

    return rename


def _link(path: str) -> Callable[[str], bool]:
    def link(tmp: str) -> bool:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True

    return link


def _write(fs: pafs.FileSystem, path: str, data: bytes, durable: bool = True) -> None:
    if isinstance(fs, pafs.LocalFileSystem):
        _placed(path, data, _rename(path), durable)
        return
    with fs.open_output_stream(path) as f:
        f.write(data)


def create_bytes(uri: str, data: bytes, *, durable: bool = True) -> bool:
    """Write the file only if it does not exist; returns whether this call created it.

    Locally the bytes go to a temporary file hard-linked into place, which fails if the name
    exists: create-if-absent and never torn. On an object store the check and the PUT are two
    requests, or, under `sole_writer`, the PUT alone; the study's lease keeps a second writer
    away. ``durable`` as for `write_bytes`; on an object store under `sole_writer`, a file that
    need not be durable is put by a thread of its own, not waited for (what a crash may lose
    locally, a kill may lose there: on an object store the two are one)."""
    fs, path = resolve(uri)
    run = _sole
    if isinstance(fs, pafs.LocalFileSystem):
        created = _placed(path, data, _link(path), durable)
    elif run is not None:
        folder, _, name = path.rpartition("/")
        names = run.listing(fs, folder)
        created = name not in names
        if created:
            names.add(name)
            if durable:
                _write(fs, path, data)
            else:  # as a local write left unsynced: in flight, not waited for
                run.put_behind(fs, path, data)
    else:
        created = file_size(fs, path) is None
        if created:
            _write(fs, path, data)
    if created and run is not None:
        run.remember(fs, path, data)
    return created


class _SoleWriter:
    """What a process that is the one writer of its folders knows of the files it creates."""

    KEPT = 256
    """The files created last whose bytes are kept: a trial's end record is read back by the
    searcher and the Parquet within moments of its writing (on an object store a HEAD and a GET
    each time)."""

    def __init__(self) -> None:
        self.listings: dict[str, set[str]] = {}  # object-store folder -> the names in it
        self.created: OrderedDict[str, bytes] = OrderedDict()
        self._putter: ThreadPoolExecutor | None = None
        self._puts: list[Future[None]] = []

    def put_behind(self, fs: pafs.FileSystem, path: str, data: bytes) -> None:
        """PUT ``data`` in the writer's thread (pyarrow's requests let the driver's thread run)."""
        if self._putter is None:
            self._putter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ponder-study-put")
        self._puts = [f for f in self._puts if not f.done() or f.exception() is not None]
        self._puts.append(self._putter.submit(_write, fs, path, data))

    def close(self) -> None:
        """Wait for the PUTs in flight; one that failed is logged (it was not to be waited for)."""
        if self._putter is None:
            return
        self._putter.shutdown(wait=True)
        for put in self._puts:
            if put.exception() is not None:
                log.warning("a record was not written to the object store: %s", put.exception())

    def listing(self, fs: pafs.FileSystem, folder: str) -> set[str]:
        """The names in ``folder``: listed at the first create there, then kept up to date."""
        key = f"{fs.type_name}://{folder}"
        names = self.listings.get(key)
        if names is None:
            infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
            names = self.listings[key] = {i.base_name for i in infos if i.type == pafs.FileType.File}
        return names

    def remember(self, fs: pafs.FileSystem, path: str, data: bytes) -> None:
        self.created[f"{fs.type_name}://{path}"] = data
        while len(self.created) > self.KEPT:
            self.created.popitem(last=False)

    def recall(self, fs: pafs.FileSystem, path: str) -> bytes | None:
        return self.created.get(f"{fs.type_name}://{path}")


_sole: _SoleWriter | None = None


@contextlib.contextmanager
def sole_writer() -> Iterator[None]:
    """Within, this process is the one writer of the files `create_bytes` makes (a driver under
    its study's lease: `study.run.lease`). Such a file is never replaced, so `create_bytes`
    answers whether a name exists from one listing of its folder on an object store (one PUT a
    record, not a HEAD and a PUT), and `read_bytes` answers a file created here from memory.
    Another process creating or deleting those files meanwhile is not seen."""
    global _sole
    previous, _sole = _sole, _SoleWriter()
    try:
        yield
    finally:
        writer, _sole = _sole, previous
        writer.close()


def read_json(uri: str) -> Any:
    """The parsed JSON file, or None when there is no such file."""
    data = read_bytes(uri)
    return None if data is None else json.loads(data)


def write_json(uri: str, obj: Any) -> None:
    """Write ``obj`` as JSON, atomically."""
    write_bytes(uri, json.dumps(obj, indent=1, sort_keys=True).encode())


def write_parquet(uri: str, table: pa.Table) -> None:
    """Write a Parquet file atomically (readers never see a half-written file)."""
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    write_bytes(uri, buffer.getvalue().to_pybytes())
