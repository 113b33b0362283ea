"""Means and 95 % intervals over seeds, on hand-built trials tables with known numbers (no Ray)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from study.reports.seeds import GAP, SEED_METRICS, seed_intervals, t_quantile

ACC = "test/halted_accuracy"


def _trials() -> pd.DataFrame:
    """lambda_p 0.1 under seeds 0, 1, 2 (halted accuracy 0.9, 1.0, 0.95), 0.3 under seed 0 only,
    and 0.5 under seeds 0 and 1 where one trial diverged and one is still running."""
    return pd.DataFrame(
        {
            "trial_id": list("abcdefg"),
            "status": [
                "completed",
                "early_stopped",
                "completed",
                "completed",
                "completed",
                "diverged",
                "running",
            ],
            "lambda_p": [0.1, 0.1, 0.1, 0.3, 0.5, 0.5, 0.5],
            "beta": [0.01] * 7,
            "seed": [0, 1, 2, 0, 0, 1, 1],
            ACC: [0.9, 1.0, 0.95, 0.8, 0.7, math.nan, 0.6],
            "easy/mean_halting_step": [6.0, 7.0, 8.0, 5.0, 4.0, math.nan, 4.0],
            "hard/mean_halting_step": [4.0, 4.0, 5.0, 5.0, 4.0, math.nan, 4.0],
        }
    )


def test_three_seeds_give_the_mean_and_a_student_t_interval() -> None:
    out = seed_intervals(_trials(), by=["lambda_p", "seed"])
    assert list(out.columns) == ["lambda_p", "metric", "n", "mean", "sd", "half_width", "low", "high"]
    # only lambda_p 0.1 has two seeds that ended with a result: 0.3 ran one, 0.5's second diverged
    # (its running trial does not count)
    assert set(out["lambda_p"]) == {0.1}
    assert list(out["metric"]) == [ACC, "easy/mean_halting_step", "hard/mean_halting_step", GAP]
    acc = out[out["metric"] == ACC].iloc[0]
    assert acc["n"] == 3
    assert acc["mean"] == pytest.approx(0.95)
    assert acc["sd"] == pytest.approx(0.05)
    half = 4.303 * 0.05 / math.sqrt(3)  # t(0.975, 2) = 4.303
    assert acc["half_width"] == pytest.approx(half)
    assert (acc["low"], acc["high"]) == (pytest.approx(0.95 - half), pytest.approx(0.95 + half))
    # the gap is taken per trial, then averaged: (2, 3, 3) -> 8/3
    gap = out[out["metric"] == GAP].iloc[0]
    assert gap["mean"] == pytest.approx(8 / 3)
    assert gap["half_width"] == pytest.approx(4.303 * math.sqrt(1 / 3) / math.sqrt(3))


def test_configurations_are_the_searched_fields_but_the_seed() -> None:
    trials = pd.concat([_trials().iloc[:3], _trials().iloc[:3].assign(kl_direction="reverse")])
    trials["kl_direction"] = trials["kl_direction"].fillna("forward")
    trials.loc[trials["kl_direction"] == "reverse", ACC] = [0.5, 0.6, 0.7]
    out = seed_intervals(trials, by=["lambda_p", "kl_direction", "seed", "not_a_column"], metrics=[ACC])
    assert list(out.columns[:2]) == ["lambda_p", "kl_direction"]
    assert list(out["kl_direction"]) == ["forward", "reverse"]
    assert out["mean"].tolist() == pytest.approx([0.95, 0.6])
    assert out["n"].tolist() == [3, 3]
    # only the seed searched: the whole study is one configuration
    everything = seed_intervals(_trials().iloc[:3], by=["seed"], metrics=[ACC])
    assert list(everything.columns) == ["metric", "n", "mean", "sd", "half_width", "low", "high"]
    assert everything["mean"].tolist() == pytest.approx([0.95])


def test_no_repeats_or_no_columns_give_an_empty_table() -> None:
    trials = _trials()
    one_seed = trials[trials["seed"] == 0]
    assert seed_intervals(one_seed, by=["lambda_p", "seed"]).empty
    assert seed_intervals(trials.drop(columns="seed"), by=["lambda_p"]).empty  # no seed searched
    assert seed_intervals(trials.iloc[:0], by=["lambda_p", "seed"]).empty
    # an older study without best-step or stable accuracy: those metrics are skipped, not errors
    older = seed_intervals(trials.drop(columns=["hard/mean_halting_step"]), by=["lambda_p", "seed"])
    assert set(older["metric"]) == {ACC, "easy/mean_halting_step"}
    assert set(SEED_METRICS) >= {"test/best_step_accuracy", "test/stable_accuracy", GAP}


def test_t_quantiles_match_student_t() -> None:
    assert t_quantile(2) == 4.303
    assert t_quantile(30) == 2.042
    with pytest.raises(ValueError):
        t_quantile(0)
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 29, 30, 31, 45, 100, 1000):
        assert t_quantile(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-3)
