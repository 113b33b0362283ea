"""ASHA whose rungs survive a restart.

Ray rebuilds the scheduler with empty rungs when a study is restored (ray#30838), so after a
resume new trials would be judged against nothing and a trial ASHA had stopped could run on.
`PersistentASHA` saves its rungs, its bracket assignments and the trials it stopped whenever they
change (``asha.json`` and the changes appended since, `study.records.asha_state`), and reads them back
when the restored study adds its trials.

A stop is recorded once Tune has logged the report ASHA stopped the trial on, in the trial's end
record with its reports (`on_trial_complete`), never before: a resume never trains a stopped
trial again, so its reports must outlive a driver killed at that moment.

Both schedulers a study uses (`PersistentASHA`, or `SnapshotBeforeStart` itself, first in first
out, without early stopping) do two things for the study's records, because Tune tells the
scheduler of a trial's end before the searcher and the callbacks, and asks it before trials
start:

- the end of a trial is written first of all, as its end record (`study.records.records`), which
  holds its reports and its state in ASHA: the one write of the end synced to the disk;
- before any trial Tune has not saved can start, its state as Tune would save it is written to
  the study (``studies/<name>/started/<trial_id>.json``, one small file per trial): a resume adds
  the trials Tune's saved state lacks from these (`study.run.tune_state.merge_started_trials`). Tune's
  own whole save (every trial, the searcher) is forced once per driver, before its first trial
  starts, not before each: its cost grows with the study (bench/driver_scale.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, TrialScheduler

from study.records.asha_state import STATE_VERSION, Change, fold_log, read_state, save_changes
from study.records.records import EndRecord, relative_to_root, write_end_record
from study.search import ray_private
from study.storage.storage import StudyPaths, create_bytes

if TYPE_CHECKING:
    from ray.tune.execution.tune_controller import TuneController

__all__ = ["PersistentASHA", "SnapshotBeforeStart", "record_started", "staged_reports", "stopped_trials"]


def stopped_trials(state_uri: str) -> set[str]:
    """Ids of the trials ASHA stopped, as recorded in ``asha.json`` and its log (empty if none)."""
    state = read_state(state_uri)
    return set(state["stopped"]) if state else set()


def _nest_config(flat: dict[str, Any]) -> dict[str, Any]:
    """Tune's flat result (``config/lambda_p``) with its config nested again; metric names keep
    their slashes (``test/halted_accuracy`` is one key)."""
    out = {k: v for k, v in flat.items() if not k.startswith("config/")}
    out["config"] = {k.removeprefix("config/"): v for k, v in flat.items() if k.startswith("config/")}
    return out


def _outcome(trial: Trial, result: dict[str, Any] | None, stopped: bool) -> str:
    if stopped:
        return "early_stopped"
    last = result or trial.last_result or {}
    return "diverged" if last.get("outcome") == "diverged" else "completed"


def record_started(paths: StudyPaths, trial: Trial) -> None:
    """Write the trial's state as Tune saves it in its experiment state (the pair of its JSON
    state and its run metadata), create-if-absent: the first, taken before it ever started, is
    the one a resume needs (Tune's restore starts it again from its saved checkpoint, if any).
    Not synced to the disk: a crash that loses it costs what a kill before it costs (Optuna's
    trial, asked for it, goes to the next new trial), and it is a write at every trial's start."""
    state, metadata = trial.get_json_state()
    create_bytes(
        paths.started_record(trial.trial_id),
        json.dumps({"trial_id": trial.trial_id, "trial_data": [state, metadata]}).encode(),
        durable=False,
    )


def staged_reports(trial: Trial) -> bytes:
    """The trial's reports as Tune's JSON logger wrote them in the driver's staging directory
    (``result.json``, one JSON object a line: current, where the storage's copy lags); empty
    for a trial without a directory or reports (a restored trial that had ended)."""
    try:
        local_dir = trial.local_path
    except (AttributeError, RuntimeError):  # Tune's trial without a directory yet
        return b""
    if not local_dir:
        return b""
    try:
        return Path(local_dir, "result.json").read_bytes()
    except OSError:
        return b""


class _InFlight:
    """Tune's trials not yet ended, in Tune's order, and those not yet saved, kept from
    ``on_trial_add`` so that a choice costs the trials in flight, not the whole study. Never
    pickled (Ray's ASHA saves its ``__dict__``): a restored scheduler reads them again."""

    def __init__(self) -> None:
        self.open: dict[str, Trial] = {}
        self.unsaved: dict[str, Trial] = {}
        self.seeded = False  # the controller's trials read once in this driver

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


class SnapshotBeforeStart(FIFOScheduler):
    """Tune's first-in-first-out scheduler that writes each trial's end record the moment it ends
    and, before any trial Tune's saved state lacks can start, that trial's own state as Tune
    saves it (its started record): as it is, the scheduler of a study without early stopping.

    Tune saves its state (the trials it knows, the searcher's) every 10 s or more. A trial
    created between two saves would be unknown to a resume after a SIGKILL, which would ask
    Optuna for a new trial in its place. Tune starts trials in two ways each step, the one this
    scheduler chooses and then every other pending one, both after the searcher added new
    trials; so the records are written here whenever Tune holds a trial not yet recorded,
    before either can start. The first time in a driver, Tune's whole state is saved instead
    (so that a resume has a state to add the started records to); after that, one small file per
    new trial, whatever the study's size.
    """

    def __init__(self, *args: Any, paths: StudyPaths | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]  # Ray: untyped
        self.paths = paths
        self._forget_trials()

    def __setstate__(self, state: dict[str, Any]) -> None:  # restored: Tune saves again first
        self.__dict__.update(state)
        self._forget_trials()

    def _forget_trials(self) -> None:
        self._saved_trials: set[str] = set()  # trial ids Tune's saved state holds
        self._in_flight = _InFlight()

    def on_trial_add(self, tune_controller: TuneController, trial: Trial) -> None:
        super().on_trial_add(tune_controller, trial)
        self._track(trial)

    def _track(self, trial: Trial) -> None:
        flight = self._in_flight
        flight.open.pop(trial.trial_id, None)  # an errored trial Tune requeues goes to the end
        flight.open[trial.trial_id] = trial
        if trial.trial_id not in self._saved_trials:
            flight.unsaved[trial.trial_id] = trial

    def choose_trial_to_run(self, tune_controller: TuneController) -> Trial | None:
        # Schedulers get a wrapper that warns on controller calls outside its allow-list;
        # `checkpoint` is the controller's own save, forced past its period and awaited.
        controller = ray_private.controller_of(tune_controller)
        flight = self._in_flight
        if not flight.seeded:  # trials Tune held before this scheduler saw them added, in its order
            flight.seeded = True
            flight.open.clear()
            for trial in controller.get_trials():
                self._track(trial)
        new = list(flight.unsaved.values())
        flight.unsaved.clear()
        if new and self.paths is not None:
            for trial in new:
                record_started(self.paths, trial)
        if new and not self._saved_trials:  # the driver's first: Tune's whole state, once
            controller.checkpoint(force=True, wait=True)
        self._saved_trials.update(t.trial_id for t in new)
        return self._first_waiting()

    def _first_waiting(self) -> Trial | None:
        """Tune's FIFO choice (the first pending trial, else the first paused one) over the trials
        not yet ended: Tune's own walks every trial of the study at every choice."""
        open_ = self._in_flight.open
        for ended in [i for i, t in open_.items() if t.status in (Trial.TERMINATED, Trial.ERROR)]:
            del open_[ended]
        for status in (Trial.PENDING, Trial.PAUSED):
            for trial in open_.values():
                if trial.status == status:
                    return trial
        return None

    def on_trial_complete(
        self, tune_controller: TuneController, trial: Trial, result: dict[str, Any]
    ) -> None:
        self._record_end(trial, result, stopped=False)
        super().on_trial_complete(tune_controller, trial, result)

    def _record_end(self, trial: Trial, result: dict[str, Any] | None, stopped: bool) -> None:
        """The trial's end record with its reports and its state in ASHA (create-if-absent: a
        restored trial that had ended keeps its first record)."""
        if self.paths is None:
            return
        # Tune's own last result (nested, as its table reads it); schedulers are handed a flat copy
        last = dict(trial.last_result or {}) or _nest_config(result or {})
        checkpoint = trial.checkpoint
        write_end_record(
            self.paths,
            EndRecord(
                trial_id=trial.trial_id,
                outcome=_outcome(trial, last, stopped),
                iteration=int(last.get("iteration") or 0),
                config=dict(trial.config),
                last_result=last,
                checkpoint=relative_to_root(
                    self.paths.root_fs_path, checkpoint.path if checkpoint is not None else None
                ),
                asha=self._asha_of(trial.trial_id, stopped),
            ),
            staged_reports(trial),
        )

    def _asha_of(self, trial_id: str, stopped: bool) -> list[Change]:
        """The trial's state in ASHA, as changes a resume can replay (none without early stopping)."""
        return []


class PersistentASHA(SnapshotBeforeStart, AsyncHyperBandScheduler):
    """`AsyncHyperBandScheduler` that keeps its state in ``state_uri`` across restarts.

    ``time_attr`` is the training iteration the trainer reports (``iteration``), so the grace
    period and the budget are in gradient steps, not in reports.

    It takes Ray's arguments, with Ray's defaults (tests/study/test_ray_contract.py runs Ray's
    ASHA tests on it), and where to keep its state: ``state_uri`` or the study's ``paths``. Where
    it differs on purpose: a trial it stopped stays stopped (a later report of it is answered
    STOP, also after a restart), and with ``paths`` each trial's end is recorded in the study.
    """

    def __init__(
        self, *args: Any, state_uri: str | None = None, paths: StudyPaths | None = None, **kwargs: Any
    ) -> None:
        """Ray's arguments, positional ones included, and where the state is kept: ``state_uri``,
        by default the study's ``asha.json`` (``paths``)."""
        if state_uri is None:
            if paths is None:
                raise TypeError(f"{type(self).__name__} needs state_uri or paths: where its rungs are kept")
            state_uri = paths.asha
        super().__init__(*args, paths=paths, **kwargs)
        ray_private.sorted_cutoffs(self)  # a report's cutoff without an array of the whole rung
        self._state_uri = state_uri
        self._stopped: set[str] = set()
        self._stopping: set[str] = set()  # stopped, not yet recorded (see on_trial_complete)
        self._unsaved: dict[str, list[Change]] = {}  # the rung values of those stops
        self._assigned: dict[str, int] = {}  # trial id -> bracket index
        self._loaded = False

    def __getstate__(self) -> dict[str, Any]:  # a state handed by `use_saved` is never pickled
        return {k: v for k, v in self.__dict__.items() if k != "_given"}

    def __setstate__(self, state: dict[str, Any]) -> None:  # a study saved before the log
        super().__setstate__(state)
        self.__dict__.setdefault("_unsaved", {})
        ray_private.sorted_cutoffs(self)  # a study saved before the sorted cutoffs

    def rebind(self, paths: StudyPaths) -> None:
        """Point at the study where it is now (Tune restores the scheduler with its old paths)."""
        self.paths, self._state_uri = paths, paths.asha

    def use_saved(self, state: Mapping[str, Any] | None) -> None:
        """Take ``state``, the saved state a resume already read (`study.records.truth`), when
        the rungs are loaded, in place of reading it again (None: there was none)."""
        self._given = (state,)

    # -- persistence ----------------------------------------------------------------------------
    def _load(self) -> None:
        """Read the saved rungs once (or take those `use_saved` gave), before the first trial is
        (re-)added; then write them whole (the log folded in), so this driver's changes are
        appended to a fresh log."""
        self._loaded = True
        given = self.__dict__.pop("_given", None)
        state = given[0] if given is not None else read_state(self._state_uri)
        if state:
            for bracket, saved in zip(self._brackets, state["brackets"], strict=True):
                milestones = [m for m, _ in bracket._rungs]
                if milestones != [m for m, _ in saved]:
                    raise ValueError(
                        f"{self._state_uri} holds rungs at {[m for m, _ in saved]}, this scheduler "
                        f"has {milestones}: the study's ASHA settings changed since it started"
                    )
                for (_, recorded), (_, values) in zip(bracket._rungs, saved, strict=True):
                    recorded.update(values)
            self._stopped = set(state["stopped"])
            self._assigned = dict(state["assigned"])
        fold_log(self._state_uri, self._state())

    def _state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "brackets": [[[m, dict(r)] for m, r in b._rungs] for b in self._brackets],
            "stopped": sorted(self._stopped),
            "assigned": self._assigned,
        }

    def _save(self, changes: list[Change]) -> None:
        """One change or a few, appended (`study.records.asha_state`): a cost per trial that does not
        grow with the study, where rewriting the whole state did."""
        save_changes(self._state_uri, changes, self._state)

    def _rungs_of(self, trial_id: str) -> dict[tuple[int, float], float]:
        """The trial's values in the rungs: (bracket, milestone) -> value."""
        return {
            (i, m): r[trial_id] for i, b in enumerate(self._brackets) for m, r in b._rungs if trial_id in r
        }

    def _rung_changes(self, trial_id: str, before: dict[tuple[int, float], float]) -> list[Change]:
        return [
            ["rung", i, m, trial_id, v]
            for (i, m), v in self._rungs_of(trial_id).items()
            if (i, m) not in before
        ]

    # -- scheduler hooks ------------------------------------------------------------------------
    def on_trial_add(self, tune_controller: TuneController, trial: Trial) -> None:
        if not self._loaded:
            self._load()
        if trial.trial_id in self._assigned:  # a restored trial keeps its bracket
            super().on_trial_add(tune_controller, trial)
            self._trial_info[trial.trial_id] = self._brackets[self._assigned[trial.trial_id]]
            return
        super().on_trial_add(tune_controller, trial)
        self._assigned[trial.trial_id] = bracket = self._brackets.index(self._trial_info[trial.trial_id])
        self._save([["assign", trial.trial_id, bracket]])

    def on_trial_result(self, tune_controller: TuneController, trial: Trial, result: dict[str, Any]) -> str:
        if trial.trial_id in self._stopped or trial.trial_id in self._stopping:
            return str(TrialScheduler.STOP)
        before = self._rungs_of(trial.trial_id)
        action = str(super().on_trial_result(tune_controller, trial, result))
        if action == TrialScheduler.STOP and result.get(self._time_attr, 0) < self._max_t:
            # Tune logs this report after this call: the stop is saved in on_trial_complete,
            # with the rung value it was stopped on (a resume before then judges that report again)
            self._stopping.add(trial.trial_id)
            self._unsaved[trial.trial_id] = self._rung_changes(trial.trial_id, before)
        else:
            self._save(self._rung_changes(trial.trial_id, before))
        return action

    def on_trial_complete(
        self, tune_controller: TuneController, trial: Trial, result: dict[str, Any]
    ) -> None:
        stopping = trial.trial_id in self._stopping
        before = self._rungs_of(trial.trial_id)
        AsyncHyperBandScheduler.on_trial_complete(self, tune_controller, trial, result)
        changes = self._rung_changes(trial.trial_id, before)
        # the first write of the end, with the trial's rungs as ASHA now holds them: only the
        # memory above changed before it, which a kill takes with it
        self._record_end(trial, result, stopped=stopping)
        if stopping:
            self._record_stop(trial, changes)
        else:
            self._save(changes)

    def _asha_of(self, trial_id: str, stopped: bool) -> list[Change]:
        changes: list[Change] = []
        if trial_id in self._assigned:
            changes.append(["assign", trial_id, self._assigned[trial_id]])
        changes += [["rung", i, m, trial_id, v] for (i, m), v in self._rungs_of(trial_id).items()]
        if stopped:
            changes.append(["stop", trial_id])
        return changes

    def on_trial_remove(self, tune_controller: TuneController, trial: Trial) -> None:
        super().on_trial_remove(tune_controller, trial)
        if trial.trial_id in self._stopping:
            self._record_end(trial, None, stopped=True)
            self._record_stop(trial)

    def _record_stop(self, trial: Trial, changes: list[Change] | None = None) -> None:
        self._stopping.discard(trial.trial_id)
        self._stopped.add(trial.trial_id)
        unsaved = self._unsaved.pop(trial.trial_id, [])
        self._save([*unsaved, *(changes or []), ["stop", trial.trial_id]])

    def replay_stop(self, trial_id: str) -> None:
        """A stop the end records hold and ``asha.json`` may not (a kill between the two)."""
        self.replay([["stop", trial_id]])

    def replay(self, changes: list[Change]) -> None:
        """An ended trial's state in ASHA as its end record holds it (`_asha_of`), applied where
        ``asha.json`` lacks it (a crash before the log reached the disk); each change only adds,
        so applying one twice changes nothing."""
        if not self._loaded:
            self._load()
        missing: list[Change] = []
        for change in changes:
            if change[0] == "assign" and change[1] not in self._assigned:
                self._assigned[change[1]] = int(change[2])
                missing.append(change)
            elif change[0] == "rung":
                _, bracket, milestone, trial_id, value = change
                for m, recorded in self._brackets[bracket]._rungs:
                    if m == milestone and trial_id not in recorded:
                        recorded[trial_id] = value
                        missing.append(change)
            elif change[0] == "stop" and change[1] not in self._stopped:
                self._stopped.add(change[1])
                missing.append(change)
        self._save(missing)
