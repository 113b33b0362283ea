"""ASHA's saved state: each change appended to a log, folded into asha.json by the next driver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ray.tune.schedulers import TrialScheduler

from study.records import asha_state
from study.records.asha_state import FOLD_EVERY, log_uri, parts_dir, read_state, save_changes, write_state
from study.records.records import EndRecord, has_ended, write_end_record
from study.search.scheduler import stopped_trials
from study.storage.storage import StudyPaths, read_bytes
from tests.study.conftest import S3
from tests.study.test_scheduler import _asha, _report, _trial


def _filled(state: Path | str, n: int) -> tuple[object, list[object]]:
    """A scheduler that saw ``n`` trials reach the first rung, each worse than the one before:
    those below the rung's cutoff stopped there."""
    s = _asha(state)
    trials = [_trial(f"t{i:04d}") for i in range(n)]
    for i, t in enumerate(trials):
        s.on_trial_add(None, t)  # type: ignore[arg-type]
        if _report(s, t, 10, 1 - i / n) == TrialScheduler.STOP:
            s.on_trial_complete(None, t, {"iteration": 10, "acc": 1 - i / n})  # type: ignore[arg-type]
    return s, trials


def test_changes_are_appended_and_read_back_as_the_schedulers_state(tmp_path: Path) -> None:
    state = tmp_path / "asha.json"
    s, _ = _filled(state, 40)
    whole = json.loads(state.read_text())
    assert whole["assigned"] == {} and whole["stopped"] == []  # written once, before any trial
    log = Path(log_uri(str(state))).read_text().splitlines()
    assert {json.loads(x)[0] for x in log} == {"assign", "rung", "stop"}
    assert read_state(str(state)) == s._state()  # type: ignore[attr-defined]
    assert stopped_trials(str(state)) == set(s._stopped) and s._stopped  # type: ignore[attr-defined]


def test_the_next_driver_folds_the_log_into_asha_json(tmp_path: Path) -> None:
    state = tmp_path / "asha.json"
    first, trials = _filled(state, 20)
    expected = first._state()  # type: ignore[attr-defined]
    second = _asha(state)
    second.on_trial_add(None, trials[0])  # type: ignore[arg-type]  # a resume re-adds its trials
    assert not Path(log_uri(str(state))).exists()
    assert json.loads(state.read_text()) == expected
    assert read_state(str(state)) == expected


def test_a_torn_last_line_is_skipped_and_a_change_twice_is_harmless(tmp_path: Path) -> None:
    state = tmp_path / "asha.json"
    s, _ = _filled(state, 10)
    expected = s._state()  # type: ignore[attr-defined]
    log = Path(log_uri(str(state)))
    lines = log.read_bytes()
    # a kill between folding and removing the log (every change applied twice), then a kill in
    # the middle of an append
    state.write_text(json.dumps(expected))
    log.write_bytes(lines + b'["stop","t00')
    assert read_state(str(state)) == expected


def test_a_change_costs_the_same_in_a_large_study_as_in_a_small_one(tmp_path: Path) -> None:
    """The driver's cost per trial must not grow with the study (issue 15): a change appends a
    line of its own size, and asha.json is not rewritten, whatever the number of trials."""
    appended = []
    for n in (10, 400):
        state = tmp_path / f"{n}" / "asha.json"
        state.parent.mkdir()
        s, _ = _filled(state, n)
        whole, log = state.stat(), Path(log_uri(str(state)))
        before = log.stat().st_size
        s.on_trial_add(None, _trial("new-one"))  # type: ignore[arg-type]
        appended.append(log.stat().st_size - before)
        assert state.stat().st_mtime_ns == whole.st_mtime_ns and state.stat().st_size == whole.st_size
    assert appended[0] == appended[1] < 100


def test_on_an_object_store_each_save_is_one_object_and_the_state_is_written_whole_every_64(
    s3: S3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 has no append: each save is one small object (here every change is a save of its own,
    `FLUSH_S` 0), read back with the whole state; every FOLD_EVERY saves the state is written
    whole and the objects go, so a save's cost does not grow with the study and a reader reads at
    most FOLD_EVERY of them."""
    monkeypatch.setattr(asha_state, "FLUSH_S", 0.0)
    state = f"{s3.bucket()}/studies/s/asha.json"
    s, _ = _filled(state, 40)  # about 100 saves: one fold in the middle
    parts = s3.files(parts_dir(state))
    assert 0 < len(parts) < FOLD_EVERY
    whole = json.loads(read_bytes(state) or b"{}")
    assert whole["assigned"] and len(whole["assigned"]) < 40  # folded once, mid-study
    assert read_state(state) == s._state()  # type: ignore[attr-defined]
    assert stopped_trials(state) == set(s._stopped) and s._stopped  # type: ignore[attr-defined]
    again = _asha(state)  # type: ignore[arg-type]  # the next driver folds what is left
    again.on_trial_add(None, _trial("t9999"))  # type: ignore[arg-type]
    assert json.loads(read_bytes(state) or b"{}")["stopped"] == sorted(s._stopped)  # type: ignore[attr-defined]
    assert len(s3.files(parts_dir(state))) == 1  # the new trial's assignment only


def test_on_an_object_store_the_changes_of_a_few_seconds_are_one_save(
    s3: S3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial's changes (its bracket, a rung value a report, its stop) and those of the trials
    beside it, made within `FLUSH_S` of the last save, are kept and saved with the next one: a
    few objects a second, whatever the number of trials; `flush` saves what is kept (a run's end)."""
    now = [100.0]
    monkeypatch.setattr(asha_state.time, "monotonic", lambda: now[0])
    state = f"{s3.bucket()}/studies/s/asha.json"
    s, _ = _filled(state, 20)  # dozens of changes within the same instant
    assert len(s3.files(parts_dir(state))) == 1  # the first change; the rest are kept
    now[0] += asha_state.FLUSH_S
    asha_state.flush(state)
    assert len(s3.files(parts_dir(state))) == 2
    assert read_state(state) == s._state()  # type: ignore[attr-defined]


def test_has_ended_reads_end_records_and_the_legacy_stops_in_asha_json_only(tmp_path: Path) -> None:
    """The trainable asks at every trial's start. A stop since end records exist has its end
    record written before the stop is saved, so the saved changes (a log, or on S3 up to
    FOLD_EVERY objects) are not read; a stop from before end records is in asha.json itself."""
    paths = StudyPaths(str(tmp_path), "s")
    write_state(paths.asha, {"version": 1, "brackets": [], "stopped": ["legacy"], "assigned": {}})
    write_end_record(paths, EndRecord(trial_id="ended", outcome="early_stopped"))
    save_changes(paths.asha, [["stop", "ended"], ["stop", "log-only"]], dict)
    assert has_ended(paths, "ended") and has_ended(paths, "legacy")
    assert not has_ended(paths, "fresh")
    assert not has_ended(paths, "log-only")  # cannot happen: its end record would come first
