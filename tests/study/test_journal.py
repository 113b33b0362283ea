"""The study's Optuna journal (`study.search.journal`): Optuna's format, read once, appended in
batches, synced at most once a second; what a kill before a flush costs."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from study.search import journal as journal_module
from study.search.journal import StudyJournal, flush_journals


def _study(path: Path) -> tuple[optuna.Study, StudyJournal]:
    backend = StudyJournal(str(path))
    study = optuna.create_study(study_name="s", storage=JournalStorage(backend), load_if_exists=True)
    return study, backend


def _trial(study: optuna.Study, value: float) -> None:
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    trial.report(value, 1)
    study.tell(trial, value)


def test_operations_are_written_in_one_append_a_flush_and_read_back_by_optuna_s_own_reader(
    tmp_path: Path,
) -> None:
    path = tmp_path / "optuna.journal"
    study, backend = _study(path)
    backend.flush()
    appends = backend.appends
    _trial(study, 0.25)  # create, a parameter, a report, a tell: four operations, kept
    assert backend.appends == appends
    written = path.stat().st_size
    backend.flush()
    assert backend.appends == appends + 1 and path.stat().st_size > written
    theirs = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))
    assert [(t.params, t.value, t.intermediate_values) for t in theirs.trials] == [
        ({"x": t.params["x"]}, 0.25, {1: 0.25}) for t in study.trials
    ]


def test_the_file_is_read_once_then_optuna_is_answered_from_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "optuna.journal"
    study, backend = _study(path)
    _trial(study, 0.5)
    backend.flush()
    opened: list[str] = []
    real_open = open

    def counted(file: object, *args: object, **kwargs: object) -> object:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", counted)
    _trial(study, 0.75)  # kept: nothing is read, nothing written
    assert str(path) not in opened
    assert [t.value for t in study.trials] == [0.5, 0.75]


def test_a_kill_loses_only_what_was_not_flushed_and_a_second_reader_sees_what_was(tmp_path: Path) -> None:
    path = tmp_path / "optuna.journal"
    study, _ = _study(path)
    _trial(study, 0.5)
    flush_journals()  # every journal of the process: its operations on the file
    _trial(study, 0.9)  # kept when the "kill" comes: never written
    reader, _ = _study(path)  # a resume's driver, reading the file
    assert [t.value for t in reader.trials] == [0.5]
    _trial(reader, 0.7)
    reader_backend = reader._storage._backend  # type: ignore[attr-defined]
    reader_backend.flush()
    again, _ = _study(path)
    assert [t.value for t in again.trials] == [0.5, 0.7]


def test_a_commit_syncs_at_most_once_a_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(journal_module.time, "monotonic", lambda: now[0])
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(journal_module.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    study, backend = _study(tmp_path / "optuna.journal")
    now[0] += 5
    for k in range(10):  # ten trials ending within half a second
        _trial(study, k / 10)
        backend.commit()
        now[0] += 0.05
    assert len(synced) == 1 and backend.syncs == 1 and backend.appends >= 10
    now[0] += 1
    _trial(study, 1.0)
    backend.commit()
    assert len(synced) == 2
    backend.commit(0.0)  # nothing new: nothing to sync
    assert len(synced) == 2


def test_a_pickled_journal_writes_what_it_kept_and_opens_again_where_it_was(tmp_path: Path) -> None:
    path = tmp_path / "optuna.journal"
    study, backend = _study(path)
    _trial(study, 0.5)
    copy = pickle.loads(pickle.dumps(backend))  # Tune saves the searcher's study with it
    assert isinstance(copy, StudyJournal)
    restored = optuna.load_study(study_name="s", storage=JournalStorage(copy))
    assert [t.value for t in restored.trials] == [0.5]


def test_a_line_being_written_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "optuna.journal"
    study, backend = _study(path)
    _trial(study, 0.5)
    backend.flush()
    with path.open("ab") as f:
        f.write(b'{"op_code": 4, "worker_id"')  # another writer's append, cut short
    reader, _ = _study(path)
    assert [t.value for t in reader.trials] == [0.5]


def test_a_journal_whose_study_was_deleted_does_not_stop_the_others_being_written(tmp_path: Path) -> None:
    """One process, two studies (a notebook, a test run): the first's folder deleted with
    operations still kept; flushing every journal writes the second's and forgets the first."""
    (tmp_path / "gone").mkdir()
    gone, gone_journal = _study(tmp_path / "gone" / "j")
    kept, _ = _study(tmp_path / "j")
    flush_journals()
    _trial(gone, 0.1)
    _trial(kept, 0.2)
    (tmp_path / "gone" / "j").unlink()
    (tmp_path / "gone").rmdir()
    flush_journals(commit=True)
    assert gone_journal not in journal_module._open
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "j")))
    reread = optuna.load_study(study_name="s", storage=storage)
    assert [t.value for t in reread.trials] == [0.2]


def test_the_number_of_trials_is_read_without_listing_them(tmp_path: Path) -> None:
    """`n_trials` (asking ahead checks it at every suggestion) agrees with Optuna's list."""
    study, _ = _study(tmp_path / "j")
    assert journal_module.n_trials(study) == 0
    for value in (0.1, 0.2):
        _trial(study, value)
    study.ask()
    assert journal_module.n_trials(study) == len(study.get_trials()) == 3


def test_the_trials_waiting_to_run_are_optuna_s_own_without_walking_the_study(tmp_path: Path) -> None:
    """Enqueued trials are popped in Optuna's order between asks that make new ones; the waiting
    list is Optuna's at every point, and the trials already past waiting are not read again."""
    from optuna.trial import TrialState

    from study.search.journal import StudyStorage

    storage = StudyStorage(StudyJournal(str(tmp_path / "j")))
    study = optuna.create_study(study_name="s", storage=storage)
    waiting = (TrialState.WAITING,)

    def optuna_s() -> list[int]:
        flush_journals()
        own = JournalStorage(JournalFileBackend(str(tmp_path / "j")))
        return [t.number for t in own.get_all_trials(study._study_id, states=waiting)]

    for x in (0.1, 0.2):
        _trial(study, x)
    for x in (0.3, 0.4, 0.5):
        study.enqueue_trial({"x": x})
    seen = []
    for _ in range(6):
        assert [t.number for t in storage.get_all_trials(study._study_id, states=waiting)] == optuna_s()
        trial = study.ask()
        seen.append(trial.suggest_float("x", 0.0, 1.0))
        study.tell(trial, 0.0)
    assert seen[:3] == [0.3, 0.4, 0.5] and optuna_s() == []
    assert storage._not_waiting[study._study_id] == 7  # as of the last ask: none walked again


def test_the_driver_s_own_storage_answers_after_its_run_unless_the_file_moved_on(tmp_path: Path) -> None:
    """`live_storage`: what follows a run (its orphans failed) uses the searcher's storage, read
    already, while it is in step with the file; another writer's append, or a file cut back
    (`repair_journal`), and the journal is read again."""
    from study.search.journal import StudyStorage, live_storage
    from study.storage.storage import StudyPaths

    paths = StudyPaths(str(tmp_path), "s")
    Path(paths.optuna_journal).parent.mkdir(parents=True)
    storage = StudyStorage(StudyJournal(paths.optuna_journal))
    study = optuna.create_study(study_name="s", storage=storage)
    _trial(study, 0.1)
    study.ask()  # kept in memory, not yet written: written before the answer
    assert live_storage(paths) is storage
    assert live_storage(StudyPaths(str(tmp_path), "other")) is None
    other, _ = _study(Path(paths.optuna_journal))  # a second writer appends a trial
    _trial(other, 0.2)
    flush_journals()
    assert live_storage(paths) is None
    assert len(study.get_trials()) == 3  # it reads the other's trial: in step again
    assert live_storage(paths) in (storage, other._storage)
    data = Path(paths.optuna_journal).read_bytes()
    Path(paths.optuna_journal).write_bytes(data[: data.rfind(b"\n", 0, len(data) - 1) + 1])
    assert live_storage(paths) is None
