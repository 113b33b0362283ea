"""Which Tune trial holds which Optuna trial, rebuilt from the study's own truth at every resume.

Every Optuna trial carries the id of the Tune trial it was asked for (`TUNE_ID_ATTR`, the last
value written wins: a trial handed to a new Tune trial is re-tagged). With the end records this
is the truth; the searcher's pickled map, and Tune's saved trials, are caches that a kill can
leave older or newer than it. `map_trials` reads no pickle: given Optuna's trials, the Tune
trials that would run (``live``: no end record) and the end records, it decides for each:

- a live Tune trial named by an Optuna trial holds it (bound);
- a live Tune trial no Optuna trial names (its tag was lost, or it was superseded by a new Tune
  experiment) takes over the Optuna trial with its configuration that nobody else holds
  (adopted); if a live or ended trial already holds that configuration, it is a duplicate and
  is dropped (it must not run twice); if no Optuna trial has it, Optuna gets a new trial with
  that configuration (adopted into ``None``);
- a RUNNING Optuna trial whose Tune trial has an end record is told that end;
- a RUNNING Optuna trial that no Tune trial holds is an orphan: the next new Tune trial takes it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from study.records.records import EndRecord

__all__ = ["TUNE_ID_ATTR", "TrialMap", "map_trials", "same_params"]

TUNE_ID_ATTR = "tune_trial_id"
"""The user attribute of each Optuna trial naming the Tune trial it was asked for."""

RUNNING = optuna.trial.TrialState.RUNNING


@dataclass
class TrialMap:
    """The decisions of `map_trials`: Optuna trials are named by their ``number``."""

    held: dict[str, int] = field(default_factory=dict)
    """Tune id -> Optuna number, for every live or ended Tune trial an Optuna trial names."""
    adopt: dict[str, int | None] = field(default_factory=dict)
    """Live Tune id -> the Optuna trial it takes over (None: a new one with its configuration)."""
    drop: set[str] = field(default_factory=set)
    """Live Tune ids whose configuration another live or ended trial holds: never run."""
    tell: dict[int, str] = field(default_factory=dict)
    """RUNNING Optuna number -> the ended Tune trial whose end it has not been told."""
    orphans: list[int] = field(default_factory=list)
    """RUNNING Optuna numbers that no Tune trial holds, oldest first."""


def same_params(params: Mapping[str, Any], config: Mapping[str, Any], names: Iterable[str]) -> bool:
    """Whether a Tune config holds an Optuna trial's parameters (``names``: the searched ones)."""
    for name in names:
        if name not in params or name not in config:
            return False
        a, b = params[name], config[name]
        if isinstance(a, float) or isinstance(b, float):
            if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
                return False
            if not math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0):
                return False
        elif a != b:
            return False
    return True


def map_trials(
    frozen: Sequence[optuna.trial.FrozenTrial],
    live: Mapping[str, Mapping[str, Any]],
    ends: Mapping[str, EndRecord],
    names: Sequence[str],
) -> TrialMap:
    """Decide, before any trial runs, how Tune's trials and Optuna's line up (module docstring).

    ``live``: Tune id -> config of each Tune trial without an end record that Tune would run;
    ``names``: the searched parameters, which the configurations are compared on."""
    out = TrialMap()
    tagged: dict[str, int] = {}
    for t in frozen:  # a Tune id named by two Optuna trials (cannot happen) keeps the first
        tune_id = t.user_attrs.get(TUNE_ID_ATTR)
        if isinstance(tune_id, str):
            tagged.setdefault(tune_id, t.number)
    out.held = {tid: n for tid, n in tagged.items() if tid in live or tid in ends}
    by_number = {t.number: t for t in frozen}
    for tid, n in out.held.items():
        if tid in ends and by_number[n].state == RUNNING:
            out.tell[n] = tid
    claimed = set(out.held.values())
    for tid in sorted(set(ends) - set(out.held)):  # ended, its tag lost: it holds its configuration
        config = ends[tid].config
        held = [t for t in frozen if t.number not in claimed and same_params(t.params, config, names)]
        if held:
            claimed.add(held[0].number)
            if held[0].state == RUNNING:
                out.tell[held[0].number] = tid
    for tid in sorted(live):
        if tid in out.held:
            continue
        same = [t for t in frozen if same_params(t.params, live[tid], names)]
        free = [t for t in same if t.number not in claimed]
        free.sort(key=lambda t: (t.state != RUNNING, t.number))  # a RUNNING one first
        if free:
            out.adopt[tid] = free[0].number
            claimed.add(free[0].number)
        elif same:
            out.drop.add(tid)
        else:
            out.adopt[tid] = None
    out.orphans = sorted(t.number for t in frozen if t.state == RUNNING and t.number not in claimed)
    return out
