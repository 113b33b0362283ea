"""Tune's saved state files on disk, read and tended before Tune restores a study.

Tune saves an experiment as ``tuner.pkl`` and, per driver session, ``experiment_state-<session>.json``
and two side files (`TUNE_STATE_SIDES`). Written in place, they can be torn by a kill or a full
disk (`restorable` sets a torn set aside for an older one); never removed, they pile up
(`prune_old_states`); saved every few seconds, they lag the trials started since
(`merge_started_trials`). A resume runs all three before Tune restores. Needs neither Ray nor
torch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pickle

import pyarrow.fs as pafs

from study.records.records import read_end_records
from study.storage.storage import StudyPaths, join, resolve, write_bytes

__all__ = [
    "EXPERIMENT_STATE_GLOB",
    "STATES_KEPT",
    "TUNE_STATE_SIDES",
    "merge_started_trials",
    "prune_old_states",
    "restorable",
]

log = logging.getLogger("ponder-study")


EXPERIMENT_STATE_GLOB = "experiment_state-*.json"
"""The name of the file that holds Tune's trials, one per driver session."""


TUNE_STATE_SIDES = (("search_gen_state", ".json"), ("searcher-state", ".pkl"))
"""The files Tune saves beside each ``experiment_state-<session>.json``."""


def _whole(fs: pafs.FileSystem, path: str) -> bool:
    """Whether one of Tune's state files is there and reads whole, holding what Tune's restore
    reads from it. Each of the three is needed: without the search generator's file Tune restores
    the trials but not the generator, which then has no experiment to make a new trial from
    (AttributeError at the first one); without the searcher's, Tune gives up restoring the run."""
    if fs.get_file_info(path).type != pafs.FileType.File:
        return False
    with fs.open_input_stream(path) as f:
        data = f.readall()
    name = path.rsplit("/", 1)[-1]
    if name.startswith("experiment_state-"):
        try:
            state = json.loads(data)
        except ValueError:
            return False
        return isinstance(state, dict) and isinstance(state.get("trial_data"), list)
    try:  # the search generator's and the searcher's files are pickles (whatever their suffix)
        state = pickle.loads(data)
    except Exception:  # a truncated pickle: EOFError, UnpicklingError, ...
        return False
    if name.startswith("search_gen_state-"):
        return isinstance(state, dict) and state.get("experiment") is not None
    return isinstance(state, dict)


def restorable(paths: StudyPaths, ended: bool | None = None) -> bool:
    """Whether Tune has a state to restore the study from; False if the driver was stopped before
    Tune saved one (the study then goes on in a new Tune experiment, its Optuna study and its
    ended trials' records kept: `study.run.runner._fit` asks Tune only for the trials still to run).

    Tune overwrites its state file in place, so a kill or a full disk can leave it torn; Tune
    would then "restart the experiment" over the study. A save is its three files, restored as a
    set: a newest set with any file torn or missing is set aside (renamed ``*.torn``) for an
    older whole one. ``ended``: whether any trial has an end record, when the caller has read
    them (`study.records.truth`); else they are read if a warning needs it."""

    def any_ended() -> bool:
        return bool(read_end_records(paths)) if ended is None else ended

    fs, directory = resolve(paths.experiment)
    tuner_file = f"{directory}/tuner.pkl"
    if fs.get_file_info(tuner_file).type != pafs.FileType.File:
        if any_ended():  # lost (a partial copy, a clean-up): nothing to set aside
            log.warning("Tune's tuner.pkl is missing: the study goes on in a new Tune experiment")
        return False
    if not _whole(fs, tuner_file):  # Tune rewrites it at every start, in place (ray#58179)
        log.warning(
            "Tune's tuner.pkl is torn (killed while written): the study goes on in a new Tune experiment"
        )
        fs.move(tuner_file, tuner_file + ".torn")
        return False
    selector = pafs.FileSelector(directory, allow_not_found=True)
    states = sorted(
        (
            i.path
            for i in fs.get_file_info(selector)
            if i.type == pafs.FileType.File
            and i.path.rsplit("/", 1)[-1].startswith("experiment_state-")
            and i.path.endswith(".json")
        ),
        reverse=True,
    )
    for state in states:
        # one save writes three files: the trials, the search generator, the searcher; a kill, a
        # full disk or a partial copy can tear or lose any of them, and Tune would restore what
        # it could
        session = state.rsplit("/", 1)[-1].removeprefix("experiment_state-").removesuffix(".json")
        files = [state, *(f"{directory}/{kind}-{session}{ext}" for kind, ext in TUNE_STATE_SIDES)]
        if all(_whole(fs, f) for f in files):
            return True
        log.warning("Tune's state of %s is torn or incomplete: trying an older one", session)
        for f in files:
            if fs.get_file_info(f).type == pafs.FileType.File:
                fs.move(f, f + ".torn")
    if states and any_ended():
        log.warning(
            "no whole saved state of Tune's is left: the study goes on in a new Tune experiment, its "
            "ended trials kept from their records"
        )
    return False


STATES_KEPT = 2
"""Tune's whole saved states a resume keeps: the one it restores and one older, in case that one
turns out torn later. Tune writes a new set per driver and never removes one, and each holds
every trial (about 70 KB a trial: 140 MB a resume at 2,000 trials)."""


def prune_old_states(paths: StudyPaths, keep: int = STATES_KEPT) -> int:
    """Remove all but the newest ``keep`` of Tune's saved states (each the three files of one
    driver's session); run after `restorable` has set torn ones aside. Returns how many went."""
    fs, directory = resolve(paths.experiment)
    infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    sessions = {i.base_name: _session(i.base_name) for i in infos if i.type == pafs.FileType.File}
    states = sorted((n for n in sessions if n.startswith("experiment_state-") and sessions[n]), reverse=True)
    kept = {sessions[n] for n in states[:keep]}
    for name, session in sessions.items():  # a side file whose trials' file is gone goes too
        if session is not None and session not in kept:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(f"{directory}/{name}")
    return len(states[keep:])


def _session(name: str) -> str | None:
    """The session of one of Tune's state files (``experiment_state-<session>.json``, ...)."""
    for kind, ext in (("experiment_state", ".json"), *TUNE_STATE_SIDES):
        if name.startswith(f"{kind}-") and name.endswith(ext):
            return name[len(kind) + 1 : -len(ext)]
    return None


def merge_started_trials(paths: StudyPaths) -> int:
    """Add to Tune's newest saved state every trial it lacks that has a started record
    (`study.search.scheduler.record_started`): Tune saves its whole state every few seconds, the
    scheduler one small record per trial before it starts, so after a kill these hold the
    trials that started since Tune's last save. Returns how many were added. Run after
    `restorable` (which sets torn states aside), before Tune restores."""
    fs, directory = resolve(paths.experiment)
    selector = pafs.FileSelector(directory, allow_not_found=True)
    states = sorted(
        (
            i.path
            for i in fs.get_file_info(selector)
            if i.type == pafs.FileType.File
            and i.base_name.startswith("experiment_state-")
            and i.base_name.endswith(".json")
        ),
        reverse=True,
    )
    records_fs, started = resolve(paths.started_dir)
    infos = records_fs.get_file_info(pafs.FileSelector(started, allow_not_found=True))
    names = [i.path for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".json")]
    if not states or not names:
        return 0
    with fs.open_input_stream(states[0]) as f:
        state = json.loads(f.readall())
    known = {json.loads(trial_json).get("trial_id") for trial_json, _ in state["trial_data"]}
    added = 0
    for name in sorted(names):
        with records_fs.open_input_stream(name) as f:
            try:
                record = json.loads(f.readall())
            except ValueError:  # written whole or not at all (create-if-absent); skip a stranger
                continue
        if record.get("trial_id") not in known:
            state["trial_data"].append(record["trial_data"])
            added += 1
    if added:
        write_bytes(join(paths.experiment, states[0].rsplit("/", 1)[-1]), json.dumps(state).encode())
        log.info("%d trials started after Tune's last save: added from their started records", added)
    return added
