"""The names of what training reports, and of the evaluation sets a config gets.

Torch-free, so that checking a study spec or reading a study's Parquet does not load torch (the
``ponder-study`` command answers ``--help``, ``status`` or a bad spec in a fraction of the time).
"""

from __future__ import annotations

from ponder.config import MnistConfig, ParityConfig, TaskConfig

__all__ = [
    "CHANCE",
    "OUTCOMES",
    "SET_LIST_METRICS",
    "SET_METRICS",
    "TIMING_KEYS",
    "TRAIN_METRICS",
    "eval_set_names",
]

CHANCE = {"parity": 0.5, "mnist": 0.1}
"""The accuracy of a guess, per task: parity's answer is one bit, MNIST's one of ten digits."""

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


def eval_set_names(config: TaskConfig) -> list[str]:
    """Names of the evaluation sets `ponder.tasks.build_task` makes for this config, without
    building them."""
    if isinstance(config, ParityConfig):
        names = ["test", "easy", "hard"]
        return [*names, "extrapolation"] if config.nonzero_range[1] < config.n_elems else names
    if isinstance(config, MnistConfig):
        return ["test", *(f"rot{angle:g}" for angle in config.eval_rotations)]
    raise TypeError(f"no task for config {type(config).__name__}")
