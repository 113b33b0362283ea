"""Tune's record of an ended trial cut to what the study reads of it (`SlimEndedTrials`).

Tune keeps, for every number a report holds, running statistics (max, min, mean, last, the mean
of the last 5 and of the last 10) and the reports behind the last two, and writes them for every
trial at each save of its experiment: with 43 numbers, 3.0 ms and 39 KB a trial to serialise
(0.3 ms and 5 KB once cut, on the 2-core machine), which made most of the 26 s of Tune's last
save of a 10,000-trial study (docs/parquet.md, Figures). Nothing of the study reads them: its
results are the end records and the Parquet. Once a trial has ended, the statistics of the
study's objectives are kept (Tune's `ExperimentAnalysis` ranks by them) and the rest dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial

__all__ = ["SlimEndedTrials", "kept_statistics"]

KEPT = ("training_iteration",)
"""Statistics kept beside the objectives' (Tune's own time axis)."""


def kept_statistics(objectives: Iterable[tuple[str, str]]) -> set[str]:
    """The metrics whose running statistics Tune keeps for the study: its objectives' and `KEPT`
    (`study.search.ray_private.running_statistics_of` keeps Tune from computing the others)."""
    return {*(metric for metric, _ in objectives), *KEPT}


class SlimEndedTrials(Callback):
    """Drop the running statistics of an ended trial but for ``metrics`` (and `KEPT`); of a
    trial that completed, the windows of reports behind them too (it never reports again)."""

    def __init__(self, metrics: Iterable[str]) -> None:
        self.metrics = {*metrics, *KEPT}

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.slim(trial, completed=True)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.slim(trial)  # a resume runs it again: its statistics go on from the windows kept

    def slim(self, trial: Trial, completed: bool = False) -> None:
        metadata = trial.run_metadata
        dropped = [name for name in metadata.metric_analysis if name not in self.metrics]
        for name in dropped:
            del metadata.metric_analysis[name]
            metadata.metric_n_steps.pop(name, None)
        # the last 5 and 10 reports' values, as deques, which Tune's JSON encoder pickles one by one
        windows = completed and bool(metadata.metric_n_steps)
        if windows:
            metadata.metric_n_steps = {}
        if dropped or windows:
            metadata.invalidate_cache()  # type: ignore[no-untyped-call]  # Ray: untyped
            trial.invalidate_json_state()  # type: ignore[no-untyped-call]  # Ray: untyped
