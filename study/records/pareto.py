"""Pareto-optimal trials: no other trial is at least as good on every objective and better on one.

Used for the ``pareto`` column of a multi-objective study's trials table and for the report's
accuracy-against-thinking-time plot, so both mark the same trials.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["pareto_mask"]


def pareto_mask(values: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """For ``values`` of shape [n_trials, n_objectives] and a ``"max"``/``"min"`` per objective:
    a bool [n_trials], True where the trial is not dominated. A row with a NaN is never on the
    front (a diverged trial has no objective to compare); equal rows are all kept."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 2 or x.shape[1] != len(modes):
        raise ValueError(f"values must be [n_trials, {len(modes)}], got shape {x.shape}")
    if any(m not in ("max", "min") for m in modes):
        raise ValueError(f"modes must be 'max' or 'min', got {list(modes)}")
    sign = np.array([1.0 if m == "max" else -1.0 for m in modes])
    x = x * sign  # every objective maximised now
    finite = np.isfinite(x).all(axis=1)  # [n]
    a, b = x[:, None, :], x[None, :, :]  # [n, 1, k] against [1, n, k]: does b dominate a?
    dominates = (b >= a).all(axis=2) & (b > a).any(axis=2) & finite[None, :]  # [n, n]
    return np.asarray(finite & ~dominates.any(axis=1))
