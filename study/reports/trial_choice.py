"""Which trial ``ponder-study evaluate`` runs: the one named, or the study's best by its objective.

Torch-free on purpose: a typo in a study or trial name is answered from the study's files in a
fraction of a second, before the command loads torch to check the device and the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from study.records.ranking import ENDED_WITH_RESULT, ranked_trials
from study.spec.spec import SpecError, parse_spec
from study.storage.storage import StudyPaths, list_studies, read_bytes, read_study_table

__all__ = ["ChosenTrial", "EvaluateError", "choose_trial"]


class EvaluateError(ValueError):
    """A study, trial or checkpoint that cannot be evaluated; the one-line message says what to do."""


@dataclass(frozen=True)
class ChosenTrial:
    """A trial's row of the study's trials Parquet, and why it was chosen."""

    row: dict[str, Any]
    chosen_by: str | None
    """``"<metric> (<mode>)"`` when chosen as the study's best, None when named."""


def choose_trial(name: str, storage: str = "results", trial_id: str | None = None) -> ChosenTrial:
    """Trial ``trial_id`` of study ``name``, or its best ended trial by the study's objective.

    Raises `EvaluateError` for an unknown study or trial, or a study without trials Parquet."""
    paths = StudyPaths(storage, name)
    rows = _trial_rows(paths)
    if trial_id is not None:
        return ChosenTrial(_named(rows, name, trial_id), None)
    metric, mode = _objective(paths)
    return ChosenTrial(_best(rows, name, metric, mode), f"{metric} ({mode})")


def _trial_rows(paths: StudyPaths) -> list[dict[str, Any]]:
    if not paths.exists():
        there = list_studies(paths.root)
        known = f"studies there: {', '.join(there)}" if there else "no studies there"
        raise EvaluateError(
            f"no study named {paths.name!r} under {paths.root!r}; {known} (pass --storage for another root)"
        )
    table = read_study_table(paths, "trials")
    if table is None:
        raise EvaluateError(
            f"study {paths.name!r} has no trials Parquet yet ({paths.trials_parquet}); wait for a trial to "
            f"end, or write it with `ponder-study export {paths.name}`"
        )
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _objective(paths: StudyPaths) -> tuple[str, str]:
    text = read_bytes(paths.spec)
    assert text is not None  # paths.exists() said so
    try:
        spec = parse_spec(text.decode("utf-8"), paths.name)
    except SpecError as exc:
        why = f"study {paths.name!r}: its saved spec does not parse ({exc}); pass --trial ID"
        raise EvaluateError(why) from exc
    return spec.metric, spec.mode


def _best(rows: list[dict[str, Any]], name: str, metric: str, mode: str) -> dict[str, Any]:
    ranked = ranked_trials(pd.DataFrame(rows), metric, mode)  # the report's best trial too
    if ranked.empty:
        raise EvaluateError(
            f"study {name!r} has no {' or '.join(ENDED_WITH_RESULT)} trial with a value of {metric} yet; "
            f"wait for one, or pass --trial ID ({_some_ids(rows)})"
        )
    return _named(rows, name, str(ranked["trial_id"].iloc[0]))


def _named(rows: list[dict[str, Any]], name: str, trial_id: str) -> dict[str, Any]:
    for row in rows:
        if row.get("trial_id") == trial_id:
            return row
    raise EvaluateError(f"no trial {trial_id!r} in study {name!r}; {_some_ids(rows)}")


def _some_ids(rows: list[dict[str, Any]], most: int = 5) -> str:
    ids = [f"{r['trial_id']} ({r.get('status')})" for r in rows[:most]]
    if not ids:
        return "it has no trials"
    more = f", ... ({len(rows)} in all)" if len(rows) > most else ""
    return f"its trials: {', '.join(ids)}{more}"
