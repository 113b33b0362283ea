"""Means and 95 % intervals over seeds: what a study that repeats each configuration says.

A study whose space searches ``seed`` beside other fields (``ponder-difficulty-paper``: lambda_p
x seed) runs each configuration several times. `seed_intervals` groups the ended trials by the
other searched fields and gives, per configuration and metric, the mean over its seeds and a
95 % Student-t interval, mean +- t(0.975, n - 1) * sd / sqrt(n): a statement about the
configuration, where one trial is a statement about one seed. Pandas in, pandas out; no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from study.records.ranking import ENDED_WITH_RESULT

__all__ = ["GAP", "SEED_METRICS", "seed_intervals", "t_quantile"]

GAP = "easy_minus_hard_steps"
"""Easy minus hard mean halting step of one trial: negative where hard inputs take more steps.
Computed per trial before the mean over seeds (the mean of the differences, whose interval is
narrower than that of two separate means when a seed moves both)."""

SEED_METRICS = (
    "test/halted_accuracy",
    "test/best_step_accuracy",
    "test/stable_accuracy",
    "test/mean_halting_step",
    "easy/mean_halting_step",
    "hard/mean_halting_step",
    GAP,
)
"""The metrics `seed_intervals` summarises unless told others; those a table lacks are skipped."""

_COLUMNS = ("metric", "n", "mean", "sd", "half_width", "low", "high")

# t(0.975, df) for df = 1..30, three decimals (scipy.stats.t.ppf; scipy is not a dependency).
# Beyond 30 the Cornish-Fisher expansion of t around the normal quantile, within 1e-5 of it there.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959963984540054


def t_quantile(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (``df >= 1``): the factor
    of a two-sided 95 % interval of a mean over ``df + 1`` values."""
    if df < 1:
        raise ValueError(f"a t quantile needs at least one degree of freedom, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def seed_intervals(
    trials: pd.DataFrame,
    by: Sequence[str],
    metrics: Sequence[str] = SEED_METRICS,
    seed: str = "seed",
) -> pd.DataFrame:
    """Mean and 95 % interval over seeds of each configuration that ran under two seeds or more.

    ``trials`` is a trials table (`study.records.parquet`); only trials that ended with a result
    (`ENDED_WITH_RESULT`, when there is a ``status`` column) count. A configuration is a value of
    the ``by`` columns (the study's searched fields: ``seed`` among them is ignored, a column the
    table lacks too); one with fewer than two distinct seeds has no spread over seeds and is
    left out, as is a metric with fewer than two finite values in a configuration. A metric the
    table lacks is skipped; `GAP` is computed from the easy and hard sets' mean halting step.

    Returns one row per configuration and metric: the ``by`` columns, ``metric``, ``n`` (trials
    with a finite value, one per seed), ``mean``, ``sd`` (sample standard deviation),
    ``half_width`` (t(0.975, n - 1) * sd / sqrt(n)), ``low`` and ``high`` (mean -+ half_width);
    configurations in the table's order of first appearance, metrics in the order asked. Empty
    (those columns, no rows) when no configuration repeats or the table has no ``seed`` column.
    """
    keys = [c for c in dict.fromkeys(by) if c != seed and c in trials.columns]
    empty = pd.DataFrame(columns=[*keys, *_COLUMNS])
    if seed not in trials.columns or trials.empty:
        return empty
    df = trials
    if "status" in df.columns:
        df = df[df["status"].isin(ENDED_WITH_RESULT)]
    if (
        GAP in metrics
        and GAP not in df.columns
        and {"easy/mean_halting_step", "hard/mean_halting_step"} <= set(df.columns)
    ):
        easy = pd.to_numeric(df["easy/mean_halting_step"], errors="coerce")
        hard = pd.to_numeric(df["hard/mean_halting_step"], errors="coerce")
        df = df.assign(**{GAP: easy - hard})
    present = [m for m in dict.fromkeys(metrics) if m in df.columns]
    if df.empty or not present:
        return empty
    groups = df.groupby(keys, sort=False, dropna=False) if keys else [((), df)]
    rows: list[dict[str, object]] = []
    for key, group in groups:
        if group[seed].nunique() < 2:
            continue
        values = key if isinstance(key, tuple) else (key,)
        config = dict(zip(keys, values, strict=True))
        for metric in present:
            x = pd.to_numeric(group[metric], errors="coerce").to_numpy(dtype=float)
            x = x[np.isfinite(x)]
            if len(x) < 2:
                continue
            mean, sd = float(x.mean()), float(x.std(ddof=1))
            half = t_quantile(len(x) - 1) * sd / math.sqrt(len(x))
            rows.append(
                {
                    **config,
                    "metric": metric,
                    "n": len(x),
                    "mean": mean,
                    "sd": sd,
                    "half_width": half,
                    "low": mean - half,
                    "high": mean + half,
                }
            )
    if not rows:
        return empty
    return pd.DataFrame(rows, columns=[*keys, *_COLUMNS])
