"""Where a study's files live, on a local disk or any pyarrow filesystem (``s3://``, ``gs://``).

A study named N under the storage root R::

    R/tune/N/                      Tune's experiment: trial dirs, checkpoints, experiment state
    R/studies/N/spec.toml          the spec the study was started with (``resume`` reads it)
    R/studies/N/optuna.journal     the Optuna study (``optuna-dashboard`` opens it); on an object
                                   store, a copy of the driver's local journal (see below)
    R/studies/N/asha.json          ASHA's rungs and the trials it stopped (Ray does not keep them);
                                   locally, the changes since are in asha.json.log (study.asha_state)
    R/studies/N/ended/T.json       how trial T ended (outcome, config, last report, checkpoint),
                                   written once when it ends: the record a resume and every reader
                                   trust even when Tune's own state lags behind it (`study.records`)
    R/studies/N/lease.json         who runs the study now (host, pid, since when), `study.lease`
    R/studies/N/reports/T.jsonl    trial T's reports, saved before a ledger records T's end
                                   (Tune's copy of them lags, and a resume can empty it)
    R/studies/N/started/T.json     Tune's state of trial T, written before T starts (a resume
                                   adds it to Tune's saved state if that lags)
    R/trials/study=N/trials.parquet    one row per trial (those final when the study was compacted)
    R/trials/study=N/trial-T.parquet   trial T's row, written once when T ended after that
    R/history/study=N/history.parquet  one row per trial per report, as trials.parquet
    R/history/study=N/trial-T.parquet  trial T's reports, as trial-T.parquet above

Every file here is replaced atomically: a reader sees the old version or the new one. A study's
``trials`` and ``history`` folders are compacted whole (`replaced_folder`): on a local disk a
reader sees the old files or the new ones, never a trial in both.

A plain path is on this machine's disk. A multi-node study needs a root every node reads and
writes: an object store (``s3://bucket/prefix``, ``gs://...``) or a filesystem every node
mounts, given as a ``file://`` URI to say so (``file:///mnt/nfs/results``), see `is_shared`.
Optuna's journal needs a file lock, which object stores lack: with a remote root the driver
keeps it on its own disk (`journal_cache`) and copies it to the study directory as trials end.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ponder.files import temporary_beside

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
    "is_remote",
    "is_shared",
    "join",
    "journal_cache",
    "list_studies",
    "nearest_existing",
    "parquet_from_bytes",
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

CHECKPOINT_FILE = "trainer.pt"
"""The trainer's file inside each Tune checkpoint directory (written by the trainable, read by
`evaluate`); here, where both reach it without importing Ray."""

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
    a storage that does not exist yet leaves nothing behind). Without it a read-only or pseudo
    filesystem (``/proc``, ``/sys``) or a path through a file failed after Ray had started, and
    was reported as a full disk with a resume of a study that never began. Object stores: see
    `check_reachable`."""
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


def is_remote(uri: str) -> bool:
    """True for a URI with a scheme other than ``file://`` (``s3://bucket/x``)."""
    return "://" in uri and not uri.startswith("file://")


def is_shared(uri: str) -> bool:
    """Whether ``uri`` names storage every node of a cluster can reach: an object store, or a
    ``file://`` URI (the user's word that the path is a filesystem every node mounts). A plain
    path is this machine's disk."""
    return "://" in uri


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
        _FILESYSTEMS[key] = fs
        return fs, path
    return fs, rest.rstrip("/")


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


@dataclass(frozen=True)
class StudyPaths:
    """The locations of one study's files (see the module docstring)."""

    root: str
    name: str

    @property
    def tune_root(self) -> str:
        """Tune's ``storage_path``; the experiment is ``tune_root/name``."""
        return join(self.root, "tune")

    @property
    def experiment(self) -> str:
        return join(self.root, "tune", self.name)

    @property
    def study_dir(self) -> str:
        return join(self.root, "studies", self.name)

    @property
    def spec(self) -> str:
        return join(self.study_dir, "spec.toml")

    @property
    def asha(self) -> str:
        return join(self.study_dir, "asha.json")

    @property
    def ended(self) -> str:
        """The ledger of studies started before end records (trial id -> checkpoint)."""
        return join(self.study_dir, "ended.json")

    @property
    def ended_dir(self) -> str:
        """``<trial_id>.json``: each ended trial's end record (`study.records`)."""
        return join(self.study_dir, "ended")

    def end_record(self, trial_id: str) -> str:
        return join(self.study_dir, "ended", f"{trial_id}.json")

    @property
    def lease(self) -> str:
        """Who holds the study now (`study.lease`)."""
        return join(self.study_dir, "lease.json")

    @property
    def root_fs_path(self) -> str:
        """The storage root as a path inside its filesystem (``bucket/prefix`` for S3)."""
        return resolve(self.root)[1]

    @property
    def reports_dir(self) -> str:
        """``<trial_id>.jsonl``: each ended trial's reports, saved before a ledger records it."""
        return join(self.study_dir, "reports")

    @property
    def optuna_journal(self) -> str:
        """A local file: Optuna's journal needs a file lock, which object stores do not have."""
        if is_remote(self.root):
            return journal_cache(self.root, self.name)
        return join(self.study_dir, "optuna.journal")

    @property
    def optuna_journal_copy(self) -> str | None:
        """The journal's copy in the study directory, for a remote root (None for a local one)."""
        return join(self.study_dir, "optuna.journal") if is_remote(self.root) else None

    @property
    def trials_dataset(self) -> str:
        return join(self.root, "trials")

    @property
    def trials_parquet(self) -> str:
        return join(self.table_dir("trials"), self.compacted_name("trials"))

    @property
    def history_parquet(self) -> str:
        return join(self.table_dir("history"), self.compacted_name("history"))

    @staticmethod
    def compacted_name(kind: str) -> str:
        """The name of a study's compacted ``trials`` or ``history`` file in its folder."""
        return f"{kind}.parquet"

    @staticmethod
    def fragment_name(trial_id: str) -> str:
        """The name of one trial's fragment in a study's ``trials`` or ``history`` folder."""
        return f"{FRAGMENT_PREFIX}{trial_id}.parquet"

    def table_dir(self, kind: str) -> str:
        """The study's folder of the ``trials`` or ``history`` dataset: its compacted file
        (``<kind>.parquet``) and one fragment per trial not in it (``trial-<id>.parquet``)."""
        return join(self.root, kind, f"study={self.name}")

    def fragment(self, kind: str, trial_id: str) -> str:
        """One trial's rows of the ``trials`` or ``history`` dataset, written when it ends."""
        return join(self.table_dir(kind), self.fragment_name(trial_id))

    @property
    def started_dir(self) -> str:
        """``<trial_id>.json``: Tune's own saved state of each trial, written before it starts."""
        return join(self.study_dir, "started")

    def started_record(self, trial_id: str) -> str:
        return join(self.study_dir, "started", f"{trial_id}.json")

    def exists(self) -> bool:
        """Whether a study of this name was started here (its spec was saved)."""
        return read_bytes(self.spec) is not None


def read_bytes(uri: str) -> bytes | None:
    """The file's bytes, or None when there is no such file. On an object store the file is
    opened at once (one HEAD, one GET; a missing key is one HEAD), see `_file_size`."""
    fs, path = resolve(uri)
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


def _file_size(fs: pafs.FileSystem, path: str) -> int | None:
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


FRAGMENT_PREFIX = "trial-"
"""A per-trial file of a study's ``trials`` or ``history`` folder (`StudyPaths.fragment`)."""


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


def write_bytes(uri: str, data: bytes) -> None:
    """Replace the file atomically: temporary file then rename locally, one PUT on object stores."""
    _write(*resolve(uri), data)


def _durable_temporary(path: str, data: bytes) -> str:
    """``data`` in a new temporary file beside ``path``, on disk (fsynced): the first half of a
    write no reader can see torn. The caller renames or links it into place."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temporary_beside(path)  # the mode a plain open gives, not mkstemp's 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def _write(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = _durable_temporary(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return
    with fs.open_output_stream(path) as f:
        f.write(data)


def create_bytes(uri: str, data: bytes) -> bool:
    """Write the file only if it does not exist; returns whether this call created it.

    Locally the bytes go to a temporary file hard-linked into place, which fails if the name
    exists: create-if-absent and never torn. On an object store the check and the PUT are two
    requests; the study's lease keeps a second writer away."""
    fs, path = resolve(uri)
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = _durable_temporary(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            Path(tmp).unlink(missing_ok=True)
        return True
    if _file_size(fs, path) is not None:
        return False
    _write(fs, path, data)
    return True


def save_reports(trial: Any, reports_dir: str) -> None:
    """Save a Tune trial's reports (its ``result.json``, from the driver's staging directory)
    as ``<reports_dir>/<trial_id>.jsonl``, before a ledger records the trial's end.

    The ledgers (``ended.json``, ASHA's stops) are written the moment a trial ends and say
    "never train it again". Tune's own copy of ``result.json`` on the storage lags by seconds,
    and a resume from an experiment state saved before the trial's first checkpoint starts the
    trial afresh, emptying that copy: without this one, a driver killed at the wrong moment
    would lose every report of a trial that never runs again. A copy already saved is only
    replaced by a longer one."""
    try:
        local_dir = trial.local_path
    except (AttributeError, RuntimeError):  # Tune's trial without a directory yet
        return
    if not local_dir or not Path(local_dir, "result.json").exists():
        return
    data = Path(local_dir, "result.json").read_bytes()
    uri = trial_reports(reports_dir, trial.trial_id)
    fs, path = resolve(uri)
    saved = _file_size(fs, path)
    # a restored trial that had ended returns without reporting: its staging copy is empty
    if saved is not None and saved >= len(data):
        return
    write_bytes(uri, data)


def trial_reports(reports_dir: str, trial_id: str) -> str:
    """Where `save_reports` keeps one trial's reports."""
    return join(reports_dir, f"{trial_id}.jsonl")


def read_json(uri: str) -> Any:
    """The parsed JSON file, or None when there is no such file."""
    data = read_bytes(uri)
    return None if data is None else json.loads(data)


def write_json(uri: str, obj: Any) -> None:
    """Write ``obj`` as JSON, atomically."""
    write_bytes(uri, json.dumps(obj, indent=1, sort_keys=True).encode())


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


def write_parquet(uri: str, table: pa.Table) -> None:
    """Write a Parquet file atomically (readers never see a half-written file)."""
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    write_bytes(uri, buffer.getvalue().to_pybytes())
