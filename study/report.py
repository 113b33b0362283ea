"""A study's report: six plots and an ``index.html`` that shows them, from the study's files alone.

``write_report(name)`` reads what a study left under its storage root (the saved spec, the trials
and history Parquet, ASHA's ``asha.json``; local or ``s3://``, no Ray, no Tune) and writes a
directory that can be moved, mailed or served as it is: one PNG per plot and an ``index.html``
with relative links only, no scripts, no external fonts or styles::

    results/reports/<name>/index.html               summary, which searched field mattered
                                                    (`study.importance`, from the Optuna journal),
                                                    the plots, means and 95 % intervals over seeds
                                                    (`study.seeds`), the top 10 trials
    results/reports/<name>/sensitivity.png          accuracy and halting step against lambda_p;
                                                    per configuration, mean and 95 % interval over
                                                    seeds where a study repeats it under several
    results/reports/<name>/pareto.png               accuracy against thinking time, the front marked
    results/reports/<name>/halting_distribution.png the best trial's p_n against the prior p_G
    results/reports/<name>/per_step_accuracy.png    accuracy if halted at step n, top 5 trials;
                                                    their halted, best-step and stable accuracy
    results/reports/<name>/learning_curves.png      the objective against training iterations
    results/reports/<name>/asha.png                 how far ASHA let each trial run

A plot the study has no data for (an MNIST study has no ``easy``/``hard`` sets, a study whose
trials have not reported has no curves) is a placeholder PNG saying why, so the index always
shows all six. matplotlib is used through `matplotlib.figure.Figure` only: no pyplot, no global
backend, safe in a process that plots for something else too.
"""

from __future__ import annotations

import dataclasses
import datetime
import html
import io
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
from study.asha_state import read_state
from study.importance import EVALUATOR, SEED, Importances, importances
from study.parquet import chance_bar, fill_config_defaults, front_eligible, pareto_marks, ranked_trials
from study.seeds import GAP, SEED_METRICS, seed_intervals
from study.spec import NAME_PATTERN, SpecError, StudySpec, parse_spec
from study.storage import StudyPaths, is_remote, join, read_bytes, read_study_table, write_bytes

__all__ = [
    "PLOTS",
    "Report",
    "ReportError",
    "pareto_front",
    "write_report",
]

PLOTS = (
    "sensitivity",
    "pareto",
    "halting_distribution",
    "per_step_accuracy",
    "learning_curves",
    "asha",
)
"""The plot keys, in the order the index shows them; each is written as ``<key>.png``."""


TOP = 5
"""Trials drawn in colour in the per-step accuracy and learning curve plots."""

TABLE_ROWS = 10
"""Trials in the index's table."""

_STATUS_STYLE = {  # colour, marker: the same in every plot
    "completed": ("tab:blue", "o"),
    "early_stopped": ("tab:orange", "s"),
    "diverged": ("tab:red", "X"),
    "errored": ("tab:purple", "P"),
    "running": ("tab:gray", "^"),
    "pending": ("silver", "v"),
}
_OTHER_STYLE = ("black", "D")
_TOP_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
_TAILS = ("renormalise", "last_step", "truncate")
_DPI = 100


class ReportError(ValueError):
    """A report that cannot be written (no such study, no Parquet yet); one line saying what to do."""


@dataclass(frozen=True)
class Report:
    """Where a report was written."""

    directory: str
    """The report's directory (``<storage>/reports/<name>`` by default)."""
    index: str
    """The path of its ``index.html``."""
    plots: dict[str, str]
    """Plot key (`PLOTS`) -> the path of its PNG (a placeholder where there was no data)."""
    missing: dict[str, str]
    """Plot key -> why its PNG is a placeholder: the plots not drawn."""
    importance: Importances | None = None
    """Which searched field mattered for each objective (`study.importance`), or why not yet."""

    @property
    def drawn(self) -> int:
        """How many plots show data."""
        return len(self.plots) - len(self.missing)


class _NoData(Exception):
    """A plot the study has no data for; the message says why (it goes on the placeholder)."""


@dataclass(frozen=True)
class _Study:
    """What the plots read: the spec, both tables, ASHA's state, the evaluation set to plot."""

    name: str
    spec: StudySpec
    paths: StudyPaths
    trials: pd.DataFrame
    history: pd.DataFrame | None
    asha: Any
    set_name: str

    @property
    def metric(self) -> str:
        return self.spec.metric

    @property
    def accuracy(self) -> str:
        return f"{self.set_name}/halted_accuracy"

    @property
    def steps(self) -> str:
        return f"{self.set_name}/mean_halting_step"

    @property
    def best_step(self) -> str:
        return f"{self.set_name}/best_step_accuracy"

    @property
    def stable(self) -> str:
        return f"{self.set_name}/stable_accuracy"

    def ranked(self) -> pd.DataFrame:
        return ranked_trials(self.trials, self.metric, self.spec.mode)

    def seeds(self) -> pd.DataFrame:
        """Mean and 95 % interval over seeds per configuration (`seed_intervals`): grouped by the
        searched fields but the seed, and by lambda_p, which the sensitivity plot puts on its x
        axis (a constant where it is not searched, so it splits no configuration). Empty where
        the study repeats no configuration under two seeds or more."""
        metrics = [
            self.accuracy,
            self.best_step,
            self.stable,
            self.steps,
            *SEED_METRICS,
            *(m for m, _ in self.spec.objectives),
        ]
        by = ["lambda_p", *(d.name for d in self.spec.space)]
        return seed_intervals(self.trials, by=by, metrics=list(dict.fromkeys(metrics)))


# -- public -------------------------------------------------------------------------------------


def write_report(name: str, storage: str = "results", out: str | None = None) -> Report:
    """Write the report of study ``name`` under ``storage`` into ``out`` and return where.

    ``out`` defaults to ``<storage>/reports/<name>``, on an object store too (the report
    travels with the study; ``--out DIR`` puts it on this machine instead). An older report in
    the same directory is overwritten file by file, each file replaced whole.
    Raises `ReportError` when there is no such study or it has no trials Parquet yet.
    """
    study = _load(name, storage)
    if out is None:
        out = join(storage, "reports", name)
    if not is_remote(out):
        out = out.removeprefix("file://")
        os.makedirs(out, exist_ok=True)
    plots: dict[str, str] = {}
    missing: dict[str, str] = {}
    for key in PLOTS:
        fig, why = _draw(key, study)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=_DPI)
        path = join(out, f"{key}.png")
        _write(path, buffer.getvalue())
        plots[key] = path
        if why is not None:
            missing[key] = why
    index = join(out, "index.html")
    importance = importances(study.spec, study.paths)
    _write(index, _index_html(study, missing, importance).encode())
    return Report(directory=out, index=index, plots=plots, missing=missing, importance=importance)


def pareto_front(trials: pd.DataFrame, accuracy: str, steps: str) -> npt.NDArray[np.bool_]:
    """Which rows of ``trials`` the Pareto plot marks as the front, a bool per row.

    A trials table with a ``pareto`` column says so itself, and the plot marks the same trials
    as the table. A table written before that column gets the front the export would give it:
    the trials that ended with a result whose ``accuracy`` (max) and ``steps`` (min) no such
    trial beats on both.
    """
    if _has_pareto_column(trials):
        return np.array([bool(v) if isinstance(v, bool | np.bool_) else False for v in trials["pareto"]])
    if accuracy not in trials.columns or steps not in trials.columns:
        return np.zeros(len(trials), dtype=bool)
    records = trials.to_dict("records")
    return np.array(pareto_marks(records, [(accuracy, "max"), (steps, "min")]), dtype=bool)


def _has_pareto_column(trials: pd.DataFrame) -> bool:
    """Whether the table marks its Pareto front itself: a ``pareto`` column with a value in it."""
    if "pareto" not in trials.columns:
        return False
    return any(v is not None and v is not pd.NA and not _is_nan(v) for v in trials["pareto"])


@dataclass(frozen=True)
class _FrontRule:
    """The rule a trial must pass to be ringed in the Pareto plot, and what came of it."""

    text: str
    """The rule and how many trials pass it, for the caption."""
    bars: tuple[float, ...]
    """The halted accuracies an eligible trial must exceed (chance plus 3 standard errors)."""
    eligible: int
    """Plotted trials that pass the rule."""
    ringed: int
    """Trials ringed in the plot."""


def _front_rule(study: _Study) -> _FrontRule:
    """Which trials may be on the front (`front_eligible`: completed, above chance by 3 standard
    errors), in words, with how many pass and are ringed: a caption true of the plot it sits under."""
    trials = study.trials.reset_index(drop=True)
    from_column = _has_pareto_column(trials)
    objectives = (
        study.spec.front_objectives if from_column else ((study.accuracy, "max"), (study.steps, "min"))
    )
    accuracies = [m for m, _ in objectives if m.endswith("/halted_accuracy")]
    plotted = _finite(trials, study.steps, study.accuracy)
    records = plotted.to_dict("records")
    eligible = sum(front_eligible(r, objectives) for r in records)
    ringed = int(pareto_front(trials, study.accuracy, study.steps)[plotted.index.to_numpy()].sum())
    both = "both" if len(objectives) == 2 else "each"
    text = (
        f"The ringed trials are the Pareto front on {' and '.join(f'{m} ({mode})' for m, mode in objectives)}"
        f"{', as the trials table marks it' if from_column else ''}: the eligible trials no other "
        f"eligible trial beats on {both}. Eligible: completed, that is trained for the whole "
        f"{study.spec.iterations}-iteration budget (an early-stopped trial was measured on less training)"
    )
    bars: dict[float, int | None] = {}
    for r in records:
        value = _number(r.get("eval_samples"))
        size = int(value) if math.isfinite(value) else None
        bar = chance_bar(r.get("task", study.spec.task), size)
        if bar is not None:
            bars[bar] = size
    chance = CHANCE.get(study.spec.task)
    if accuracies and bars and chance is not None:
        sizes = set(bars.values())
        samples = f"{next(iter(sizes))}-sample " if len(sizes) == 1 and None not in sizes else ""
        text += (
            f", with {' and '.join(accuracies)} above chance ({chance:g}) by more than 3 standard errors "
            f"of its {samples}evaluation set: above {' or '.join(f'{b:.4g}' for b in sorted(bars))} "
            "(the dashed line)"
        )
    text += "."
    completed = [r for r in records if r.get("status") == "completed"]
    if ringed:
        text += f" {eligible} of {len(records)} trials pass this rule; {ringed} ringed."
    elif not completed:
        text += " No trial has completed its budget yet: none is eligible, nothing is ringed."
    elif not eligible:
        best = max((_number(r.get(study.accuracy)) for r in completed), default=math.nan)
        text += (
            f" No trial passes this rule (the best completed trial's {study.accuracy} is {_num(best)}), "
            "so nothing is ringed: there is no front yet."
        )
    else:
        text += f" {eligible} trials pass this rule, but the trials table marks none: nothing is ringed."
    shown = tuple(sorted(bars)) if study.accuracy in accuracies and chance is not None else ()
    return _FrontRule(text, shown, eligible, ringed)


# -- reading ------------------------------------------------------------------------------------


def _load(name: str, storage: str) -> _Study:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ReportError(f"{name!r} is not a study name: `ponder-study list` shows the studies")
    flag = "" if storage == "results" else f" --storage {storage}"
    paths = StudyPaths(storage, name)
    source = read_bytes(paths.spec)
    if source is None:
        raise ReportError(
            f"no study named {name!r} under {storage}: `ponder-study list{flag}` shows the studies there"
        )
    try:
        spec = parse_spec(source.decode(), name, origin=paths.spec)
    except (SpecError, UnicodeDecodeError) as exc:
        raise ReportError(f"study {name!r}: its saved spec does not read: {exc}") from exc
    table = read_study_table(paths, "trials")
    if table is None:
        raise ReportError(
            f"study {name!r} under {storage} has no trials Parquet yet: wait for a trial to end, "
            f"or write it from the Tune experiment with `ponder-study export {name}{flag}`"
        )
    trials = fill_config_defaults(table.to_pandas())  # a schema-2 study's nulls too
    history_table = read_study_table(paths, "history")
    history = None if history_table is None else history_table.to_pandas()
    set_name = spec.metric.partition("/")[0]
    if set_name == "train" or f"{set_name}/halted_accuracy" not in trials.columns:
        set_name = "test"  # a study on a training loss: plot the test set's halting
    return _Study(name, spec, paths, trials, history, read_state(paths.asha), set_name)


def _config_default(task: str, name: str) -> Any:
    """The default of a config field of ``task`` (None if the task's config has no such field)."""
    return next((f.default for f in dataclasses.fields(CONFIGS[task]) if f.name == name), None)


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _floats(value: Any) -> npt.NDArray[np.float64] | None:
    """A list cell as floats, or None for a null or empty one."""
    if value is None or _is_nan(value):
        return None
    arr = np.asarray(value, dtype=float)
    return arr if arr.ndim == 1 and arr.size > 0 else None


def _finite(df: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """The rows of ``df`` with a finite number in each of ``columns`` (none if one is absent)."""
    if any(c not in df.columns for c in columns):
        return df.iloc[:0]
    keep = np.ones(len(df), dtype=bool)
    for c in columns:
        keep &= np.isfinite(pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float))
    return df[keep]


def _milestones(asha: Any) -> dict[float, int]:
    """ASHA's rung milestones (training iterations) -> trials recorded there, from ``asha.json``."""
    rungs: dict[float, int] = {}
    try:
        for bracket in asha["brackets"]:
            for milestone, recorded in bracket:
                m = float(milestone)
                rungs[m] = rungs.get(m, 0) + len(recorded)
    except (KeyError, TypeError, ValueError):
        return {}
    return dict(sorted(rungs.items()))


# -- formatting ---------------------------------------------------------------------------------


def _num(value: Any, digits: int = 4) -> str:
    """A number for text: 4 significant digits, ``n/a`` for a null."""
    if value is None or value is pd.NA or _is_nan(value):
        return "n/a"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return f"{float(value):.{digits}g}"
    return str(value)


def _label(trial: pd.Series) -> str:
    """A trial in a legend: its id and the three hyperparameters PonderNet studies search."""
    return (
        f"{trial['trial_id']}: λp={_num(trial.get('lambda_p'), 3)}, "
        f"β={_num(trial.get('beta'), 2)}, N={_num(trial.get('max_steps'))}"
    )


def _style(status: Any) -> tuple[str, str]:
    return _STATUS_STYLE.get(str(status), _OTHER_STYLE)


def _statuses(df: pd.DataFrame) -> list[str]:
    """The statuses present in ``df``, in the contract's order, unknown ones last."""
    present = [str(s) for s in df["status"].dropna().unique()]
    return [s for s in _STATUS_STYLE if s in present] + sorted(s for s in present if s not in _STATUS_STYLE)


def _scatter_by_status(ax: Axes, df: pd.DataFrame, x: str, y: str) -> None:
    for status in _statuses(df):
        part = df[df["status"] == status]
        colour, marker = _style(status)
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


# -- plots --------------------------------------------------------------------------------------


def _draw(key: str, study: _Study) -> tuple[Figure, str | None]:
    """The figure for plot ``key``, or a placeholder and the reason there is no data."""
    draw: Callable[[_Study], Figure] = _PLOTTERS[key]
    try:
        return draw(study), None
    except _NoData as exc:
        return _placeholder(study, key, str(exc)), str(exc)


def _placeholder(study: _Study, key: str, why: str) -> Figure:
    fig = Figure(figsize=(8, 3), layout="constrained")
    fig.suptitle(f"{study.name}: {_TITLES[key]}")
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(0.5, 0.5, f"no data: {why}", ha="center", va="center", wrap=True, fontsize=11, color="dimgray")
    return fig


def _sensitivity(study: _Study) -> Figure:
    """Halted accuracy and mean halting step against lambda_p, as the PonderNet paper plots them."""
    panels = [(study.accuracy, "halted accuracy"), (study.steps, "mean halting step")]
    if all(_finite(study.trials, "lambda_p", col).empty for col, _ in panels):
        raise _NoData(f"no trial has a finite lambda_p and {study.accuracy} or {study.steps}")
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    fig.suptitle(f"{study.name}: sensitivity to $\\lambda_p$ ({study.set_name} set)")
    axes = fig.subplots(1, 2, sharex=True)
    seeds = study.seeds()
    for ax, (col, what) in zip(axes, panels, strict=True):
        df = _finite(study.trials, "lambda_p", col)
        ax.set_xlabel("$\\lambda_p$ (prior's halting probability per step)")
        ax.set_ylabel(f"{what} ({study.set_name})")
        ax.set_title(what)
        ax.grid(alpha=0.3)
        if df.empty:
            ax.text(0.5, 0.5, f"no trial has a finite {col}", transform=ax.transAxes, ha="center")
            continue
        _scatter_by_status(ax, df, "lambda_p", col)
        intervals = _finite(seeds[seeds["metric"] == col], "lambda_p") if not seeds.empty else seeds
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
        name = ", ".join(f"{k}={_num(v, 3)}" for k, v in zip(others, values, strict=True))
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


def _pareto(study: _Study) -> Figure:
    """Halted accuracy against mean halting step, every trial, the Pareto front marked."""
    trials = study.trials.reset_index(drop=True)
    front = pareto_front(trials, study.accuracy, study.steps)
    finite = _finite(trials, study.steps, study.accuracy)
    if finite.empty:
        raise _NoData(f"no trial has both a finite {study.accuracy} and {study.steps}")
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(f"{study.name}: accuracy against thinking time ({study.set_name} set)")
    ax.set_xlabel(f"mean halting step ({study.set_name}; fewer is cheaper)")
    ax.set_ylabel(f"halted accuracy ({study.set_name})")
    ax.grid(alpha=0.3)
    _scatter_by_status(ax, finite, study.steps, study.accuracy)
    rule = _front_rule(study)
    for i, bar in enumerate(rule.bars):
        ax.axhline(
            bar,
            color="tab:red",
            ls="--",
            lw=1,
            label="front needs a completed trial above this (chance + 3 standard errors)" if i == 0 else None,
        )
    on_front = finite[front[finite.index.to_numpy()]].sort_values(study.steps)
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
        source = "the trials table's pareto column" if _has_pareto_column(trials) else "eligible trials"
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
                f"λp={_num(trial.get('lambda_p'), 2)}",
                (float(trial[study.steps]), float(trial[study.accuracy])),
                textcoords="offset points",
                xytext=(8, -14) if i % 2 == 0 else (8, 6),
                fontsize=8,
            )
    ax.legend(fontsize=8, loc="lower right")
    return fig


def _halting_distribution(study: _Study) -> Figure:
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


def _per_step_accuracy(study: _Study) -> Figure:
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
        ax.plot(
            steps, acc, "o-", color=colour, lw=1.6, label=f"{_label(trial)} ({_num(trial[study.metric])})"
        )
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


def _accuracy_bars(ax: Axes, study: _Study, trials: Sequence[pd.Series]) -> None:
    """Halted, best-step and stable accuracy side by side for each of ``trials`` (tick labels in
    the trials' colours of the per-step plot); halted accuracy far above the other two is an
    answer given by *where* the model halts."""
    x = np.arange(len(trials))
    width = 0.8 / len(_ACCURACIES)
    measured = False
    for i, (name, label, colour) in enumerate(_ACCURACIES):
        values = np.array([_number(t.get(f"{study.set_name}/{name}")) for t in trials])
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


def _number(value: Any) -> float:
    """A cell as a float, NaN for a null or a non-number."""
    try:
        return float(value) if value is not None and value is not pd.NA else math.nan
    except (TypeError, ValueError):
        return math.nan


def _learning_curves(study: _Study) -> Figure:
    """The objective at each report against training iterations."""
    history = study.history
    if history is None:
        raise _NoData("the study has no history Parquet yet")
    curves = _finite(history, "iteration", study.metric)
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
    for i, milestone in enumerate(_milestones(study.asha)):
        ax.axvline(
            milestone, color="black", ls=":", lw=0.8, alpha=0.5, label="ASHA rungs" if i == 0 else None
        )
    ax.set_xlabel("training iteration")
    ax.set_ylabel(study.metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title=f"top {len(top)} in colour", title_fontsize=8)
    return fig


def _asha(study: _Study) -> Figure:
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
    colours = [_style(s)[0] for s in order["status"]]
    ax.barh(y, order["_it"].astype(float), color=colours, height=0.7)
    if n <= 60:
        ax.set_yticks(y, [f"{t['trial_id']} λp={_num(t.get('lambda_p'), 2)}" for _, t in order.iterrows()])
        ax.tick_params(axis="y", labelsize=8)
        for yi, (_, t) in zip(y, order.iterrows(), strict=True):
            if math.isfinite(t["_m"]) and metric is not None:
                ax.text(float(t["_it"]), float(yi), f" {_num(t['_m'], 3)}", va="center", fontsize=7)
    else:
        ax.set_yticks([])
        ax.set_ylabel(f"{n} trials")
    budgets = pd.to_numeric(trials.get("iterations", pd.Series(dtype=float)), errors="coerce").dropna()
    budget = float(budgets.max()) if not budgets.empty else float(study.spec.iterations)
    ax.axvline(budget, color="tab:red", ls="--", lw=1.5, label=f"budget: {budget:g} iterations")
    rungs = _milestones(study.asha)
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
    patches = [(_style(s)[0], f"{s} ({int((order['status'] == s).sum())})") for s in _statuses(order)]
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


_PLOTTERS: dict[str, Callable[[_Study], Figure]] = {
    "sensitivity": _sensitivity,
    "pareto": _pareto,
    "halting_distribution": _halting_distribution,
    "per_step_accuracy": _per_step_accuracy,
    "learning_curves": _learning_curves,
    "asha": _asha,
}

_TITLES = {
    "sensitivity": "sensitivity to lambda_p",
    "pareto": "accuracy against thinking time",
    "halting_distribution": "halting distribution of the best trial",
    "per_step_accuracy": "accuracy if halted at step n; halted, best-step and stable accuracy",
    "learning_curves": "learning curves",
    "asha": "training iterations per trial (ASHA)",
}


# -- index.html ---------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2em; }
section { margin: 2em 0; }
img { max-width: 100%; border: 1px solid #ddd; }
code { background: #f3f3f3; padding: 0 0.25em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { padding: 0.25em 0.6em; border-bottom: 1px solid #ddd; text-align: right; }
th { background: #f3f3f3; vertical-align: bottom; }
.wide { max-width: 100%; overflow-x: auto; }
.nodata { color: #a33; }
.pending { color: #777; }
table.importance { margin: 0.5em 0 1em; }
table.importance caption { text-align: left; font-weight: bold; }
table.importance td:first-child { text-align: left; }
.bar { display: inline-block; height: 0.8em; background: #4878a8; }
footer { color: #777; font-size: 0.85em; margin-top: 3em; }
"""


def _captions(study: _Study) -> dict[str, str]:
    s, m = study.set_name, study.metric
    rungs = ", ASHA's rungs dotted" if _milestones(study.asha) else ""
    spread = (
        "where the study repeats a configuration under several seeds, the diamonds are each "
        "configuration's mean over its seeds and the bars its 95 % interval (Student t), one line per "
        "value of the searched fields other than lambda_p and seed (the table below gives the numbers)."
        if not study.seeds().empty
        else "where several trials share a lambda_p value (seeds), the line is their mean and the bars "
        "their range."
    )
    return {
        "sensitivity": f"Halted accuracy and mean halting step on the {s} set against lambda_p, one point "
        f"per trial coloured by status; {spread}",
        "pareto": f"Accuracy against thinking time on the {s} set: each trial's halted accuracy against its "
        f"mean halting step, coloured by status. {_front_rule(study).text}",
        "halting_distribution": "The best trial's halting distribution p_n (bars, the mean over the set) "
        "against the geometric prior p_G(lambda_p) truncated at max_steps that its loss pulls it towards.",
        "per_step_accuracy": f"Accuracy on the {s} set if the model halted at step n, for the top {TOP} "
        f"trials by {m}; beside it, for the same trials, halted accuracy (at the sampled halting step), "
        "best-step accuracy (the best step's, what the network knows without choosing a step) and stable "
        "accuracy (right at the halting step and every later one). Halted accuracy far above both is "
        "the shortcut of answering through where it halts.",
        "learning_curves": f"{m} at each report against training iterations: the top {TOP} trials in "
        f"colour, the others in grey{rungs}.",
        "asha": "Training iterations each trial ran before it reached the budget (dashed) or ASHA stopped it "
        "at a rung (dotted), coloured by status.",
    }


def _index_html(study: _Study, missing: dict[str, str], importance: Importances | None = None) -> str:
    e = html.escape
    spec, trials = study.spec, study.trials
    counts = trials["status"].value_counts() if "status" in trials.columns else pd.Series(dtype=int)
    by_status = ", ".join(f"{int(counts[s])} {s}" for s in _statuses(trials)) if len(counts) else "none yet"
    ranked = study.ranked()
    if ranked.empty:
        best_line = f"no completed or early-stopped trial has a finite {e(study.metric)} yet"
    else:
        b = ranked.iloc[0]
        best_line = (
            f"<code>{e(str(b['trial_id']))}</code> ({e(str(b['status']))}): "
            f"lambda_p = {_num(b.get('lambda_p'))}, beta = {_num(b.get('beta'))}, "
            f"max_steps = {_num(b.get('max_steps'))}; {e(study.metric)} = <b>{_num(b[study.metric])}</b>"
            f" after {_num(b.get('iteration'))} iterations, mean halting step {_num(b.get(study.steps))}"
        )
    space = "; ".join(
        f"{d.name} in {list(d.values or ())}"
        if d.categorical
        else f"{d.name} in [{d.low:g}, {d.high:g}]{' (log)' if d.log else ''}"
        for d in spec.space
    )
    fixed = ", ".join(f"{k} = {v}" for k, v in spec.config.items())
    objectives = ", ".join(f"{m} ({mode})" for m, mode in spec.objectives)
    sched = spec.scheduler
    asha = (
        "no ASHA (every trial runs its budget)"
        if sched is None
        else f"ASHA grace period {sched.grace_period}, reduction factor {sched.reduction_factor:g}"
    )
    summary = [
        f"<li>Task: <b>{e(spec.task)}</b>{e(f' ({fixed})' if fixed else '')}</li>",
        f"<li>Trials: {len(trials)} ({e(by_status)})</li>",
        f"<li>{'Objectives' if len(spec.objectives) > 1 else 'Objective'}: {e(objectives)}; budget "
        f"{spec.iterations} iterations, reports every {spec.eval_interval}; {e(asha)}</li>",
        f"<li>Searched ({e(spec.search.sampler)} sampler): {e(space)}</li>",
        f"<li>Best trial: {best_line}</li>",
    ]
    seeds = study.seeds()
    if not seeds.empty:
        keys = list(seeds.columns[: list(seeds.columns).index("metric")])
        configs = len(seeds.drop_duplicates(keys)) if keys else 1
        summary.append(
            f"<li>Seeds: {configs} configuration{'s' if configs != 1 else ''} run under "
            f"{_range(seeds['n'])} seeds; their means and 95 % intervals are in the table after the "
            "plots</li>"
        )
    parts = [
        "<!doctype html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{e(study.name)}: ponder-study report</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>Study {e(study.name)}</h1>",
        f"<p>{e(spec.description)}</p>" if spec.description else "",
        '<section id="summary">',
        "<h2>Summary</h2>",
        "<ul>",
        *summary,
        "</ul>",
        "</section>",
        _importance_html(importance) if importance is not None else "",
    ]
    captions = _captions(study)
    for key in PLOTS:
        title = _TITLES[key][0].upper() + _TITLES[key][1:]
        parts += [
            f'<section id="{key}">',
            f"<h2>{e(title)}</h2>",
            f"<p>{e(captions[key])}</p>",
        ]
        if key in missing:
            parts.append(f'<p class="nodata">No data: {e(missing[key])}.</p>')
        parts += [f'<img src="{key}.png" alt="{e(title)} for study {e(study.name)}">', "</section>"]
    if not seeds.empty:
        parts += [
            '<section id="seeds">',
            "<h2>Mean and 95 % interval over seeds</h2>",
            f"<p>{e(_SEEDS_CAPTION)}</p>",
            _seeds_table(seeds),
            "</section>",
        ]
    parts += [
        '<section id="top">',
        f"<h2>Top {TABLE_ROWS} trials by {e(study.metric)}</h2>",
        _top_table(study, ranked),
        "</section>",
        f"<footer>Written {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} from "
        f"<code>{e(study.paths.trials_parquet)}</code> and <code>{e(study.paths.history_parquet)}</code>."
        "</footer>",
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(p for p in parts if p)


def _importance_html(importance: Importances) -> str:
    """The section that says which searched field mattered, one table per objective."""
    e = html.escape
    parts = ['<section id="importance">', "<h2>Which searched field mattered</h2>"]
    if importance.why is not None:
        parts.append(f'<p class="pending">Importance {e(importance.why)}.</p>')
        return "\n".join([*parts, "</section>"])
    parts.append(
        f"<p>{EVALUATOR} importance (Optuna, seed {SEED}): the share of the objective's variance over "
        f"the {importance.counted} trials Optuna holds complete that each searched field explains. "
        "Trials ASHA stopped count at the value they were stopped on; diverged, errored and running "
        "trials do not count.</p>"
    )
    for r in importance.results:
        rows = "".join(
            f"<tr><td>{e(name)}</td><td>{value:.3f}</td>"
            f'<td><span class="bar" style="width:{max(1, round(200 * value))}px"></span></td></tr>'
            for name, value in r.values.items()
        )
        parts.append(
            f'<table class="importance"><caption>{e(r.objective)} ({e(r.mode)})</caption>'
            f"<tr><th>field</th><th>importance</th><th></th></tr>{rows}</table>"
        )
    return "\n".join([*parts, "</section>"])


def _top_table(study: _Study, ranked: pd.DataFrame) -> str:
    if ranked.empty:
        return f"<p>No completed or early-stopped trial has a finite {html.escape(study.metric)} yet.</p>"
    searched = [d.name for d in study.spec.space]
    wanted: Sequence[str] = [
        "trial_id",
        "status",
        *dict.fromkeys(["lambda_p", "beta", "max_steps", *searched]),
        "iteration",
        *dict.fromkeys(
            [
                study.metric,
                *(m for m, _ in study.spec.objectives),
                study.accuracy,
                study.best_step,
                study.stable,
                study.steps,
            ]
        ),
        "nan_events",
    ]
    columns = [c for c in dict.fromkeys(wanted) if c in ranked.columns]
    table = ranked[columns].head(TABLE_ROWS).copy()
    table.insert(0, "rank", range(1, len(table) + 1))
    text: str = table.to_html(
        index=False, na_rep="", border=0, float_format=lambda v: f"{v:.4g}", classes="trials"
    )
    return _fitting(text)


def _fitting(table: str) -> str:
    """A pandas HTML table that fits the page: a metric's header may break after ``/`` and ``_``
    (``test/<wbr>halted_<wbr>accuracy``), and a table still too wide scrolls in its own box."""

    def breakable(header: re.Match[str]) -> str:
        name = header[2]
        return header[1] + (re.sub(r"([/_])(?=.)", r"\1<wbr>", name) if "/" in name else name) + header[3]

    return f'<div class="wide">{re.sub(r"(<th[^>]*>)([^<]*)(</th>)", breakable, table)}</div>'


_SEEDS_CAPTION = (
    "One row per configuration (the searched fields but the seed) run under two seeds or more, "
    "trials that ended with a result only. Each cell: the mean over the seeds, then the 95 % "
    "interval mean ± t(0.975, n−1)·sd/√n in brackets; n, the number of seeds, where a metric has "
    f"fewer values than the row. {GAP}: each trial's easy minus hard mean halting step, then "
    "averaged (negative: hard inputs take more steps)."
)


def _range(counts: pd.Series) -> str:
    """``3`` or ``2-3``: the smallest and largest of some counts."""
    low, high = int(counts.min()), int(counts.max())
    return str(low) if low == high else f"{low}-{high}"


def _seeds_table(seeds: pd.DataFrame) -> str:
    """`seed_intervals`' rows as one row per configuration, one column per metric."""
    keys = list(seeds.columns[: list(seeds.columns).index("metric")])
    metrics = list(dict.fromkeys(seeds["metric"]))
    rows: list[dict[str, Any]] = []
    groups = seeds.groupby(keys, sort=False, dropna=False) if keys else [((), seeds)]
    for key, part in groups:
        values = key if isinstance(key, tuple) else (key,)
        seeds_run = int(part["n"].max())
        row: dict[str, Any] = {k: _num(v) for k, v in zip(keys, values, strict=True)}
        row["seeds"] = seeds_run
        by_metric = part.set_index("metric")
        for metric in metrics:
            if metric not in by_metric.index:
                row[metric] = ""
                continue
            r = by_metric.loc[metric]
            n = f" (n={int(r['n'])})" if int(r["n"]) != seeds_run else ""
            row[metric] = f"{_num(r['mean'])} [{_num(r['low'])}, {_num(r['high'])}]{n}"
        rows.append(row)
    text: str = pd.DataFrame(rows, columns=[*keys, "seeds", *metrics]).to_html(
        index=False, border=0, classes="seeds"
    )
    return _fitting(text)


def _write(path: str, data: bytes) -> None:
    """Replace ``path`` whole: a reader (or a browser refreshing the page) never sees half a file."""
    if is_remote(path):
        write_bytes(path, data)  # one PUT
        return
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
