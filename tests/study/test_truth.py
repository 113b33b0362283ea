"""A resume reads each of the study's records once (`study.records.truth`), and hands them on.

The unit tests build records by hand and count the reads; the last test counts a real
``resume --more 1`` of the smoke study with bench/resume_reads.py's counters: up to where Tune
queues the restored trials, each reader of a record is called once, so a step that reads a
record again fails here."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from study.records import asha_state, records, truth
from study.records.asha_state import write_state
from study.records.journal_copy import exists as journal_copy_exists
from study.records.records import EndRecord, write_end_record
from study.records.truth import read_truth
from study.storage.storage import StudyPaths, trial_reports, write_bytes
from tests.study.conftest import driver_env, smoke_source, trials

REPO = Path(__file__).resolve().parents[2]
NAME = "parity-smoke"


def _study(tmp_path: Path) -> StudyPaths:
    """A study with two end records, a trial ASHA stopped before end records existed (its stop
    in asha.json, its reports saved), and ASHA's state."""
    paths = StudyPaths(str(tmp_path), NAME)
    write_bytes(paths.spec, smoke_source().encode())
    for trial_id in ("a", "b"):
        write_end_record(paths, EndRecord(trial_id, "completed", 60, {"lambda_p": 0.5}, {"acc": 0.9}))
    write_state(
        paths.asha,
        {"version": 1, "brackets": [[[10, {"old": 0.4}]]], "stopped": ["old"], "assigned": {"old": 0}},
    )
    lines = [{"iteration": 10, "acc": 0.4, "config": {"lambda_p": 0.1}}, {"iteration": 20, "acc": 0.3}]
    write_bytes(
        trial_reports(paths.reports_dir, "old"), "".join(json.dumps(r) + "\n" for r in lines).encode()
    )
    return paths


def _count(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, calls: Counter[str]) -> None:
    original = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


def test_the_truth_reads_each_record_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _study(tmp_path)
    calls: Counter[str] = Counter()
    for module, name in ((truth, "read_state"), (records, "read_state"), (asha_state, "read_state")):
        _count(monkeypatch, module, name, calls)
    for module in (truth, records):
        _count(monkeypatch, module, "read_reports", calls)
    _count(monkeypatch, truth, "load_study_spec", calls)
    got = read_truth(NAME, str(tmp_path))
    assert calls == {"read_state": 1, "read_reports": 1, "load_study_spec": 1}
    assert got.spec.name == NAME and got.paths == paths
    assert set(got.ends) == {"a", "b", "old"}
    assert got.ends["old"].outcome == "early_stopped"  # from the stop in the state read once
    assert got.ends["old"].iteration == 20
    assert got.asha is not None and got.asha["stopped"] == ["old"]
    assert got.reports("old")[-1]["acc"] == 0.3
    assert calls["read_reports"] == 1  # read when the legacy record was built: not again
    assert got.reports("a") == [] and calls["read_reports"] == 2
    assert got.with_spec(got.spec.with_overrides(num_samples=9)).spec.search.num_samples == 9


def test_asha_takes_the_state_the_resume_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from study.search import scheduler
    from study.search.search import make_scheduler
    from study.spec.spec import parse_spec

    paths = _study(tmp_path)
    asha = make_scheduler(parse_spec(smoke_source(), NAME), paths)
    assert isinstance(asha, scheduler.PersistentASHA)
    rungs = [[m, {"old": 0.4} if i == 0 else {}] for i, (m, _) in enumerate(asha._brackets[0]._rungs)]
    asha.use_saved({"version": 1, "brackets": [rungs], "stopped": ["old"], "assigned": {"old": 0}})
    assert b"_given" not in pickle.dumps(asha)  # never saved with Tune's state

    def refuse(uri: str) -> None:
        raise AssertionError(f"{uri} read again")

    monkeypatch.setattr(scheduler, "read_state", refuse)
    asha._load()
    assert asha._stopped == {"old"} and asha._assigned == {"old": 0}
    assert asha._rungs_of("old") == {(0, rungs[0][0]): 0.4}


def test_the_searcher_takes_the_end_records_the_resume_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from study.search import search
    from study.spec.spec import parse_spec

    paths = _study(tmp_path)
    ends = read_truth(NAME, str(tmp_path)).ends
    limiter = search.make_searcher(parse_spec(smoke_source(), NAME), paths, ends=ends)
    assert isinstance(limiter, search.ConcurrencyLimiter)
    searcher = limiter.searcher
    assert isinstance(searcher, search.DivergenceAwareOptunaSearch)
    assert "_given_ends" not in searcher.__getstate__()  # never saved with Tune's state

    def refuse(paths: StudyPaths) -> None:
        raise AssertionError("end records read again")

    monkeypatch.setattr(search, "read_end_records", refuse)
    spec = parse_spec(smoke_source(), NAME)
    searcher.set_search_properties(spec.metric, spec.mode, search.param_space(spec))
    assert searcher._completed_trials == set(ends)
    assert "_given_ends" not in vars(searcher)  # used once


def test_a_study_and_its_journal_copy_exist_without_being_read(tmp_path: Path) -> None:
    paths = StudyPaths(str(tmp_path), NAME)
    assert not paths.exists()
    write_bytes(paths.spec, b"")
    assert paths.exists()
    copy = str(tmp_path / "optuna.journal")
    assert not journal_copy_exists(copy)
    write_bytes(f"{copy}.parts/0000000000000000", b"{}\n")
    assert journal_copy_exists(copy)


_COUNTING = """
import json, sys
sys.path.insert(0, sys.argv[1])
import resume_reads
import study.cli.drive, study.run.runner
from ray.tune.execution.tune_controller import TuneController
from study.cli.verbs import main

requeue, at_start = TuneController._requeue_restored_trials, {}

def counted(controller, trials, resume_config):
    requeue(controller, trials, resume_config)
    at_start.update(calls)

TuneController._requeue_restored_trials = counted
with resume_reads.counted_readers() as calls:
    code = main(sys.argv[2:])
print("COUNTS " + json.dumps({"start": at_start, "whole": calls}))
sys.exit(code)
"""


def test_a_resume_reads_each_record_once_before_any_trial_starts(
    smoke: tuple[Path, object], tmp_path: Path
) -> None:
    storage, _ = smoke
    copy = tmp_path / "copy"
    shutil.copytree(storage, copy)
    args = ["resume", NAME, "--more", "1", "--storage", str(copy), "--quiet"]
    done = subprocess.run(
        [sys.executable, "-c", _COUNTING, str(REPO / "bench"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=driver_env(args),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("COUNTS "))
    start = Counter(json.loads(line.removeprefix("COUNTS "))["start"])
    assert start, "Tune's restore never queued the trials: the resume did not restore"
    assert start["snapshot: read_truth"] == 1
    assert start["spec: load_study_spec"] == 1
    assert start["end records: read_end_records"] == 1
    assert start["ASHA state: read_state"] == 1
    assert start["journal (local, whole): JournalStorage.__init__"] == 1
    again = {k: n for k, n in start.items() if n != 1}  # one trial's record read apart counts too
    assert not again, f"read again before any trial started: {again}"
    assert len(trials(copy, NAME)) == 7
