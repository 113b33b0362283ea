"""``status --watch``: every trial of a study as it runs, from what Tune has already written.

The Parquet is rewritten when a trial ends, so it shows nothing of a study of hour-long trials
for an hour. Tune appends each report to ``result.json`` in the trial's directory
(``<storage>/tune/<name>/<trial dir>/``) as it comes; the study writes one end record per trial
when it ends (`study.records.records`). This module reads both, without Ray and without any lock, and
draws one row per trial: running ones at their latest report, ended ones with how they ended.

A trial with a directory but no end record is shown ``running``, with how long ago it last
reported: a trial whose driver was stopped looks the same, but its last report grows old.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import pandas as pd
import pyarrow.fs as pafs

from study.records.asha_state import read_state
from study.records.records import END_OUTCOMES, read_end_records
from study.spec.spec import StudySpec
from study.storage.storage import StudyPaths, read_bytes, read_json, resolve

__all__ = ["DEFAULT_INTERVAL_S", "LiveTrial", "live_trials", "render", "watch"]

DEFAULT_INTERVAL_S = 2.0
"""How often ``status --watch`` redraws, in seconds."""

_TRIAL_DIR = re.compile(r"_([0-9a-f]{5,})_(\d+)_")
"""Tune's trial directory name: ``train_trial_<trial id>_<number>_<config...>_<date>``."""

_CLEAR = "\x1b[H\x1b[J"
"""ANSI: cursor home, clear to the end of the screen (a redraw in place)."""


@dataclass(frozen=True)
class LiveTrial:
    """One trial as its files show it now."""

    trial_id: str
    number: int
    status: str
    """``running``, ``errored`` (Tune wrote its error file) or how it ended (`END_OUTCOMES`)."""
    report: dict[str, Any]
    """Its latest report (empty before the first)."""
    config: dict[str, Any]

    @property
    def iteration(self) -> int | None:
        value = self.report.get("iteration")
        return int(value) if isinstance(value, (int, float)) else None


def _last_report(data: bytes) -> tuple[dict[str, Any], int]:
    """The last whole line of a ``result.json`` and how many reports it holds; a line being
    written is skipped."""
    lines = [line for line in data.split(b"\n") if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        try:
            report = json.loads(lines[i])
        except ValueError:
            continue
        if isinstance(report, dict):
            return report, i + 1
    return {}, 0


def live_trials(paths: StudyPaths) -> list[LiveTrial]:
    """Every trial that has a directory under Tune's experiment or an end record, by number."""
    ends = read_end_records(paths)
    fs, experiment = resolve(paths.experiment)
    found: dict[str, tuple[float, LiveTrial]] = {}
    for info in fs.get_file_info(pafs.FileSelector(experiment, allow_not_found=True)):
        if info.type != pafs.FileType.Directory:
            continue
        base = info.path.rstrip("/").rsplit("/", 1)[-1]
        match = _TRIAL_DIR.search(base)
        if match is None:
            continue
        trial_id, number = match.group(1), int(match.group(2))
        data = read_bytes(f"{paths.experiment}/{base}/result.json") or b""
        report, _ = _last_report(data)
        params = read_json(f"{paths.experiment}/{base}/params.json") or {}
        errored = fs.get_file_info(f"{info.path}/error.txt").type == pafs.FileType.File
        status = "errored" if errored else "running"
        stamp = float(report.get("timestamp") or 0)
        seen = found.get(trial_id)
        if seen is None or stamp >= seen[0]:  # a trial run again in a new directory: the latest
            found[trial_id] = (stamp, LiveTrial(trial_id, number, status, report, dict(params)))
    trials = {tid: t for tid, (_, t) in found.items()}
    for tid, end in ends.items():
        if end.outcome not in END_OUTCOMES:
            continue
        seen_trial = trials.get(tid)
        report = dict(end.last_result) or (seen_trial.report if seen_trial else {})
        number = seen_trial.number if seen_trial else 0
        config = dict(end.config) or (seen_trial.config if seen_trial else {})
        trials[tid] = LiveTrial(tid, number, end.outcome, report, config)
    return sorted(trials.values(), key=lambda t: (t.number, t.trial_id))


def _milestones(spec: StudySpec, paths: StudyPaths) -> list[float]:
    """ASHA's rungs in training iterations: from ``asha.json`` once written, else from the spec."""
    saved = read_state(paths.asha) or {}
    try:
        rungs = sorted({float(m) for bracket in saved["brackets"] for m, _ in bracket})
        if rungs:
            return rungs
    except (KeyError, TypeError, ValueError):
        pass
    s = spec.scheduler
    if s is None:
        return []
    rungs, m = [], float(s.grace_period)
    while m < spec.iterations:
        rungs.append(m)
        m *= s.reduction_factor
    return rungs


def _table(spec: StudySpec, trials: Sequence[LiveTrial], rungs: Sequence[float], now: float) -> pd.DataFrame:
    set_name = spec.metric.partition("/")[0]
    steps = f"{'test' if set_name == 'train' else set_name}/mean_halting_step"
    searched = [d.name for d in spec.space]
    rows = []
    for t in trials:
        row: dict[str, Any] = {"trial_id": t.trial_id, "status": t.status}
        row.update({name: t.config.get(name) for name in searched})
        row["iteration"] = t.iteration
        for metric, _ in spec.objectives:
            row[metric] = t.report.get(metric)
        row["nan_events"] = t.report.get("nan_events")
        row[steps] = t.report.get(steps)
        if rungs:
            reached = [r for r in rungs if t.iteration is not None and t.iteration >= r]
            row["rung"] = int(reached[-1]) if reached else None
        stamp = t.report.get("timestamp")
        row["last_report"] = (
            f"{max(0, now - float(stamp)):.0f} s ago"
            if t.status == "running" and isinstance(stamp, (int, float))
            else ""
        )
        rows.append(row)
    return pd.DataFrame(rows)


def render(spec: StudySpec, paths: StudyPaths, now: float | None = None, importance: str = "") -> str:
    """The study's trials now, as text: a header line, then one row per trial."""
    now = time.time() if now is None else now
    trials = live_trials(paths)
    if not trials:
        return f"study {paths.name}: no trial has started yet (nothing under {paths.experiment})"
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    header = f"study {paths.name}: {len(trials)} trials: " + ", ".join(f"{n} {s}" for s, n in counts.items())
    table = _table(spec, trials, _milestones(spec, paths), now)
    with pd.option_context(
        "display.width", 250, "display.max_columns", 30, "display.float_format", "{:.4g}".format
    ):
        body = table.to_string(index=False, na_rep="")
    lines = [header, body]
    if importance:
        lines.append(importance)
    return "\n".join(lines)


class _Importance:
    """The importance line, computed in the background whenever the number of ended trials
    changes (fANOVA and its imports take seconds: the table is not kept waiting for them)."""

    def __init__(self, spec: StudySpec, paths: StudyPaths) -> None:
        self.spec, self.paths = spec, paths
        self.text = ""
        self._ended: int | None = None
        self._worker: threading.Thread | None = None

    def line(self) -> str:
        from study.reports.importance import MIN_TRIALS

        ends = read_end_records(self.paths).values()
        ended = sum(1 for e in ends if e.outcome in ("completed", "early_stopped"))
        if ended < MIN_TRIALS:
            return f"importance: needs {MIN_TRIALS} ended trials, {ended} so far"
        if ended != self._ended and (self._worker is None or not self._worker.is_alive()):
            self._ended = ended
            self._worker = threading.Thread(target=self._compute, name="importance", daemon=True)
            self._worker.start()
        return self.text or "importance: computing"

    def _compute(self) -> None:
        from study.reports.importance import importances

        try:
            self.text = "\n".join(importances(self.spec, self.paths).lines())
        except Exception as e:  # a journal being rewritten, say: try again at the next end
            self.text, self._ended = f"importance: not read this time ({type(e).__name__}: {e})", None


def watch(
    spec: StudySpec,
    paths: StudyPaths,
    interval: float = DEFAULT_INTERVAL_S,
    out: TextIO | None = None,
    refreshes: int | None = None,
) -> int:
    """Redraw the study's trials every ``interval`` seconds until Ctrl-C (or ``refreshes``
    draws); returns 0. On a terminal the view is redrawn in place (plain ANSI); otherwise each
    refresh prints one snapshot, headed by its time."""
    out = sys.stdout if out is None else out
    tty = out.isatty()
    importance = _Importance(spec, paths)
    drawn = 0
    try:
        while refreshes is None or drawn < refreshes:
            text = render(spec, paths, importance=importance.line())
            stamp = time.strftime("%H:%M:%S")
            footer = f"{stamp}, every {interval:g} s; Ctrl-C to leave"
            if tty:
                out.write(f"{_CLEAR}{text}\n{footer}\n")
            else:
                out.write(f"-- {stamp}\n{text}\n\n")
            out.flush()
            drawn += 1
            if refreshes is None or drawn < refreshes:
                time.sleep(interval)
    except KeyboardInterrupt:
        if tty:
            out.write("\n")
        out.flush()
    return 0
