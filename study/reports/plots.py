"""The report's six figures, one function a plot (`draw` picks it by key), and the placeholder
drawn for a plot the study has no data for, saying why.

matplotlib is used through `matplotlib.figure.Figure` only: no pyplot, no global backend, safe
in a process that plots for something else too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ponder.config import CONFIGS
from ponder.halting import PriorTail, log_geometric_prior
from ponder.metrics import CHANCE
from study.reports.data import (
    TITLES,
    TOP,
    StudyData,
    finite,
    front_rule,
    has_pareto_column,
    is_nan,
    milestones,
    num,
    number,
    pareto_front,
    statuses,
    style,
)

__all__ = ["draw"]


_TOP_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
"""The colours of the top trials (`TOP`) in the per-step accuracy and learning curve plots."""
_TAILS = ("renormalise", "last_step", "truncate")
"""The prior tails a trial's ``prior_tail`` may name (`ponder.halting.PriorTail`)."""


class _NoData(Exception):
    """A plot the study has no data for; the message says why (it goes on the placeholder)."""


def _config_default(task: str, name: str) -> Any:
    """The default of a config field of ``task`` (None if the task's config has no such field)."""
    return next((f.default for f in dataclasses.fields(CONFIGS[task]) if f.name == name), None)


def _floats(value: Any) -> npt.NDArray[np.float64] | None:
    """A list cell as floats, or None for a null or empty one."""
    if value is None or is_nan(value):
        return None
    arr = np.asarray(value, dtype=float)
    return arr if arr.ndim == 1 and arr.size > 0 else None


def _label(trial: pd.Series) -> str:
    """A trial in a legend: its id and the three hyperparameters PonderNet studies search."""
    return (
        f"{trial['trial_id']}: λp={num(trial.get('lambda_p'), 3)}, "
        f"β={num(trial.get('beta'), 2)}, N={num(trial.get('max_steps'))}"
    )


def _scatter_by_status(ax: Axes, df: pd.DataFrame, x: str, y: str) -> None:
    """One point a trial of ``df``, ``x`` against ``y``, coloured and marked by its status."""
    for status in statuses(df):
        part = df[df["status"] == status]
        colour, marker = style(status)
        ax.scatter(
            part[x].astype(float),
            part[y].astype(float),
            c=colour,
            marker=marker,
            s=45,
            alpha=0.85,
            edgecolors="white",
            linewidths=0.5,
            label=f"{status} ({len(part)})",
            zorder=3,
        )


def draw(key: str, study: StudyData) -> tuple[Figure, str | None]:
    """The figure for plot ``key``, or a placeholder and the reason there is no data."""
    plot: Callable[[StudyData], Figure] = _PLOTTERS[key]
    try:
        return plot(study), None
    except _NoData as exc:
        return _placeholder(study, key, str(exc)), str(exc)


def _placeholder(study: StudyData, key: str, why: str) -> Figure:
    fig = Figure(figsize=(8, 3), layout="constrained")
    fig.suptitle(f"{study.name}: {TITLES[key]}")
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(0.5, 0.5, f"no data: {why}", ha="center", va="center", wrap=True, fontsize=11, color="dimgray")
    return fig


def _sensitivity(study: StudyData) -> Figure:
    """Halted accuracy and mean halting step against lambda_p, as the PonderNet paper plots them."""
    panels = [(study.accuracy, "halted accuracy"), (study.steps, "mean halting step")]
    if all(finite(study.trials, "lambda_p", col).empty for col, _ in panels):
        raise _NoData(f"no trial has a finite lambda_p and {study.accuracy} or {study.steps}")
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    fig.suptitle(f"{study.name}: sensitivity to $\\lambda_p$ ({study.set_name} set)")
    axes = fig.subplots(1, 2, sharex=True)
    seeds = study.seeds()
    for ax, (col, what) in zip(axes, panels, strict=True):
        df = finite(study.trials, "lambda_p", col)
        ax.set_xlabel("$\\lambda_p$ (prior's halting probability per step)")
        ax.set_ylabel(f"{what} ({study.set_name})")
        ax.set_title(what)
        ax.grid(alpha=0.3)
        if df.empty:
            ax.text(0.5, 0.5, f"no trial has a finite {col}", transform=ax.transAxes, ha="center")
            continue
        _scatter_by_status(ax, df, "lambda_p", col)
        intervals = finite(seeds[seeds["metric"] == col], "lambda_p") if not seeds.empty else seeds
        if not intervals.empty:  # configurations repeated under seeds: their means and intervals
            _seed_errorbars(ax, intervals, df["lambda_p"].astype(float))
            ax.legend(fontsize=8, title="bars: 95 % interval over seeds (Student t)", title_fontsize=8)
            continue
        groups = df.assign(_lp=df["lambda_p"].astype(float).round(4)).groupby("_lp")[col]
        stats = groups.agg(["mean", "min", "max", "count"]).sort_index()
        if (stats["count"] > 1).any():
            ax.errorbar(
                stats.index,
                stats["mean"],
                yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]],
                color="black",
                lw=1.2,
                capsize=4,
                marker="D",
                markersize=5,
                markerfacecolor="white",
                label="mean per $\\lambda_p$ (bars: min to max)",
                zorder=2,
            )
        else:
            ax.text(
                0.02,
                0.02,
                "one trial per $\\lambda_p$ value: no mean or spread to draw",
                transform=ax.transAxes,
                fontsize=8,
                color="dimgray",
            )
        ax.legend(fontsize=8)
    return fig


_SERIES_COLOURS = ("black", "tab:green", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "navy", "gold")
"""One per configuration of the other searched fields in the sensitivity plot: none a status's."""


def _seed_errorbars(ax: Axes, intervals: pd.DataFrame, lambda_ps: pd.Series) -> None:
    """Each configuration's mean over its seeds against lambda_p, its 95 % interval as bars: one
    line per value of the searched fields other than lambda_p, side by side around the value."""
    keys = list(intervals.columns[: list(intervals.columns).index("metric")])
    others = [k for k in keys if k != "lambda_p"]
    series = list(intervals.groupby(others, sort=False, dropna=False)) if others else [((), intervals)]
    span = float(lambda_ps.max() - lambda_ps.min()) or max(abs(float(lambda_ps.iloc[0])), 1.0) * 0.1
    step = 0.012 * span
    for i, (key, part) in enumerate(series):
        part = part.sort_values("lambda_p")
        values = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{k}={num(v, 3)}" for k, v in zip(others, values, strict=True))
        counts = sorted({int(c) for c in part["n"]})
        n = f"n={counts[0]}" if len(counts) == 1 else f"n={counts[0]}-{counts[-1]}"
        ax.errorbar(
            part["lambda_p"].astype(float) + (i - (len(series) - 1) / 2) * step,
            part["mean"].astype(float),
            yerr=part["half_width"].astype(float),
            color=_SERIES_COLOURS[i % len(_SERIES_COLOURS)],
            lw=1.2,
            capsize=4,
            marker="D",
            markersize=5,
            markerfacecolor="white",
            label=f"{name + ': ' if name else ''}mean over seeds ({n})",
            zorder=4,
        )


def _pareto(study: StudyData) -> Figure:
    """Halted accuracy against mean halting step, every trial, the Pareto front marked."""
    trials = study.trials.reset_index(drop=True)
    front = pareto_front(trials, study.accuracy, study.steps)
    points = finite(trials, study.steps, study.accuracy)
    if points.empty:
        raise _NoData(f"no trial has both a finite {study.accuracy} and {study.steps}")
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(f"{study.name}: accuracy against thinking time ({study.set_name} set)")
    ax.set_xlabel(f"mean halting step ({study.set_name}; fewer is cheaper)")
    ax.set_ylabel(f"halted accuracy ({study.set_name})")
    ax.grid(alpha=0.3)
    _scatter_by_status(ax, points, study.steps, study.accuracy)
    rule = front_rule(study)
    for i, bar in enumerate(rule.bars):
        ax.axhline(
            bar,
            color="tab:red",
            ls="--",
            lw=1,
            label="front needs a completed trial above this (chance + 3 standard errors)" if i == 0 else None,
        )
    on_front = points[front[points.index.to_numpy()]].sort_values(study.steps)
    if on_front.empty:
        above = f", halted accuracy above {' or '.join(f'{b:.4g}' for b in rule.bars)}" if rule.bars else ""
        why = "no trial passes the front's rule" if not rule.eligible else "the trials table marks none"
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 0.15 * (high - low))  # room for the note above the points
        ax.text(
            0.02,
            0.98,
            f"nothing ringed: {why}\n(eligible: completed{above})",
            transform=ax.transAxes,
            va="top",
            fontsize=9,
            color="tab:red",
            bbox={"facecolor": "white", "edgecolor": "tab:red", "alpha": 0.9},
        )
    else:
        source = "the trials table's pareto column" if has_pareto_column(trials) else "eligible trials"
        x, y = on_front[study.steps].astype(float), on_front[study.accuracy].astype(float)
        ax.plot(x, y, "-", color="black", lw=1.2, zorder=2)
        ax.scatter(
            x,
            y,
            s=180,
            facecolors="none",
            edgecolors="black",
            linewidths=1.6,
            zorder=4,
            label=f"Pareto front ({len(on_front)}; from {source})",
        )
        for i, (_, trial) in enumerate(on_front.iterrows()):
            ax.annotate(
                f"λp={num(trial.get('lambda_p'), 2)}",
                (float(trial[study.steps]), float(trial[study.accuracy])),
                textcoords="offset points",
                xytext=(8, -14) if i % 2 == 0 else (8, 6),
                fontsize=8,
            )
    ax.legend(fontsize=8, loc="lower right")
    return fig


def _halting_distribution(study: StudyData) -> Figure:
    """The best trial's halting distribution per evaluation set against its geometric prior."""
    ranked = study.ranked()
    if ranked.empty:
        raise _NoData(f"no completed or early-stopped trial has a finite {study.metric}")
    best = ranked.iloc[0]
    sets = [s for s in ("easy", "hard") if _floats(best.get(f"{s}/halting_distribution")) is not None]
    if not sets and _floats(best.get(f"{study.set_name}/halting_distribution")) is not None:
        sets = [study.set_name]
    if not sets:
        raise _NoData(f"the best trial {best['trial_id']} has no halting distribution")
    lambda_p = float(best["lambda_p"])
    tail = best.get("prior_tail")
    if not (isinstance(tail, str) and tail in _TAILS):  # a table without the column: the study's
        tail = study.spec.config.get("prior_tail", _config_default(study.spec.task, "prior_tail"))
    tail_name = str(tail) if isinstance(tail, str) and tail in _TAILS else None
    fig = Figure(figsize=(max(9.0, 5.5 * len(sets) + 1), 5.2), layout="constrained")
    fig.suptitle(f"{study.name}: halting distribution of the best trial by {study.metric}\n{_label(best)}")
    axes = fig.subplots(1, len(sets), sharey=True, squeeze=False)[0]
    for ax, set_name in zip(axes, sets, strict=True):
        p = _floats(best.get(f"{set_name}/halting_distribution"))
        assert p is not None
        steps = np.arange(1, len(p) + 1)
        log_prior = (
            log_geometric_prior(lambda_p, len(p))
            if tail_name is None
            else log_geometric_prior(lambda_p, len(p), cast(PriorTail, tail_name))
        )
        prior = log_prior.double().exp().numpy()
        ax.bar(steps, p, color="tab:blue", alpha=0.75, label="$p_n$ (mean over the set)")
        ax.plot(
            steps,
            prior,
            "o-",
            color="tab:red",
            lw=1.5,
            label=f"prior $p_G(\\lambda_p={lambda_p:.3g})$, N={len(p)}, tail: {tail_name or 'default'}",
        )
        ax.set_title(f"{set_name} set")
        ax.set_xlabel("step n")
        ax.set_xticks(steps if len(steps) <= 20 else steps[:: math.ceil(len(steps) / 20)])
        ax.set_ylabel("probability of halting at step n")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def _per_step_accuracy(study: StudyData) -> Figure:
    """Accuracy if the model halted at step n, for the top trials; beside it their halted,
    best-step and stable accuracy."""
    column = f"{study.set_name}/per_step_accuracy"
    top = [(t, acc) for _, t in study.ranked().iterrows() if (acc := _floats(t.get(column))) is not None][
        :TOP
    ]
    if not top:
        raise _NoData(f"no completed or early-stopped trial has {column} and a finite {study.metric}")
    fig = Figure(figsize=(14, 5.5), layout="constrained")
    ax, bars = fig.subplots(1, 2, width_ratios=(3, 2))
    ax.set_title(f"accuracy if halted at step n, top {len(top)} by {study.metric}")
    fig.suptitle(f"{study.name}: per-step accuracy ({study.set_name} set)")
    longest = 1
    for colour, (trial, acc) in zip(_TOP_COLOURS, top, strict=False):
        steps = np.arange(1, len(acc) + 1)
        longest = max(longest, len(acc))
        ax.plot(steps, acc, "o-", color=colour, lw=1.6, label=f"{_label(trial)} ({num(trial[study.metric])})")
    ticks = np.arange(1, longest + 1)
    ax.set_xticks(ticks if longest <= 20 else ticks[:: math.ceil(longest / 20)])
    ax.set_xlabel("halting step n")
    ax.set_ylabel(f"accuracy at step n ({study.set_name})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title=f"trial (its {study.metric})", title_fontsize=8)
    _accuracy_bars(bars, study, [trial for trial, _ in top])
    return fig


_ACCURACIES = (  # column of a set, label, bar colour: halted accuracy and what tells it honest
    ("halted_accuracy", "halted (at the sampled step)", "#404040"),
    ("best_step_accuracy", "best step (max over n)", "#9a9a9a"),
    ("stable_accuracy", "stable (right from the halting step on)", "#e0e0e0"),
)


def _accuracy_bars(ax: Axes, study: StudyData, trials: Sequence[pd.Series]) -> None:
    """Halted, best-step and stable accuracy side by side for each of ``trials`` (tick labels in
    the trials' colours of the per-step plot); halted accuracy far above the other two is an
    answer given by *where* the model halts."""
    x = np.arange(len(trials))
    width = 0.8 / len(_ACCURACIES)
    measured = False
    for i, (name, label, colour) in enumerate(_ACCURACIES):
        values = np.array([number(t.get(f"{study.set_name}/{name}")) for t in trials])
        measured |= name != "halted_accuracy" and bool(np.isfinite(values).any())
        offset = (i - (len(_ACCURACIES) - 1) / 2) * width
        ax.bar(x + offset, np.nan_to_num(values), width, color=colour, edgecolor="black", lw=0.6, label=label)
        for xi, v in zip(x + offset, values, strict=True):
            text = f"{v:.2f}" if math.isfinite(v) else "n/a"
            ax.text(xi, (v if math.isfinite(v) else 0.0) + 0.01, text, ha="center", va="bottom", fontsize=7)
    chance = CHANCE.get(study.spec.task)
    if chance is not None:
        ax.axhline(chance, color="tab:red", ls="--", lw=1, label=f"chance ({chance:g})")
    ax.set_xticks(x, [str(t["trial_id"]) for t in trials], fontsize=8)
    for tick, colour in zip(ax.get_xticklabels(), _TOP_COLOURS, strict=False):
        tick.set_color(colour)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel(f"accuracy ({study.set_name})")
    ax.set_title("halted, best-step and stable accuracy")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncols=2)  # below: no bar hidden
    if not measured:
        ax.text(
            0.5,
            0.55,
            "no best-step or stable accuracy recorded\n(trials written before Parquet schema 4)",
            transform=ax.transAxes,
            ha="center",
            fontsize=8,
            color="dimgray",
        )


def _learning_curves(study: StudyData) -> Figure:
    """The objective at each report against training iterations."""
    history = study.history
    if history is None:
        raise _NoData("the study has no history Parquet yet")
    curves = finite(history, "iteration", study.metric)
    if curves.empty or "trial_id" not in curves.columns:
        raise _NoData(f"no report has a finite {study.metric}")
    top = list(study.ranked()["trial_id"][:TOP])
    fig = Figure(figsize=(9.5, 5.5), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(f"{study.name}: {study.metric} during training")
    others = 0
    for trial_id, curve in curves.sort_values("iteration").groupby("trial_id", sort=True):
        if trial_id in top:
            continue
        ax.plot(
            curve["iteration"].astype(float),
            curve[study.metric].astype(float),
            ".-",
            color="gray",
            alpha=0.4,
            lw=1,
            markersize=4,
            label="other trials" if others == 0 else None,
        )
        others += 1
    trials = study.trials.set_index("trial_id", drop=False)
    for colour, trial_id in zip(_TOP_COLOURS, top, strict=False):
        curve = curves[curves["trial_id"] == trial_id].sort_values("iteration")
        if curve.empty:
            continue
        ax.plot(
            curve["iteration"].astype(float),
            curve[study.metric].astype(float),
            "o-",
            color=colour,
            lw=1.8,
            markersize=3,
            label=_label(trials.loc[trial_id]),
            zorder=3,
        )
    for i, milestone in enumerate(milestones(study.asha)):
        ax.axvline(
            milestone, color="black", ls=":", lw=0.8, alpha=0.5, label="ASHA rungs" if i == 0 else None
        )
    ax.set_xlabel("training iteration")
    ax.set_ylabel(study.metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title=f"top {len(top)} in colour", title_fontsize=8)
    return fig


def _asha(study: StudyData) -> Figure:
    """How many training iterations each trial ran, against the budget and ASHA's rungs."""
    trials = study.trials
    if trials.empty or "iteration" not in trials.columns:
        raise _NoData("the trials table has no trials yet")
    metric = pd.to_numeric(trials[study.metric], errors="coerce") if study.metric in trials else None
    order = trials.assign(
        _it=pd.to_numeric(trials["iteration"], errors="coerce").fillna(0),
        _m=(metric if metric is not None else 0.0),
    ).sort_values(["_it", "_m", "trial_id"], ascending=[True, study.spec.mode == "max", False])
    n = len(order)
    fig = Figure(figsize=(9.5, min(30.0, max(3.2, 0.3 * n + 1.8))), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(f"{study.name}: training iterations per trial (ASHA)")
    y = np.arange(n)
    colours = [style(s)[0] for s in order["status"]]
    ax.barh(y, order["_it"].astype(float), color=colours, height=0.7)
    if n <= 60:
        ax.set_yticks(y, [f"{t['trial_id']} λp={num(t.get('lambda_p'), 2)}" for _, t in order.iterrows()])
        ax.tick_params(axis="y", labelsize=8)
        for yi, (_, t) in zip(y, order.iterrows(), strict=True):
            if math.isfinite(t["_m"]) and metric is not None:
                ax.text(float(t["_it"]), float(yi), f" {num(t['_m'], 3)}", va="center", fontsize=7)
    else:
        ax.set_yticks([])
        ax.set_ylabel(f"{n} trials")
    budgets = pd.to_numeric(trials.get("iterations", pd.Series(dtype=float)), errors="coerce").dropna()
    budget = float(budgets.max()) if not budgets.empty else float(study.spec.iterations)
    ax.axvline(budget, color="tab:red", ls="--", lw=1.5, label=f"budget: {budget:g} iterations")
    rungs = milestones(study.asha)
    for i, (milestone, count) in enumerate(rungs.items()):
        ax.axvline(milestone, color="black", ls=":", lw=1, label="ASHA rungs" if i == 0 else None)
        ax.annotate(
            f"rung {milestone:g}\n{count} trials",
            (milestone, n - 0.45),
            xytext=(3, 0),
            textcoords="offset points",
            va="bottom",
            fontsize=7,
        )
    patches = [(style(s)[0], f"{s} ({int((order['status'] == s).sum())})") for s in statuses(order)]
    lines, labels = ax.get_legend_handles_labels()
    ax.legend(
        [*(Patch(color=c, label=text) for c, text in patches), *lines],
        [text for _, text in patches] + labels,
        fontsize=8,
        loc="lower right",
        title=f"numbers: final {study.metric}" if metric is not None else None,
        title_fontsize=7,
    )
    if rungs:
        ax.set_xlabel("training iterations run")
    elif study.spec.scheduler is None:
        ax.set_xlabel(
            "training iterations run (no ASHA: a multi-objective study runs every trial to its budget)"
        )
    else:
        ax.set_xlabel("training iterations run (no asha.json: ASHA's rungs not known)")
    ax.set_xlim(0, max(budget, float(order["_it"].max())) * 1.12)
    ax.set_ylim(-0.6, n + 0.5 if rungs else n - 0.4)  # room above the bars for the rung labels
    return fig


_PLOTTERS: dict[str, Callable[[StudyData], Figure]] = {
    "sensitivity": _sensitivity,
    "pareto": _pareto,
    "halting_distribution": _halting_distribution,
    "per_step_accuracy": _per_step_accuracy,
    "learning_curves": _learning_curves,
    "asha": _asha,
}
