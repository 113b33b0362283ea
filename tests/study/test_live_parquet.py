"""The Parquet while a study runs: one fragment per ended trial, the Pareto marks kept current,
the same rows as the whole export; Tune's trials added back from their started records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from ray.tune.experiment import Trial

from study.records.records import EndRecord, write_end_record
from study.run.export import LiveParquet, write_tables
from study.run.tune_state import merge_started_trials
from study.search.scheduler import record_started
from study.spec.spec import load_spec
from study.storage.storage import FRAGMENT_PREFIX, StudyPaths, trial_reports, write_bytes

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


def test_ended_trials_are_written_once_each_with_current_pareto_marks(tmp_path: Path) -> None:
    spec = SPEC.with_overrides(name="live", storage=str(tmp_path))
    paths = StudyPaths(str(tmp_path), "live")
    live = LiveParquet(paths, spec)
    trials = []
    for trial_id, acc, steps in (("a", 0.9, 5.0), ("b", 0.95, 4.0), ("c", 0.8, 2.0)):
        trials.append(_end(paths, trial_id, acc, steps))
        before = {
            f.name: f.stat().st_mtime_ns for f in (tmp_path / "history" / "study=live").glob("*.parquet")
        }
        live.trial_ended(trials[-1])
        after = {
            f.name: f.stat().st_mtime_ns for f in (tmp_path / "history" / "study=live").glob("*.parquet")
        }
        assert {k: v for k, v in after.items() if k in before} == before  # earlier trials untouched
        assert set(after) - set(before) == {f"{FRAGMENT_PREFIX}{trial_id}.parquet"}
    running = _read(tmp_path, "trials")
    # b beats a on both objectives: a left the front when b ended (its fragment was rewritten)
    assert dict(zip(running["trial_id"], running["pareto"], strict=True)) == {
        "a": False,
        "b": True,
        "c": True,
    }
    assert (running["status"] == "completed").all()
    history = _read(tmp_path, "history")
    assert len(history) == 6 and history.groupby("trial_id")["report"].max().tolist() == [2, 2, 2]

    write_tables(paths, spec, trials)  # the end of the run: compacted, the same rows
    files = sorted(f.name for f in (tmp_path / "trials" / "study=live").iterdir())
    assert files == ["trials.parquet"]
    pd.testing.assert_frame_equal(_read(tmp_path, "trials"), running)
    pd.testing.assert_frame_equal(_read(tmp_path, "history"), history)


def test_a_compacted_trial_pushed_off_the_front_by_a_later_driver_is_marked_off(tmp_path: Path) -> None:
    spec = SPEC.with_overrides(name="live", storage=str(tmp_path))
    paths = StudyPaths(str(tmp_path), "live")
    first = [_end(paths, "a", 0.9, 5.0)]
    write_tables(paths, spec, first)  # a driver's end: compacted, a on the front
    assert _read(tmp_path, "trials")["pareto"].tolist() == [True]
    LiveParquet(paths, spec).trial_ended(_end(paths, "b", 0.95, 4.0))  # the next driver
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
    trials = [_end(paths, "a", 0.9, 5.0)]
    LiveParquet(paths, spec).trial_ended(trials[0])
    fragment = Path(paths.fragment(kind, "a")).read_bytes()
    write_tables(paths, spec, trials)
    Path(paths.fragment(kind, "a")).write_bytes(fragment)  # killed before the fragment went
    table = read_study_table(paths, kind)
    assert table is not None and table.num_rows == (1 if kind == "trials" else 2)
