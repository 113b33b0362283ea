"""The names of what training reports, and of the evaluation sets a config gets (its task's,
from the `ponder.tasks` registry).

Torch-free, so that checking a study spec or reading a study's Parquet does not load torch (the
``ponder-study`` command answers ``--help``, ``status`` or a bad spec in a fraction of the time).
"""

from __future__ import annotations

from ponder.tasks import CHANCE, eval_set_names

__all__ = [
    "CHANCE",
    "OUTCOMES",
    "SET_LIST_METRICS",
    "SET_METRICS",
    "TIMING_KEYS",
    "TRAIN_METRICS",
    "eval_set_names",
]

OUTCOMES = ("running", "completed", "diverged")
"""A run is running until it has made all its iterations (completed) or hit the NaN limit (diverged)."""

SET_METRICS = (
    "halted_accuracy",
    "best_step_accuracy",
    "stable_accuracy",
    "mean_halting_step",
    "expected_steps",
    "loss",
    "loss_rec",
    "loss_reg",
)
"""Scalar metrics reported for every evaluation set, as ``<set>/<metric>``. ``best_step_accuracy``
(the best step's accuracy) and ``stable_accuracy`` (right at the halting step and every later
one) tell honest pondering from halted accuracy that comes from *where* the model halts
(`ponder.halting.halting_accuracies`)."""
SET_LIST_METRICS = ("per_step_accuracy", "halting_distribution")
"""Per-step metrics (lists of max_steps floats) reported for every evaluation set."""
TRAIN_METRICS = ("loss", "loss_rec", "loss_reg", "grad_norm")
"""Training averages over an evaluation interval, as ``train/<metric>`` (NaN if no step was finite)."""

TIMING_KEYS = ("time_s", "iterations_per_s")
"""Keys of a metrics dict that depend on the machine, not on the run's arithmetic."""
