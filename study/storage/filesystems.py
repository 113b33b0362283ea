"""A storage root as a path or URI, the pyarrow filesystem that reaches it, and the checks made
on it before a study starts.

A plain path is on this machine's disk. A multi-node study needs a root every node reads and
writes: an object store (``s3://bucket/prefix``, ``gs://...``) or a filesystem every node
mounts, given as a ``file://`` URI to say so (``file:///mnt/nfs/results``), see `is_shared`.
Optuna's journal needs a file lock, which object stores lack: with a remote root the driver
keeps it on its own disk (`journal_cache`) and copies it to the study directory as trials end.
"""

from __future__ import annotations

import copy
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

__all__ = [
    "JOURNAL_CACHE_ENV",
    "SCHEMES",
    "StorageError",
    "check_reachable",
    "check_writable",
    "expand_storage",
    "has_scheme",
    "is_remote",
    "is_shared",
    "join",
    "journal_cache",
    "nearest_existing",
    "resolve",
    "share_filesystems_when_copied",
    "to_uri",
]


JOURNAL_CACHE_ENV = "PONDER_STUDY_CACHE"
"""Where a driver keeps the Optuna journals of studies on remote storage (default ~/.cache/ponder-study)."""


class StorageError(ValueError):
    """A storage path or URI that cannot be used; the message says why, in one line."""


SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "abfs", "abfss")
"""The URI schemes pyarrow's filesystems take (a plain path is this machine's disk)."""


def expand_storage(value: str) -> str:
    """A storage path or URI as the user meant it: ``~`` and ``$VARS`` expanded, and a URI that
    could not work refused (an unknown or misspelt scheme, an object store without a bucket),
    before anything starts. Nothing is reached here: see `check_reachable`."""
    text = os.path.expandvars(os.path.expanduser(value.strip()))
    if not text:
        raise StorageError("the storage must not be empty")
    scheme_like = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", text)
    if "://" in text:
        scheme, rest = text.split("://", 1)
        if scheme.lower() not in SCHEMES:
            raise StorageError(
                f"storage {value!r}: unknown scheme {scheme!r}; use a path, or one of {SCHEMES}"
            )
        if scheme.lower() == "file":
            rest = os.path.expanduser(rest)
            return f"file://{rest}"
        if not rest.split("/", 1)[0]:
            raise StorageError(f"storage {value!r} names no bucket: write {scheme}://BUCKET/PREFIX")
        return f"{scheme.lower()}://{rest.rstrip('/')}"
    if scheme_like and scheme_like.group(1).lower() in SCHEMES:
        raise StorageError(
            f"storage {value!r} looks like a URI without '//': write {scheme_like.group(1)}://BUCKET/PREFIX"
        )
    return text


def check_reachable(uri: str, timeout_s: float = 10.0) -> None:
    """Reach a remote storage's filesystem within ``timeout_s``, or raise `StorageError` saying
    why (a scheme whose library is missing, a missing bucket, bad credentials, no network)."""
    if not is_remote(uri):
        return
    import threading

    outcome: list[BaseException | None] = []

    def probe() -> None:
        try:
            fs, path = pafs.FileSystem.from_uri(uri)
            bucket = path.split("/", 1)[0]
            if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                raise StorageError(f"storage {uri}: bucket {bucket!r} does not exist (or is not visible)")
            outcome.append(None)
        except BaseException as e:  # reported to the caller's thread
            outcome.append(e)

    thread = threading.Thread(target=probe, name="ponder-study-storage-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        raise StorageError(
            f"storage {uri}: no answer within {timeout_s:.0f} s (no network, no credentials, or a "
            "filesystem this machine cannot reach); check the URI and your credentials"
        )
    error = outcome[0]
    if isinstance(error, StorageError):
        raise error
    if error is not None:
        message = " ".join(str(error).split())[:200]
        raise StorageError(f"storage {uri}: {message}") from error


def check_writable(uri: str) -> None:
    """A local storage that a study can be written to, or `StorageError` saying why, before Ray
    starts: an empty folder is made and removed in the nearest folder of the path that exists (so
    a storage that does not exist yet leaves nothing behind): a read-only or pseudo filesystem
    (``/proc``, ``/sys``) or a path through a file is refused before anything starts, not met
    when the first file is written. Object stores: see `check_reachable`."""
    if is_remote(uri):
        return
    existing = nearest_existing(_local(uri))
    if not existing.is_dir():
        raise StorageError(f"storage {uri}: {existing} is a file, not a folder; give a folder")
    try:
        probe = tempfile.mkdtemp(dir=existing, prefix=".ponder-study-write-check-")
    except OSError as e:
        raise StorageError(
            f"storage {uri} cannot be written ({e.strerror or e} in {existing}); "
            "give a folder you can write to"
        ) from e
    os.rmdir(probe)


def nearest_existing(path: str | os.PathLike[str]) -> Path:
    """The path itself if it exists, else its nearest ancestor that does (``/`` at worst): where a
    local storage that is not made yet will be made, and whose disk it will fill. A path inside
    a folder we may not enter counts as not there: Path.exists raises for it (EACCES)."""
    existing = Path(path).absolute()
    while existing != existing.parent:
        try:
            if existing.exists():
                break
        except OSError:
            pass
        existing = existing.parent
    return existing


def has_scheme(uri: str) -> bool:
    """Whether ``uri`` is a URI (``s3://bucket/x``, ``file:///mnt/x``) rather than a plain path:
    a URI is kept as written, a plain path is this machine's and may be made absolute."""
    return "://" in uri


def is_remote(uri: str) -> bool:
    """True for a URI with a scheme other than ``file://`` (``s3://bucket/x``)."""
    return has_scheme(uri) and not uri.startswith("file://")


def is_shared(uri: str) -> bool:
    """Whether ``uri`` names storage every node of a cluster can reach: an object store, or a
    ``file://`` URI (the user's word that the path is a filesystem every node mounts). A plain
    path is this machine's disk."""
    return has_scheme(uri)


def _local(uri: str) -> str:
    return os.path.abspath(uri.removeprefix("file://"))


_FILESYSTEMS: dict[tuple[Any, ...], pafs.FileSystem] = {}


_CREDENTIALS = ("AWS_", "GOOGLE_", "GCS_", "AZURE_")
"""The environment an object store's filesystem is built from (endpoint, keys, region)."""


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``uri`` and the path inside it. An object store's filesystem is built
    once per bucket (and process, and credentials): building it from a URI asks the store for
    the bucket's region, a round trip that cost 15-20 ms per call on moto's S3 (profiled in
    bench/driver_scale.py --s3) for every file the driver wrote."""
    if not is_remote(uri):
        return pafs.LocalFileSystem(), _local(uri)
    scheme, rest = uri.split("://", 1)
    if "?" in rest:  # options in the URI (endpoint_override=...): built as given
        built, inside = pafs.FileSystem.from_uri(uri)
        return built, inside
    bucket = rest.split("/", 1)[0]
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_CREDENTIALS)))
    key = (os.getpid(), scheme, bucket, env)
    fs = _FILESYSTEMS.get(key)
    if fs is None:
        fs, path = pafs.FileSystem.from_uri(uri)
        fs = _FILESYSTEMS[key] = _one_put_a_small_write(fs)
        return fs, path
    return fs, rest.rstrip("/")


def _one_put_a_small_write(fs: pafs.FileSystem) -> pafs.FileSystem:
    """An S3 filesystem whose small writes are one PUT, made as the stream closes: by default
    pyarrow opens a multipart upload for every output stream, three requests (create, one part,
    complete) for a record of a few hundred bytes, and hands each part to a background thread.
    With ``allow_delayed_open`` a write smaller than a part is one PutObject (a missing bucket is
    then reported as the stream closes rather than opens); without ``background_writes`` it is
    sent by the closing thread. On moto's server, 2 KB written: 22-26 ms by default, 9 ms so."""
    if not isinstance(fs, pafs.S3FileSystem):
        return fs
    rebuild, (options,) = fs.__reduce__()  # the options it was built with (its region found)
    return rebuild({**options, "allow_delayed_open": True, "background_writes": False})


def _shared(fs: pafs.FileSystem, memo: dict[int, Any]) -> pafs.FileSystem:
    return fs


def share_filesystems_when_copied() -> None:
    """Make ``copy.deepcopy`` of pyarrow's S3 filesystem return that filesystem (for the driver,
    before Tune starts).

    Tune deep-copies its experiment's spec for every trial it creates, and the spec holds the
    storage's filesystem. A copied S3FileSystem built a new S3 client, and a new client takes
    pyarrow's process-wide S3 lock exclusively, which every request of every client holds shared
    while it runs: it waits for a moment when no request is in flight, rare while Tune uploads
    the experiment in the background (every trial's files, at each sync). One copy took 0.1 ms
    idle and up to 0.85 s beside a ``copy_files``; a trial's start, 50 ms shared and 0.07 to
    1.0 s copied (bench/driver_scale.py --s3, 20-trial windows at N = 100 and 500). A pyarrow
    filesystem is immutable and thread-safe, so one shared does what a copy did; pickling (a
    trial sent to its worker) is unchanged."""
    copy._deepcopy_dispatch[pafs.S3FileSystem] = _shared  # type: ignore[attr-defined]


def join(root: str, *parts: str) -> str:
    """``root`` (a path or URI) joined with ``parts``, in the form of ``root``."""
    if is_remote(root):
        return "/".join([root.rstrip("/"), *parts])
    return os.path.join(_local(root), *parts)


def to_uri(root: str, path: str) -> str:
    """A path Tune reports inside the filesystem of ``root`` (``bucket/tune/...`` for S3) as a
    URI that names its filesystem again (``s3://bucket/tune/...``); local paths as they are."""
    if is_remote(root) and "://" not in path:
        return f"{root.split('://', 1)[0]}://{path.lstrip('/')}"
    return path


def journal_cache(root: str, name: str) -> str:
    """The driver's local copy of a remote study's Optuna journal, one per root and name."""
    base = os.environ.get(JOURNAL_CACHE_ENV) or os.path.expanduser("~/.cache/ponder-study")
    scheme, rest = root.split("://", 1)
    return os.path.join(base, scheme, *[p for p in rest.split("/") if p], name, "optuna.journal")
