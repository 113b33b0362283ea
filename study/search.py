"""From a spec to Tune's search: the param space, Optuna (seeded, on disk) and persistent ASHA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import JournalFileBackend
from ray import tune
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch

from study.parquet import parse_result_lines
from study.scheduler import PersistentASHA, SnapshotBeforeStart
from study.spec import Dimension, StudySpec
from study.storage import StudyPaths, read_bytes, trial_reports

__all__ = [
    "DivergenceAwareOptunaSearch",
    "make_scheduler",
    "make_searcher",
    "optuna_storage",
    "param_space",
    "tpe_startup_trials",
]


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
    objective; without this, Optuna would record that stand-in value as a real result.

    A restored trial that had already ended returns at once without a report. Tune records an
    ASHA stop (``asha.json``) just before it tells the searcher; a driver killed in between would
    leave that trial's end to the resume, and an empty result reads to Optuna as PRUNED, without
    a value. The trial's reports are saved before any ledger ends it, so its last one is what
    Optuna is told; a trial Optuna already knows the end of is not told again.

    Tune pickles the searcher with its Optuna study, and so with the journal's absolute path on
    the machine that started the study. A resume elsewhere (another head node, another cache
    directory) would write to that stale path and leave this study's journal behind: after a
    restore the study is reopened at ``paths.optuna_journal`` as this machine resolves it.
    """

    def __init__(self, *, paths: StudyPaths, **kwargs: Any) -> None:
        self._paths = paths
        super().__init__(storage=optuna_storage(paths), **kwargs)

    def _reopen_study(self) -> None:
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
        self._reopen_study()

    def restore(self, checkpoint_path: str) -> None:  # the searcher state Tune saved
        super().restore(checkpoint_path)
        self._reopen_study()

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
        if self._told(trial_id):
            return
        data = read_bytes(trial_reports(self._paths.reports_dir, trial_id))
        saved = parse_result_lines(data.decode()) if data is not None else []
        if saved and not error:  # saved only once the trial ended: its last report is its end
            result = saved[-1]
        if result is not None and result.get("outcome") == "diverged":
            result, error = None, True
        super().on_trial_complete(trial_id, result, error)


def optuna_storage(paths: StudyPaths) -> optuna.storages.JournalStorage:
    """The study's Optuna storage: a journal file beside the results (optuna-dashboard opens it)."""
    journal = Path(paths.optuna_journal)
    journal.parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(str(journal)))


def make_searcher(spec: StudySpec, paths: StudyPaths) -> ConcurrencyLimiter:
    """Seeded Optuna search whose study lives in a journal file beside the results."""
    metrics, modes = [m for m, _ in spec.objectives], [mode for _, mode in spec.objectives]
    searcher = DivergenceAwareOptunaSearch(  # lists: Optuna's multi-objective study
        metric=metrics if spec.multi_objective else metrics[0],
        mode=modes if spec.multi_objective else modes[0],
        sampler=_sampler(spec),
        study_name=paths.name,
        paths=paths,
    )
    return ConcurrencyLimiter(searcher, max_concurrent=spec.search.max_concurrent)


def make_scheduler(spec: StudySpec, paths: StudyPaths) -> PersistentASHA | SnapshotBeforeStart:
    """ASHA over training iterations, its rungs persisted in the study's ``asha.json``; first in,
    first out (every trial runs its budget) for a multi-objective study."""
    s = spec.scheduler
    if s is None:
        return SnapshotBeforeStart()
    return PersistentASHA(
        paths.asha,
        reports_dir=paths.reports_dir,
        time_attr="iteration",
        metric=s.metric,
        mode=s.mode,
        max_t=spec.iterations,
        grace_period=s.grace_period,
        reduction_factor=s.reduction_factor,
        brackets=s.brackets,
    )
