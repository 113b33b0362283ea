"""``status --watch``: every trial as it runs, read from what Tune has written, without Ray."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from study.cli import main
from study.records.records import EndRecord, write_end_record
from study.reports.live import live_trials, render, watch
from study.spec.spec import load_spec
from study.storage.storage import StudyPaths, write_bytes
from tests.study.conftest import CLI, REPO, Driver


def _trial_dir(paths: StudyPaths, trial_id: str, number: int, reports: list[dict[str, object]]) -> Path:
    """A trial directory as Tune lays it out: ``result.json`` one report a line, ``params.json``."""
    d = Path(paths.experiment) / f"train_trial_{trial_id}_{number}_beta=0.0100,lambda_p=0.3000_2026-01-01"
    d.mkdir(parents=True)
    config = {"lambda_p": 0.3, "beta": 0.01, "max_steps": 5, "seed": number}
    (d / "params.json").write_text(json.dumps(config))
    (d / "result.json").write_text("".join(json.dumps({**r, "config": config}) + "\n" for r in reports))
    return d


def _report(iteration: int, accuracy: float, nan_events: int = 0) -> dict[str, object]:
    return {
        "iteration": iteration,
        "test/halted_accuracy": accuracy,
        "test/mean_halting_step": 2.5,
        "nan_events": nan_events,
        "timestamp": time.time(),
    }


def test_running_ended_and_errored_trials_each_show_what_their_files_say(tmp_path: Path) -> None:
    spec = load_spec("parity-smoke")  # ASHA rungs at 10, 20, 40
    paths = StudyPaths(str(tmp_path), "live")
    write_bytes(paths.spec, (REPO / "study" / "spec" / "specs" / "parity-smoke.toml").read_bytes())
    running = _trial_dir(paths, "aaaa0001", 1, [_report(10, 0.6), _report(20, 0.7, nan_events=3)])
    with (running / "result.json").open("a") as f:
        f.write('{"iteration": 30, "test/halted')  # Tune in the middle of a line: not read yet
    _trial_dir(paths, "aaaa0002", 2, [_report(10, 0.5)])
    (_trial_dir(paths, "aaaa0003", 3, [_report(10, 0.55)]) / "error.txt").write_text("boom")
    last = {**_report(60, 0.9), "outcome": "completed"}
    write_end_record(paths, EndRecord("aaaa0002", "early_stopped", 10, {}, _report(10, 0.5)))
    write_end_record(paths, EndRecord("aaaa0004", "completed", 60, {"lambda_p": 0.2}, last))

    found = {t.trial_id: t for t in live_trials(paths)}
    assert {k: (t.status, t.iteration) for k, t in found.items()} == {
        "aaaa0001": ("running", 20),
        "aaaa0002": ("early_stopped", 10),
        "aaaa0003": ("errored", 10),
        "aaaa0004": ("completed", 60),
    }
    text = render(spec, paths)
    assert text.splitlines()[0] == "study live: 4 trials: 1 completed, 1 running, 1 early_stopped, 1 errored"
    header = text.splitlines()[1].split()
    row = next(line for line in text.splitlines() if line.startswith("aaaa0001")).split()
    shown = dict(zip(header, row, strict=False))
    assert shown["iteration"] == "20" and shown["nan_events"] == "3" and shown["rung"] == "20"
    assert shown["test/halted_accuracy"] == "0.7" and shown["test/mean_halting_step"] == "2.5"
    assert re.search(r"aaaa0001 .* \d+ s ago$", text, flags=re.M)

    out = io.StringIO()  # not a terminal: one snapshot per refresh, no escape codes
    assert watch(spec, paths, interval=0.01, out=out, refreshes=2) == 0
    assert out.getvalue().count("study live: 4 trials") == 2 and "\x1b[" not in out.getvalue()
    assert "importance: needs 6 ended trials, 2 so far" in out.getvalue()


def test_interval_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--watch", "--interval", "0"], ["--interval", "2"]):
        with pytest.raises(SystemExit) as stop:
            main(["status", "x", "--storage", str(tmp_path), *args])
        assert stop.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1


def _rows(text: str, status: str) -> list[dict[str, str]]:
    """The rows of the last snapshot in ``text`` with ``status``, as column -> value."""
    snapshot = text.rsplit("-- ", 1)[-1].splitlines()
    header = next((line.split() for line in snapshot if line.startswith("trial_id")), [])
    return [
        dict(zip(header, line.split(), strict=False))
        for line in snapshot
        if len(line.split()) > 1 and line.split()[1] == status
    ]


def test_watch_shows_a_running_trial_of_a_live_study_and_leaves_on_ctrl_c(
    driver: Callable[..., Driver], tmp_path: Path
) -> None:
    """A one-trial study whose trial would train for long runs in a driver; ``status --watch`` in
    another process lists it running at an iteration it reported, then leaves cleanly on SIGINT."""
    spec = tmp_path / "long.toml"
    source = (REPO / "study" / "spec" / "specs" / "parity-smoke.toml").read_text()
    spec.write_text(source.replace("iterations = 60", "iterations = 1000000"))
    storage = tmp_path / "st"
    d = driver("run", str(spec), "--num-samples", "1", "--storage", str(storage), "--quiet")
    experiment = storage / "tune" / "long"
    d.wait_until(lambda: any(p.stat().st_size > 0 for p in experiment.glob("*/result.json")), timeout=300)

    log = tmp_path / "watch.log"
    args = ["status", "long", "--storage", str(storage), "--watch", "--interval", "0.5"]
    with log.open("w") as out:
        watcher = subprocess.Popen([*CLI, *args], stdout=out, stderr=subprocess.PIPE, text=True, cwd=REPO)
        try:
            deadline = time.monotonic() + 120
            while not _rows(log.read_text(), "running") and time.monotonic() < deadline:
                assert watcher.poll() is None, log.read_text()[-2000:]
                time.sleep(0.3)
            (row,) = _rows(log.read_text(), "running")
            watcher.send_signal(signal.SIGINT)
            _, err = watcher.communicate(timeout=60)
        finally:
            if watcher.poll() is None:
                watcher.kill()
    assert watcher.returncode == 0 and "Traceback" not in err, err
    (result,) = experiment.glob("*/result.json")
    reported = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
    assert int(row["iteration"]) in {r["iteration"] for r in reported}
    rung = 10  # ASHA's rungs: 10, 20, 40, ... (grace period 10, reduction factor 2)
    while rung * 2 <= int(row["iteration"]):
        rung *= 2
    assert row["rung"] == str(rung)
    assert row["trial_id"] == reported[0]["trial_id"] and row["nan_events"] == "0"
    assert d.interrupt() == 130  # Ctrl-C: the driver stops the study, resumable
