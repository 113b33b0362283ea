"""Which searched field mattered for the objective: Optuna's fANOVA importance, from the journal.

`importances` reads the study's Optuna journal (on an object store, the copy the driver pushes)
through an in-memory, read-only backend: a running study's journal is read without its lock, a
torn last line left out. One result per objective.

- Trials counted: those Optuna holds COMPLETE, i.e. every trial that reached its budget and every
  trial ASHA stopped, at the value it stopped on (the value TPE learned from). Diverged, errored
  and running trials have no value.
- Why fANOVA: on small studies it finds a real effect where PED-ANOVA does not
  (``docs/evidence/importance_trials.py``: the one field that moves the objective ranked first in 29 of
  30 studies of 6 trials, against 16 of 30), hence `MIN_TRIALS`. Its random forest is seeded
  (`SEED`), so the same journal reads the same; it grows slow past about a thousand trials.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from study.records.journal_copy import read_copy
from study.spec.spec import StudySpec
from study.storage.storage import StudyPaths, is_remote, read_bytes

__all__ = ["MIN_TRIALS", "SEED", "Importance", "Importances", "importances", "read_journal_study"]

MIN_TRIALS = 6
"""Trials Optuna must hold COMPLETE before an importance is shown (see the module docstring)."""

SEED = 0
"""The seed of fANOVA's random forest: the same journal gives the same importances."""

EVALUATOR = "fANOVA"


@dataclass(frozen=True)
class Importance:
    """One objective's importances: searched field -> share of the variance, largest first."""

    objective: str
    mode: str
    values: dict[str, float]


@dataclass(frozen=True)
class Importances:
    """What `importances` found: the per-objective results, or why there are none; its ``str`` is
    the lines ``ponder-study status`` ends with."""

    counted: int
    """Trials Optuna holds COMPLETE (the ones that count)."""
    needed: int = MIN_TRIALS
    results: list[Importance] = field(default_factory=list)
    why: str | None = None
    """Why there is no result (too few trials, no journal, nothing searched); None when there is."""

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        """The importances as text, one line per objective (or one line saying why none)."""
        if self.why is not None:
            return [f"importance: {self.why}"]
        return [
            f"importance ({EVALUATOR}, seed {SEED}) for {r.objective} ({r.mode}), over {self.counted} "
            "trials Optuna holds complete, ASHA-stopped ones at the value they stopped on: "
            + ", ".join(f"{name} {value:.2f}" for name, value in r.values.items())
            for r in self.results
        ]


def _journal_bytes(paths: StudyPaths) -> bytes | None:
    """The study's journal: the file beside the study, or on an object store the driver's copy."""
    if is_remote(paths.root):
        copy = paths.optuna_journal_copy
        return read_copy(copy) if copy is not None else None
    return read_bytes(paths.optuna_journal)


def _read_only_backend(data: bytes) -> Any:
    from optuna.storages.journal import BaseJournalBackend

    logs: list[dict[str, Any]] = []
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break  # a write in progress (or torn by a kill): it has not happened yet
        try:
            logs.append(json.loads(line))
        except ValueError:
            break

    class ReadOnlyJournal(BaseJournalBackend):
        """Optuna's journal operations held in memory; reading never takes the writer's lock."""

        def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
            return logs[log_number_from:]

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            raise RuntimeError("a study's journal is read here, never written")

    return ReadOnlyJournal()


def read_journal_study(paths: StudyPaths) -> Any:
    """The study's Optuna study read from its journal (an `optuna.Study`), or None if it has none."""
    data = _journal_bytes(paths)
    if data is None:
        return None
    import optuna
    from optuna.storages import JournalStorage

    storage = JournalStorage(_read_only_backend(data))
    names = [s.study_name for s in storage.get_all_studies()]
    if not names:
        return None
    name = paths.name if paths.name in names else names[0]
    return optuna.load_study(study_name=name, storage=storage, sampler=optuna.samplers.RandomSampler())


def _objective(i: int) -> Callable[[Any], float]:
    """Optuna's ``target`` for the ``i``-th objective of a multi-objective study."""
    return lambda trial: float(trial.values[i])


def importances(spec: StudySpec, paths: StudyPaths, minimum: int = MIN_TRIALS) -> Importances:
    """fANOVA importance of the searched fields for each of the spec's objectives, from the
    study's journal; no result (and why) under ``minimum`` complete trials."""
    searched = [d.name for d in spec.space]
    if len(searched) < 2:
        return Importances(
            0, minimum, why=f"needs two searched fields or more, this spec searches {searched}"
        )
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = read_journal_study(paths)
    if study is None:
        return Importances(0, minimum, why=f"needs {minimum} ended trials, no Optuna journal yet")
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < minimum:
        return Importances(
            len(complete), minimum, why=f"needs {minimum} ended trials, {len(complete)} so far"
        )
    results = []
    for i, (metric, mode) in enumerate(spec.objectives):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna's experimental-feature warnings
            try:
                values = get_param_importances(
                    study,
                    evaluator=FanovaImportanceEvaluator(seed=SEED),
                    params=[p for p in searched if all(p in t.params for t in complete)],
                    target=_objective(i) if spec.multi_objective else None,
                )
            except (RuntimeError, ValueError, ZeroDivisionError) as e:
                return Importances(len(complete), minimum, why=f"could not be computed: {e}")
        results.append(Importance(metric, mode, {k: float(v) for k, v in values.items()}))
    return Importances(len(complete), minimum, results)
