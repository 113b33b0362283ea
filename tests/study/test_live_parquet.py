"""The Parquet while a study runs: the trials that end written together at a refresh, on a budget,
the Pareto marks kept current, the same rows as the whole export; Tune's trials added back from
their started records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from ray.tune.experiment import Trial

from study.records.records import EndRecord, write_end_record
from study.run import live_parquet
from study.run.export import write_tables
from study.run.live_parquet import BATCH_PREFIX, LiveParquet
from study.run.tune_state import merge_started_trials
from study.search.scheduler import record_started
from study.spec.spec import load_spec
from study.storage.storage import FRAGMENT_PREFIX, StudyPaths, parquet_state, trial_reports, write_bytes

SPEC = load_spec("parity-pareto")  # its front: halted accuracy against mean halting step


def _end(paths: StudyPaths, trial_id: str, acc: float, steps: float) -> Trial:
    """A trial that ended with ``acc`` and ``steps``: its saved reports and end record, as the
    scheduler leaves them before the callback runs; Tune's trial as a stub without a directory."""
    config = {"task": "parity", "lambda_p": 0.2, "iterations": 20}
    reports: list[dict[str, Any]] = []
    for i, outcome in ((10, "running"), (20, "completed")):
        reports.append(
            {
                "iteration": i,
                "outcome": outcome,
                "nan_events": 0,
                "time_total_s": float(i),
                "timestamp": 1_700_000_000 + i,
                **{f"{s}/halted_accuracy": acc for s in ("test", "easy", "hard")},
                **{f"{s}/mean_halting_step": steps for s in ("test", "easy", "hard")},
                "test/per_step_accuracy": [acc, acc],
            }
        )
    text = "".join(json.dumps(r) + "\n" for r in reports)
    write_bytes(trial_reports(paths.reports_dir, trial_id), text.encode())
    write_end_record(paths, EndRecord(trial_id, "completed", 20, config=config, last_result=reports[-1]))
    return Trial("fn", config=config, trial_id=trial_id, stub=True)


def _read(root: Path, kind: str) -> pd.DataFrame:
    df = pd.read_parquet(root / kind)
    keys = ["trial_id"] if kind == "trials" else ["trial_id", "report"]
    return df.sort_values(keys).reset_index(drop=True)


def _files(root: Path, kind: str) -> dict[str, int]:
    return {f.name: f.stat().st_mtime_ns for f in (root / kind / "study=live").glob("*.parquet")}


@pytest.mark.parametrize("compact_at", [1, live_parquet.COMPACT_AT], ids=["compacted", "left-as-batches"])
def test_trials_that_end_are_written_together_at_a_refresh_with_current_pareto_marks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compact_at: int
) -> None:
    monkeypatch.setattr(live_parquet, "COMPACT_AT", compact_at)
    spec = SPEC.with_overrides(name="live", storage=str(tmp_path))
    paths = StudyPaths(str(tmp_path), "live")
    live = LiveParquet(paths, spec, refresh_s=0)
    a, b = _end(paths, "a", 0.9, 5.0), _end(paths, "b", 0.95, 4.0)
    live.add(a)
    live.add(b)
    assert not (tmp_path / "trials").exists()  # kept, not written, until the refresh
    live.refresh()
    first = _files(tmp_path, "history")
    assert len(first) == 1 and next(iter(first)).startswith(BATCH_PREFIX)  # both trials, one file
    c = _end(paths, "c", 0.8, 2.0)
    live.add(c)
    live.refresh()
    after = _files(tmp_path, "history")
    assert {k: v for k, v in after.items() if k in first} == first  # an earlier batch is never rewritten
    assert len(after) == 2
    assert sorted(_files(tmp_path, "trials")) == ["trials.parquet"]  # the trials table, whole
    running = _read(tmp_path, "trials")
    # b beats a on both objectives: a is off the front; c, faster, is on it
    assert dict(zip(running["trial_id"], running["pareto"], strict=True)) == {
        "a": False,
        "b": True,
        "c": True,
    }
    assert (running["status"] == "completed").all()
    history = _read(tmp_path, "history")
    assert len(history) == 6 and history.groupby("trial_id")["report"].max().tolist() == [2, 2, 2]
    state = parquet_state(paths)
    assert state is not None and (state["trials"], state["final"]) == (3, False)

    assert live.finish([a, b, c])["completed"] == 3  # the end of the run
    assert parquet_state(paths)["final"] is True  # type: ignore[index]
    if compact_at == 1:  # more files than that: compacted into one
        assert sorted(_files(tmp_path, "history")) == ["history.parquet"]
    else:  # few: the batches as they were, never rewritten
        assert _files(tmp_path, "history") == after
    assert sorted(_files(tmp_path, "trials")) == ["trials.parquet"]
    pd.testing.assert_frame_equal(_read(tmp_path, "trials"), running)
    pd.testing.assert_frame_equal(_read(tmp_path, "history"), history)
    write_tables(paths, spec, [a, b, c])  # `ponder-study export`: the same rows from every record
    pd.testing.assert_frame_equal(_read(tmp_path, "trials"), running)
    pd.testing.assert_frame_equal(_read(tmp_path, "history"), history)


def test_a_refresh_waits_its_interval_and_its_share_of_the_driver_s_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = SPEC.with_overrides(name="live", storage=str(tmp_path))
    paths = StudyPaths(str(tmp_path), "live")
    now = [1000.0]
    monkeypatch.setattr(live_parquet.time, "monotonic", lambda: now[0])
    live = LiveParquet(paths, spec, refresh_s=10)
    assert not live.due()  # nothing kept
    live.add(_end(paths, "a", 0.9, 5.0))
    assert not live.due()  # kept, but the interval has not passed since the driver started
    now[0] += 10
    assert live.due()
    live.refresh()
    live.last_cost = 2.0  # a refresh that took 2 s: the next waits 2 / BUDGET_SHARE = 40 s
    live.add(_end(paths, "b", 0.95, 4.0))
    now[0] += 39
    assert not live.due()
    now[0] += 1
    assert live.due()


def test_a_run_s_end_adds_what_a_kill_kept_from_the_parquet_and_moves_an_errored_trial_once(
    tmp_path: Path,
) -> None:
    """A trial that ended before this driver and whose rows a kill lost is written from its end
    record; a trial that errored has its own fragments until it ends, and is never in two files."""
    spec = SPEC.with_overrides(name="live", storage=str(tmp_path))
    paths = StudyPaths(str(tmp_path), "live")
    _end(paths, "lost", 0.7, 3.0)  # its end record only: the driver was killed before a refresh
    errored = Trial("fn", config={"task": "parity", "lambda_p": 0.3}, trial_id="e", stub=True)
    errored.status = Trial.ERROR
    live = LiveParquet(paths, spec, refresh_s=0)
    live.add(errored)
    live.refresh()
    df = _read(tmp_path, "trials")
    assert dict(zip(df["trial_id"], df["status"], strict=True)) == {"e": "errored", "lost": "completed"}
    assert (tmp_path / "trials" / "study=live" / f"{FRAGMENT_PREFIX}e.parquet").exists()
    again = LiveParquet(paths, spec, refresh_s=0)  # the resume's driver: e runs again and ends
    ended = _end(paths, "e", 0.85, 2.5)
    again.add(ended)
    again.refresh()
    assert not (tmp_path / "trials" / "study=live" / f"{FRAGMENT_PREFIX}e.parquet").exists()
    df = _read(tmp_path, "trials")
    assert sorted(df["trial_id"]) == ["e", "lost"] and set(df["status"]) == {"completed"}
    assert sorted(_read(tmp_path, "history")["trial_id"].unique()) == ["e", "lost"]


def test_a_kill_between_a_refresh_s_two_writes_leaves_no_report_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refresh writes the reports, then the trials table: a driver killed in between leaves
    trials whose reports are in history and whose rows are not. The next driver writes their rows,
    and not their reports again."""
    spec = SPEC.with_overrides(name="live", storage=str(tmp_path))
    paths = StudyPaths(str(tmp_path), "live")
    write = live_parquet.write_study_table

    def killed(paths: StudyPaths, kind: str, table: object, file: str | None = None) -> None:
        if kind == "trials":
            raise KeyboardInterrupt  # the kill, after the history batch
        write(paths, kind, table, file=file)  # type: ignore[arg-type]

    monkeypatch.setattr(live_parquet, "write_study_table", killed)
    live = LiveParquet(paths, spec, refresh_s=0)
    live.add(_end(paths, "a", 0.9, 5.0))
    with pytest.raises(KeyboardInterrupt):
        live.refresh()
    monkeypatch.setattr(live_parquet, "write_study_table", write)
    assert len(_read(tmp_path, "history")) == 2 and not (tmp_path / "trials").exists()
    again = LiveParquet(paths, spec, refresh_s=0)  # the resume's driver
    again.finish([])
    assert _read(tmp_path, "trials")["trial_id"].tolist() == ["a"]
    assert _read(tmp_path, "history")["report"].tolist() == [1, 2]


def test_a_compacted_trial_pushed_off_the_front_by_a_later_driver_is_marked_off(tmp_path: Path) -> None:
    spec = SPEC.with_overrides(name="live", storage=str(tmp_path))
    paths = StudyPaths(str(tmp_path), "live")
    first = [_end(paths, "a", 0.9, 5.0)]
    write_tables(paths, spec, first)  # a driver's end: compacted, a on the front
    assert _read(tmp_path, "trials")["pareto"].tolist() == [True]
    live = LiveParquet(paths, spec, refresh_s=0)  # the next driver
    live.add(_end(paths, "b", 0.95, 4.0))
    live.refresh()
    df = _read(tmp_path, "trials")
    assert dict(zip(df["trial_id"], df["pareto"], strict=True)) == {"a": False, "b": True}


def test_a_resume_adds_the_trials_tune_s_saved_state_lacks(tmp_path: Path) -> None:
    paths = StudyPaths(str(tmp_path), "live")
    saved, later = (
        Trial("fn", config={"lambda_p": x}, trial_id=t, stub=True) for t, x in (("a", 0.1), ("b", 0.2))
    )
    state_file = Path(paths.experiment) / "experiment_state-2026.json"
    state_file.parent.mkdir(parents=True)
    state_file.write_text(json.dumps({"trial_data": [list(saved.get_json_state())], "runner_data": {}}))
    for trial in (saved, later):  # both started; Tune's last save holds only a
        record_started(paths, trial)
    assert merge_started_trials(paths) == 1
    data = json.loads(state_file.read_text())["trial_data"]
    restored = [json.loads(state) for state, _ in data]  # Tune's own JSON state of each trial
    assert [(t["trial_id"], t["config"]) for t in restored] == [
        ("a", {"lambda_p": 0.1}),
        ("b", {"lambda_p": 0.2}),
    ]
    assert merge_started_trials(paths) == 0  # already there


@pytest.mark.parametrize("kind", ["trials", "history"])
def test_a_kill_while_compacting_shows_each_trial_once_to_the_study_s_readers(
    tmp_path: Path, kind: str
) -> None:
    from study.storage.storage import read_study_table

    spec = SPEC.with_overrides(name="live", storage=str(tmp_path))
    paths = StudyPaths(str(tmp_path), "live")
    trial = Trial("fn", config={"task": "parity", "lambda_p": 0.3}, trial_id="a", stub=True)
    trial.status = Trial.ERROR
    live = LiveParquet(paths, spec, refresh_s=0)
    live.add(trial)
    live.refresh()  # an errored trial: its own fragments
    fragment = Path(paths.fragment(kind, "a")).read_bytes()
    write_tables(paths, spec, [_end(paths, "a", 0.9, 5.0)])  # it ended; compacted
    Path(paths.fragment(kind, "a")).write_bytes(fragment)  # killed before the fragment went
    table = read_study_table(paths, kind)
    assert table is not None and table.num_rows == (1 if kind == "trials" else 2)
