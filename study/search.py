"""From a spec to Tune's search: the param space, Optuna (seeded, on disk) and persistent ASHA."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import JournalFileBackend
from ray import tune
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch

from study.parquet import parse_result_lines
from study.records import EndRecord, read_end_records
from study.scheduler import PersistentASHA, SnapshotBeforeStart
from study.spec import Dimension, StudySpec
from study.storage import StudyPaths, read_bytes, trial_reports

__all__ = [
    "TUNE_ID_ATTR",
    "DivergenceAwareOptunaSearch",
    "make_scheduler",
    "make_searcher",
    "optuna_storage",
    "param_space",
    "repair_journal",
    "tpe_startup_trials",
]


TUNE_ID_ATTR = "tune_trial_id"
"""The user attribute of each Optuna trial naming the Tune trial it was asked for."""


def _domain(d: Dimension) -> Any:
    if d.values is not None:
        return tune.choice(list(d.values))
    assert d.low is not None and d.high is not None
    if d.integer:  # Tune's integer upper bound is exclusive, the spec's inclusive
        lo, hi = int(d.low), int(d.high) + 1
        return tune.lograndint(lo, hi) if d.log else tune.randint(lo, hi)
    return tune.loguniform(d.low, d.high) if d.log else tune.uniform(d.low, d.high)


def param_space(spec: StudySpec) -> dict[str, Any]:
    """Tune's config for every trial: the task, the fixed fields, and a domain per searched field."""
    return {"task": spec.task, **dict(spec.config), **{d.name: _domain(d) for d in spec.space}}


def tpe_startup_trials(num_samples: int) -> int:
    """How many of a study's trials TPE draws at random before it models: a quarter, 2 to 10.
    Optuna's default, 10, would leave an 8-trial study random search."""
    return max(2, min(10, num_samples // 4))


def _sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    seed = spec.search.seed
    kind = spec.search.sampler
    if kind == "tpe":
        startup = tpe_startup_trials(spec.search.num_samples)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "qmc":
        return optuna.samplers.QMCSampler(seed=seed)
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if kind == "grid":  # every combination of the listed values, once (the spec sized num_samples)
        return optuna.samplers.GridSampler({d.name: list(d.values or ()) for d in spec.space}, seed=seed)
    if kind == "cmaes":  # the spec refuses it unless the cmaes package is installed
        return optuna.samplers.CmaEsSampler(seed=seed)
    raise ValueError(f"unknown sampler {kind!r}")


class DivergenceAwareOptunaSearch(OptunaSearch):
    """OptunaSearch that tells Optuna a diverged trial FAILED, that tells a restored trial's end
    once and with the value it ended on, and that finds its journal where this machine keeps it
    when Tune restores it.

    A diverged trial ends normally in Tune (it is not an error to retry) and reports a finite
    objective; without this, Optuna would record that stand-in value as a real result. An errored
    trial is the opposite: ``resume`` retries it, so its Optuna trial stays RUNNING until it ends
    (Ray's OptunaSearch would fail it, and a retry that succeeded could never be told).

    A restored trial that had already ended returns at once without a report. Tune records an
    ASHA stop (``asha.json``) just before it tells the searcher; a driver killed in between would
    leave that trial's end to the resume, and an empty result reads to Optuna as PRUNED, without
    a value. The trial's reports are saved before any ledger ends it, so its last one is what
    Optuna is told; a trial Optuna already knows the end of is not told again.

    Tune pickles the searcher with its Optuna study, and so with the journal's path on the machine
    and in the place that started the study. Restored, the searcher does not touch that path:
    the resume calls `rebind` with where the study is now, which reopens the Optuna study there.

    Every Optuna trial carries the id of the Tune trial it was asked for (`TUNE_ID_ATTR`), so a
    resume can bring Optuna level with the study's records (`replay`): a trial that ended is told
    its end, and a trial asked for just before a driver was killed, which Tune never saved
    (an orphan), is handed to the next new Tune trial instead of a new ask.
    """

    def __init__(
        self, *, paths: StudyPaths, warm_start: Sequence[Mapping[str, Any]] = (), **kwargs: Any
    ) -> None:
        self._paths = paths
        self._orphans: list[int] = []
        self._stale = False
        self._warm_start = [dict(p) for p in warm_start]
        super().__init__(storage=optuna_storage(paths), **kwargs)

    def _setup_study(self, mode: Any) -> None:
        """Create or load the Optuna study. A study resumed after a driver was stopped before
        Tune saved any state (or whose only state was torn by the kill) starts a new Tune
        experiment on its existing journal: the trials asked then, still RUNNING, are orphans."""
        super()._setup_study(mode)
        if self._ot_study is not None:
            self._orphans = []
            self.replay(read_end_records(self._paths), known=set(self._ot_trials))
            for point in self._warm_start:  # a warm start's configurations go first, once
                self._ot_study.enqueue_trial(point, skip_if_exists=True)

    def _reopen_study(self) -> None:
        self._stale = False
        if self._ot_study is None:  # not set up yet: nothing was asked of Optuna
            return
        storage = optuna_storage(self._paths)
        sampler = self._ot_study.sampler
        study = optuna.load_study(study_name=self._study_name, storage=storage, sampler=sampler)
        for trial in self._ot_trials.values():  # each asked trial holds the study it came from
            trial.study, trial.storage = study, storage
        self._storage, self._ot_study = storage, study

    def __setstate__(self, state: dict[str, Any]) -> None:  # the Tuner unpickled on restore
        self.__dict__.update(state)
        self._stale, self._orphans = True, []  # its paths are the first run's: wait for `rebind`

    def restore(self, checkpoint_path: str) -> None:  # the searcher state Tune saved
        paths = self._paths
        super().restore(checkpoint_path)
        self._paths, self._stale, self._orphans = paths, True, []

    def rebind(self, paths: StudyPaths) -> None:
        """Use the study where it is now: its journal at ``paths``, not where Tune's pickle says."""
        self._paths = paths
        self._reopen_study()

    def _ready(self) -> None:
        if self._stale:
            self._reopen_study()

    def replay(self, ends: Mapping[str, EndRecord], known: set[str]) -> None:
        """Bring Optuna level with the study's records before any trial starts: every RUNNING
        Optuna trial whose Tune trial has an end record is told that end; one whose Tune trial
        is not among ``known`` (Tune never saved it) waits for the next new Tune trial."""
        self._ready()
        if self._ot_study is None:
            return
        by_number = {t.number: tid for tid, t in self._ot_trials.items()}
        running = self._ot_study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        for frozen in running:
            tune_id = frozen.user_attrs.get(TUNE_ID_ATTR) or by_number.get(frozen.number)
            if tune_id in ends:
                self._tell(frozen.number, ends[tune_id].last_result, ends[tune_id].outcome == "diverged")
                self._completed_trials.add(tune_id)
            elif tune_id not in known:
                self._orphans.append(frozen.number)
            elif tune_id not in self._ot_trials:  # restored from its started record (`_replay`):
                # the searcher's saved state, older, lacks it; its Optuna trial is this one
                self._ot_trials[tune_id] = optuna.trial.Trial(self._ot_study, frozen._trial_id)

    def _tell(self, number: int, result: Mapping[str, Any], failed: bool) -> None:
        assert self._ot_study is not None
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        values = [result.get(m) for m in metrics]
        if failed or any(not isinstance(v, (int, float)) for v in values):
            self._ot_study.tell(number, state=optuna.trial.TrialState.FAIL)
        else:
            self._ot_study.tell(number, values if len(values) > 1 else values[0])

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        self._ready()
        while self._orphans and trial_id not in self._ot_trials and self._ot_study is not None:
            number = self._orphans.pop(0)
            frozen = next(t for t in self._ot_study.get_trials(deepcopy=False) if t.number == number)
            if isinstance(self._space, dict) and not set(self._space) <= set(frozen.params):
                # asked, but its parameters were cut with a torn journal: it never ran
                self._ot_study.tell(number, state=optuna.trial.TrialState.FAIL)
                continue
            self._ot_trials[trial_id] = optuna.trial.Trial(self._ot_study, frozen._trial_id)
        params = super().suggest(trial_id)
        asked = self._ot_trials.get(trial_id)
        if asked is not None:
            asked.set_user_attr(TUNE_ID_ATTR, trial_id)
        return params

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self._ready()
        super().on_trial_result(trial_id, result)

    def _told(self, trial_id: str) -> bool:
        """Whether Optuna already has this trial's end (a restored trial that had ended)."""
        asked = self._ot_trials.get(trial_id)
        if asked is None or self._ot_study is None:
            return False
        trials = self._ot_study.get_trials(deepcopy=False)
        frozen = next((t for t in reversed(trials) if t.number == asked.number), None)
        return frozen is not None and frozen.state.is_finished()

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self._ready()
        if self._told(trial_id):
            return
        if error:  # Tune gave up on it for now; `resume` retries errored trials, so Optuna waits
            return  # (a trial still RUNNING when the study finishes is failed then)
        data = read_bytes(trial_reports(self._paths.reports_dir, trial_id))
        saved = parse_result_lines(data.decode()) if data is not None else []
        if saved and not error:  # saved only once the trial ended: its last report is its end
            result = saved[-1]
        if result is not None and result.get("outcome") == "diverged":
            result, error = None, True
        super().on_trial_complete(trial_id, result, error)


def repair_journal(journal: str) -> int:
    """Cut a journal back to its last whole operation; returns the bytes removed (0 if whole).

    Optuna appends one JSON line per operation. A driver stopped by a full disk (or killed in
    the middle of a write) leaves a torn last line, and every later read fails on it once
    anything follows. The torn operation never took effect, so cutting it is safe; the study's
    records replay what it was (`DivergenceAwareOptunaSearch.replay`). The cut bytes are kept
    beside the journal (``optuna.journal.torn``)."""
    path = Path(journal)
    if not path.exists():
        return 0
    data = path.read_bytes()
    good = 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            json.loads(line)
        except ValueError:
            break
        good += len(line)
    if good == len(data):
        return 0
    path.with_name(path.name + ".torn").write_bytes(data[good:])
    with path.open("r+b") as f:
        f.truncate(good)
        f.flush()
        os.fsync(f.fileno())
    return len(data) - good


def optuna_storage(paths: StudyPaths) -> optuna.storages.JournalStorage:
    """The study's Optuna storage: a journal file beside the results (optuna-dashboard opens it)."""
    journal = Path(paths.optuna_journal)
    journal.parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(str(journal)))


def make_searcher(
    spec: StudySpec, paths: StudyPaths, warm_start: Sequence[Mapping[str, Any]] = ()
) -> ConcurrencyLimiter:
    """Seeded Optuna search whose study lives in a journal file beside the results; the
    ``warm_start`` configurations are its first trials."""
    metrics, modes = [m for m, _ in spec.objectives], [mode for _, mode in spec.objectives]
    searcher = DivergenceAwareOptunaSearch(  # lists: Optuna's multi-objective study
        metric=metrics if spec.multi_objective else metrics[0],
        mode=modes if spec.multi_objective else modes[0],
        sampler=_sampler(spec),
        study_name=paths.name,
        paths=paths,
        warm_start=warm_start,
    )
    return ConcurrencyLimiter(searcher, max_concurrent=spec.search.max_concurrent)


def make_scheduler(spec: StudySpec, paths: StudyPaths) -> PersistentASHA | SnapshotBeforeStart:
    """ASHA over training iterations, its rungs persisted in the study's ``asha.json``; first in,
    first out (every trial runs its budget) for a multi-objective study."""
    s = spec.scheduler
    if s is None:
        return SnapshotBeforeStart(paths=paths)
    return PersistentASHA(
        paths.asha,
        paths=paths,
        time_attr="iteration",
        metric=s.metric,
        mode=s.mode,
        max_t=spec.iterations,
        grace_period=s.grace_period,
        reduction_factor=s.reduction_factor,
        brackets=s.brackets,
    )
