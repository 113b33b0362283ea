"""The study's Optuna journal as its driver keeps it: read once, written in few appends, synced
at most once a second.

Optuna's own `JournalFileBackend` is made for many writers: each operation (an ask, each of its
parameters, a report, a tell) takes a lock file, appends one line, syncs it to the disk, and is
then read back from the file, so a trial of three parameters and two reports cost its driver
about ten locks, ten syncs and ten reads. A study's journal has one writer, the driver that holds
the study's lease (`study.run.lease`), so `StudyJournal`:

- reads the file once, then answers Optuna from the operations it holds in memory (those it read
  and those it was given since);
- keeps the operations it is given and writes them in one append when `flush` is called: the
  searcher flushes as it hands Tune a trial (its ask) and as it ends one (its reports, its end);
- syncs the file to the disk in `commit`, at most once every `SYNC_S` seconds, at a trial's end.

What a stop may cost: a kill of the driver loses the operations not yet flushed, a crash of the
machine those not yet synced. Neither loses a trial: every ask is flushed before Tune can start
its trial, and every report and end is also in the trial's end record, which is synced before
Optuna hears of the end and is told to Optuna again by the resume (`study.search.trial_map`).

Readers in other processes read the file as Optuna does (a line cut short is not read). Another
writer while the driver runs is not supported: its operations would reach the file between this
driver's appends, unseen by it. Needs neither Ray nor torch.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Container, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend
from optuna.trial import FrozenTrial, TrialState

from study.storage.storage import StudyPaths

__all__ = [
    "FLUSH_EVERY",
    "SYNC_S",
    "StudyJournal",
    "StudyStorage",
    "clear_stale_journal_lock",
    "flush_journals",
    "journal_of",
    "live_storage",
    "n_trials",
    "optuna_storage",
    "repair_journal",
]

SYNC_S = 1.0
"""The longest a `commit` leaves the journal unsynced: a crash of the machine loses at most the
last second of operations, which the end records replay."""

FLUSH_EVERY = 256
"""Operations kept before they are written without waiting for `flush`."""

log = logging.getLogger(__name__)

_open: weakref.WeakSet[StudyJournal] = weakref.WeakSet()
_storages: weakref.WeakSet[StudyStorage] = weakref.WeakSet()


class StudyJournal(BaseJournalBackend):
    """A journal file with one writer: Optuna's journal format, read once, appended in batches."""

    def __init__(self, file_path: str) -> None:
        self._open(file_path)

    def _open(self, file_path: str) -> None:
        self._path = file_path
        self._lock = threading.Lock()
        self._logs: list[dict[str, Any]] | None = None  # every operation, read or given
        self._size = 0  # bytes of the file the operations above hold
        self._pending: list[bytes] = []  # lines given, not yet written
        self._unsynced = False
        self._synced_at = time.monotonic()
        self.appends = 0  # writes to the file, and syncs of it: what a trial costs the disk
        self.syncs = 0
        if not os.path.exists(file_path):
            open(file_path, "ab").close()
        _open.add(self)

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles the searcher's study with it
        self.flush()
        return {"_path": self._path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._open(state["_path"])

    # -- Optuna's backend ------------------------------------------------------------------------
    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        with self._lock:
            if self._logs is None:
                self._logs = []
                self._read_new()
            elif not self._pending:  # in step with the file: what others appended is read
                self._read_new()
            logs = self._logs[log_number_from:]
        yield from logs

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        with self._lock:
            if self._logs is None:
                self._logs = []
                self._read_new()
            for log in logs:
                self._logs.append(log)
                self._pending.append(json.dumps(log, separators=(",", ":")).encode() + b"\n")
            if len(self._pending) >= FLUSH_EVERY:
                self._write()

    # -- the study's -----------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the operations kept so far, in one append (not synced: see `commit`)."""
        with self._lock:
            self._write()

    def commit(self, max_age_s: float = SYNC_S) -> None:
        """`flush`, then sync the file to the disk if it was last synced ``max_age_s`` ago or more
        (0: now)."""
        with self._lock:
            self._write()
            if self._unsynced and time.monotonic() - self._synced_at >= max_age_s:
                fd = os.open(self._path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self._unsynced, self._synced_at = False, time.monotonic()
                self.syncs += 1

    def _write(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        self._pending.clear()
        self._size += len(data)
        self._unsynced = True
        self.appends += 1

    def _read_new(self) -> None:
        """Read the whole lines the file holds past what is known (a line cut short: not yet)."""
        assert self._logs is not None
        if os.stat(self._path).st_size <= self._size:
            return  # nothing new: the usual case, one stat
        with open(self._path, "rb") as f:
            f.seek(self._size)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]
        for line in whole.splitlines():
            if line.strip():
                self._logs.append(json.loads(line))
        self._size += len(whole)


class StudyStorage(JournalStorage):
    """Optuna's journal storage that finds the trials waiting to run without walking the study:
    Optuna looks for them at every ask (the trials a warm start enqueued), which walked every
    trial of the study (2 ms of each ask at 10,000 trials, more than the random sampler's own)."""

    def __init__(self, backend: BaseJournalBackend) -> None:
        super().__init__(backend)
        self._not_waiting: dict[int, int] = {}  # study id -> trials before it are past WAITING
        _storages.add(self)

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        self._not_waiting = {}
        _storages.add(self)

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        if not isinstance(states, tuple) or states != (TrialState.WAITING,):
            return super().get_all_trials(study_id, deepcopy, states)
        with self._thread_lock:
            self._sync_with_backend()
            replay = self._replay_result
            ids = replay._study_id_to_trial_ids.get(study_id)
            if ids is None:  # Optuna's own error for an unknown study
                return super().get_all_trials(study_id, deepcopy, states)
            # a trial is created WAITING (enqueued) or RUNNING and never becomes WAITING again: the
            # leading trials past it are skipped for good
            start = self._not_waiting.get(study_id, 0)
            while start < len(ids) and replay._trials[ids[start]].state != TrialState.WAITING:
                start += 1
            self._not_waiting[study_id] = start
            waiting = [replay._trials[i] for i in ids[start:]]
            waiting = [t for t in waiting if t.state == TrialState.WAITING]
        return copy.deepcopy(waiting) if deepcopy else waiting


def flush_journals(commit: bool = False) -> None:
    """Write what every journal of this process keeps (and with ``commit``, sync them now): before
    another reader of the file in this process, and as a driver's run ends."""
    for journal in list(_open):
        try:
            journal.commit(0.0) if commit else journal.flush()
        except FileNotFoundError:  # its study's folder was deleted: nothing left to write it to
            log.warning("the Optuna journal %s is gone; its last operations are dropped", journal._path)
            _open.discard(journal)


def repair_journal(journal: str) -> int:
    """Cut a journal back to its last whole operation; returns the bytes removed (0 if whole).

    Optuna appends one JSON line per operation. A driver stopped by a full disk (or killed in
    the middle of a write) leaves a torn last line, and every later read fails on it once
    anything follows. The torn operation never took effect, so cutting it is safe; the study's
    records replay what it was (`study.run.replay`). The cut bytes are kept
    beside the journal (``optuna.journal.torn``)."""
    path = Path(journal)
    if not path.exists():
        return 0
    data = path.read_bytes()
    good = 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            json.loads(line)
        except ValueError:
            break
        good += len(line)
    if good == len(data):
        return 0
    path.with_name(path.name + ".torn").write_bytes(data[good:])
    with path.open("r+b") as f:
        f.truncate(good)
        f.flush()
        os.fsync(f.fileno())
    return len(data) - good


def clear_stale_journal_lock(journal: str) -> bool:
    """Remove the lock a killed driver left beside the journal; True if there was one.

    Only the driver holding the study's lease appends to the journal, so under the lease any
    lock is stale. Left alone it costs the next driver Optuna's 30 s grace period, and one copied
    from another folder (a symlink to the old journal) makes Optuna's lock wait spin for ever."""
    lock = journal + ".lock"
    if not os.path.lexists(lock):
        return False
    os.unlink(lock)
    return True


def optuna_storage(paths: StudyPaths) -> StudyStorage:
    """The study's Optuna storage: a journal file beside the results (optuna-dashboard opens it),
    written by the driver that holds the study's lease alone (`study.search.journal`)."""
    journal = Path(paths.optuna_journal)
    journal.parent.mkdir(parents=True, exist_ok=True)
    return StudyStorage(StudyJournal(str(journal)))


def live_storage(paths: StudyPaths) -> StudyStorage | None:
    """A storage of this process that holds the study's journal in memory and in step with its
    file (its operations written, none since by another writer), or None: the driver's own, so
    that what follows its run (`study.run.runner.fail_orphaned_optuna_trials`) does not read the
    whole journal again (3 s at 10,000 trials)."""
    path = os.path.abspath(paths.optuna_journal)
    for storage in list(_storages):
        journal = journal_of(storage)
        if journal is None or os.path.abspath(journal._path) != path:
            continue
        journal.flush()
        with journal._lock:
            if journal._logs is not None and os.path.exists(path) and os.stat(path).st_size == journal._size:
                return storage
    return None


def journal_of(storage: Any) -> StudyJournal | None:
    """The `StudyJournal` behind an Optuna storage, if it is one."""
    backend = getattr(storage, "_backend", None)
    return backend if isinstance(backend, StudyJournal) else None


def n_trials(study: optuna.Study) -> int:
    """How many trials the study holds, any state: read from the journal's replay where it keeps
    them (O(1), where `get_trials` builds a list of the whole study for each call)."""
    storage = study._storage
    replay = getattr(storage, "_replay_result", None)
    ids = getattr(replay, "_study_id_to_trial_ids", {}).get(study._study_id)
    if isinstance(storage, JournalStorage) and ids is not None:
        with storage._thread_lock:
            storage._sync_with_backend()
            return len(ids)
    return len(study.get_trials(deepcopy=False))
