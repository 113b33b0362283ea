"""One driver per study: a lease in the study's own folder, ``studies/<name>/lease.json``.

``run``, ``resume`` and ``export`` take the lease before Ray starts and hold it until they exit;
a second driver is refused at once, told which host and pid hold it and for how long. The lease
travels with the study folder. How it is held depends on the storage:

- A local disk (a plain path or ``file://``): an exclusive ``flock`` on ``lease.lock`` for the
  holder's lifetime, who it is in ``lease.json``. The kernel drops the lock however the process
  dies (SIGKILL included), so nothing expires and a killed driver never blocks the next. On NFS
  ``flock`` is carried by byte-range locks (Linux >= 2.6.12 with a lock manager): the same
  guarantee across hosts, none on a ``nolock`` mount.
- An object store (``s3://``, through boto3): ``lease.json`` is created with ``If-None-Match: *``
  and renewed every ``ttl/3`` with ``If-Match: <etag>``. A lease older than its TTL by the
  store's own clock (``Last-Modified`` against the response's ``Date``), or whose holder was on
  this host and is gone (pid and start time), is taken over with ``If-Match``: a resume after a
  driver on another host was killed is refused for at most one TTL (``lease_ttl_s``, 30 s).
  A driver whose lease was taken over that way (suspended, asleep, cut off from the store for
  a TTL) ends at its next renewal, exit 1, writing nothing more.
  Without boto3, or on a store without conditional writes (``gs://``), the lease is advisory:
  read, then written, which two drivers starting within the same second can both pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from study.storage.commands import PROG, command_name
from study.storage.storage import StudyPaths, is_remote, read_bytes, resolve, write_bytes

__all__ = ["EXIT_TAKEN_OVER", "LEASE_TTL_S", "Lease", "LeaseHeld", "driver_of", "hold_lease"]

LEASE_TTL_S = 30.0
"""How long an object-store lease lasts without renewal (renewed every third of it)."""
EXIT_TAKEN_OVER = 1
"""The exit code of a driver whose object-store lease another driver took over (an error)."""


class LeaseHeld(RuntimeError):
    """Another driver holds the study; the message names it and says what to do."""


def _pid_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), which
    tells a live holder from a new process that reused its pid; None where /proc is missing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive_here(holder: dict[str, Any]) -> bool:
    """Whether a holder recorded on this host still runs (same pid, same start time)."""
    pid = int(holder.get("pid") or 0)
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    started = _pid_start(pid)
    return started is None or started == holder.get("pid_start")


@dataclass
class Lease:
    """Who holds a study: what ``lease.json`` says."""

    uuid: str
    host: str
    pid: int
    pid_start: str | None
    command: str
    acquired_at: float
    ttl_s: float

    @classmethod
    def mine(cls, command: str, ttl_s: float) -> Lease:
        pid = os.getpid()
        return cls(uuid.uuid4().hex, socket.gethostname(), pid, _pid_start(pid), command, time.time(), ttl_s)

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, indent=1, sort_keys=True).encode()


def _describe(holder: dict[str, Any]) -> str:
    command = holder.get("command") or "a driver"
    who = f"`{command}` (pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if isinstance(holder.get("acquired_at"), (int, float)):
        who += f", for {max(0.0, time.time() - float(holder['acquired_at'])):.0f} s"
    return who + ")"


def _refusal(paths: StudyPaths, holder: dict[str, Any], hint: str) -> LeaseHeld:
    return LeaseHeld(f"study {paths.name!r} is in use by {_describe(holder)}; {hint}")


def _command(verb: str, paths: StudyPaths) -> str:
    """``ponder-study VERB NAME`` (with ``--storage`` unless it is the default, ``results``;
    the command as the user's shell reaches it, `command_name`)."""
    line = f"{command_name()} {verb} {shlex.quote(paths.name)}"
    return line if paths.root == "results" else f"{line} --storage {shlex.quote(paths.root)}"


def _then(paths: StudyPaths, command: str, stop: str = "stop it (Ctrl-C)") -> str:
    """What to do about a study another driver holds. A ``run`` must not be run again: the name
    is the other driver's study by then, so the study is followed or continued instead."""
    if command == "run":
        return (
            f"follow it with `{_command('status', paths)}`, or once it has stopped continue it with "
            f"`{_command('resume', paths)}`"
        )
    return f"wait for it to finish, or {stop} and run this again"


def _parse(data: bytes | None) -> dict[str, Any]:
    try:
        holder = json.loads(data or b"{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _holder_once_written(paths: StudyPaths, wait_s: float = 2.0) -> dict[str, Any]:
    """The lease's holder, waiting a moment for a holder that has the lock but has not yet
    written who it is: the refusal names the command and pid whenever there is one."""
    deadline = time.monotonic() + wait_s
    while not (holder := _parse(read_bytes(paths.lease))) and time.monotonic() < deadline:
        time.sleep(0.05)
    return holder


# -- a local disk: flock ------------------------------------------------------------------------
@contextlib.contextmanager
def _hold_local(paths: StudyPaths, lease: Lease) -> Iterator[None]:
    import fcntl

    lease_file = Path(resolve(paths.lease)[1])
    study_dir = lease_file.parent
    created = [d for d in (study_dir, *study_dir.parents) if not d.exists()]  # deepest first
    study_dir.mkdir(parents=True, exist_ok=True)
    lock_file = lease_file.with_suffix(".lock")
    lock: BinaryIO = lock_file.open("ab")  # O_CLOEXEC: Ray's processes never inherit it
    try:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_once_written(paths)
            raise _refusal(paths, holder, _then(paths, lease.command)) from None
        write_bytes(paths.lease, lease.to_json())
        try:
            yield
        finally:
            Path(lease_file).unlink(missing_ok=True)
            if created and not (study_dir / "spec.toml").exists():
                lock_file.unlink(missing_ok=True)  # a run refused before it wrote anything
                with contextlib.suppress(OSError):
                    for d in created:  # leaves nothing it made: not even the storage root
                        d.rmdir()
    finally:
        lock.close()


# -- an object store: conditional PUTs ----------------------------------------------------------
def _s3_client() -> Any:
    import boto3

    return boto3.client("s3")


def _bucket_key(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.split("://", 1)[1].partition("/")
    return bucket, key


class _S3Lease:
    """``lease.json`` on S3, created with If-None-Match and renewed or taken over with If-Match."""

    def __init__(self, paths: StudyPaths, lease: Lease) -> None:
        from botocore.exceptions import ClientError

        self._error = ClientError
        self.paths, self.lease = paths, lease
        self.bucket, self.key = _bucket_key(paths.lease)
        self.s3 = _s3_client()
        self.etag: str | None = None

    def _conflict(self, e: Exception) -> bool:
        code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
        return code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")

    def _missing(self, e: Exception) -> bool:
        return getattr(e, "response", {}).get("Error", {}).get("Code") in ("NoSuchKey", "404")

    def _put(self, **condition: str) -> bool:
        try:
            r = self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=self.lease.to_json(), **condition)
        except self._error as e:
            if self._conflict(e):
                return False
            raise
        self.etag = r["ETag"]
        return True

    def acquire(self) -> None:
        if self._put(IfNoneMatch="*"):
            return
        try:
            r = self.s3.get_object(Bucket=self.bucket, Key=self.key)
        except self._error as e:  # released between our two requests: try once more
            if self._missing(e) and self._put(IfNoneMatch="*"):
                return
            raise
        holder = _parse(r["Body"].read())
        now = parsedate_to_datetime(r["ResponseMetadata"]["HTTPHeaders"]["date"])
        age = (now - r["LastModified"]).total_seconds()  # both the store's clock
        ttl = float(holder.get("ttl_s") or LEASE_TTL_S)
        here = holder.get("host") == self.lease.host
        stale = age > ttl or (here and not _alive_here(holder))
        if not stale:
            hint = _then(self.paths, self.lease.command)
            if not here:
                expiry = f"if that driver is gone, its lease expires {max(0.0, ttl - age):.0f} s from now"
                hint = f"{expiry}: then {hint}" if self.lease.command == "run" else expiry
            raise _refusal(self.paths, holder, hint)
        if not self._put(IfMatch=r["ETag"]):  # another driver took it over first
            hint = "another driver took it over just now"
            if self.lease.command == "run":
                hint += f"; {_then(self.paths, 'run')}"
            raise _refusal(self.paths, holder, hint)

    def renew(self) -> bool:
        assert self.etag is not None
        return self._put(IfMatch=self.etag)

    def holder(self) -> dict[str, Any] | None:
        """Who ``lease.json`` names now (None: no lease there), this lease's ETag brought up to
        date when it is still this one (a renewal that reached the store, its answer lost)."""
        try:
            r = self.s3.get_object(Bucket=self.bucket, Key=self.key)
        except self._error as e:
            if self._missing(e):
                return None
            raise
        holder = _parse(r["Body"].read())
        if holder.get("uuid") == self.lease.uuid:
            self.etag = r["ETag"]
        return holder

    def still_mine(self) -> dict[str, Any] | None:
        """After a refused renewal: None if the lease is still this driver's (or was gone and is
        taken again), else who holds it now."""
        holder = self.holder()
        if holder is None:
            return None if self._put(IfNoneMatch="*") else self.holder() or {}
        return None if holder.get("uuid") == self.lease.uuid else holder

    def release(self) -> None:
        with contextlib.suppress(Exception):
            r = self.s3.head_object(Bucket=self.bucket, Key=self.key)
            if r["ETag"] == self.etag:
                self.s3.delete_object(Bucket=self.bucket, Key=self.key)


@contextlib.contextmanager
def _hold_remote(paths: StudyPaths, lease: Lease) -> Iterator[None]:
    if not paths.root.startswith("s3://"):
        yield from _hold_advisory(paths, lease)
        return
    try:
        s3 = _S3Lease(paths, lease)
    except ImportError:  # no boto3: the advisory lease
        yield from _hold_advisory(paths, lease)
        return
    s3.acquire()
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(lease.ttl_s / 3):
            try:
                if not s3.renew() and (holder := s3.still_mine()) is not None:
                    _taken_over(s3, holder)
            except Exception:  # a storage hiccup: try again at the next period
                continue

    thread = threading.Thread(target=renew, name="ponder-study-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        s3.release()


def _taken_over(s3: _S3Lease, holder: dict[str, Any]) -> NoReturn:
    """Another driver holds the study now: this one went a whole TTL without renewing its lease
    (suspended with Ctrl-Z, a laptop asleep, cut off from the store), and a resume took it over.
    Two drivers writing one study's state would each undo the other's, so this one ends at once
    and writes nothing more, as a SIGKILL would end it: a stop every study survives."""
    print(
        f"{PROG}: error: study {s3.paths.name!r} was taken over by {_describe(holder)}, this driver's "
        f"lease having gone {s3.lease.ttl_s:.0f} s without renewal (suspended, asleep or cut off from the "
        "store); this driver stopped, writing nothing more",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_TAKEN_OVER)


def _hold_advisory(paths: StudyPaths, lease: Lease) -> Iterator[None]:
    holder = _parse(read_bytes(paths.lease))
    if holder:
        age = time.time() - float(holder.get("acquired_at") or 0)
        here = holder.get("host") == lease.host
        if (here and _alive_here(holder)) or (not here and age < float(holder.get("ttl_s") or LEASE_TTL_S)):
            raise _refusal(paths, holder, _then(paths, lease.command, stop="stop it"))
    write_bytes(paths.lease, lease.to_json())
    try:
        yield
    finally:
        fs, path = resolve(paths.lease)
        with contextlib.suppress(Exception):
            fs.delete_file(path)


@contextlib.contextmanager
def hold_lease(paths: StudyPaths, command: str, ttl_s: float = LEASE_TTL_S) -> Iterator[Lease]:
    """Hold the study's lease for the ``with`` block, or raise `LeaseHeld` at once."""
    lease = Lease.mine(command, ttl_s)
    holder = _hold_remote(paths, lease) if is_remote(paths.root) else _hold_local(paths, lease)
    with holder:
        yield lease


def driver_of(paths: StudyPaths) -> str | None:
    """Who drives the study now, as a refusal names them (`LeaseHeld`), or None: read from
    ``lease.json``, taking nothing. A holder on this host counts while its process runs; on an
    object store, one elsewhere while its lease was renewed within its TTL (by the file's time);
    on a disk another host mounts, one elsewhere while ``lease.json`` is there (its release
    deletes it)."""
    holder = _parse(read_bytes(paths.lease))
    if not holder:
        return None
    if holder.get("host") == socket.gethostname():
        return _describe(holder) if _alive_here(holder) else None
    if not is_remote(paths.root):
        return _describe(holder)
    fs, path = resolve(paths.lease)
    written = fs.get_file_info(path).mtime
    since = written.timestamp() if written is not None else float(holder.get("acquired_at") or 0)
    return _describe(holder) if time.time() - since < float(holder.get("ttl_s") or LEASE_TTL_S) else None
