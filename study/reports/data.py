"""The study as its report reads it (`StudyData`, from the study's files alone), the helpers that
read and format its cells, the trial statuses' styles, and the rule of the Pareto front the
report rings (`pareto_front`, `front_rule`): what the plots and the index share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ponder.metrics import CHANCE
from study.records.ranking import chance_bar, front_eligible, pareto_marks, ranked_trials
from study.reports.seeds import SEED_METRICS, seed_intervals
from study.spec.spec import StudySpec
from study.storage.storage import StudyPaths

__all__ = [
    "PLOTS",
    "STATUS_STYLE",
    "TITLES",
    "TOP",
    "FrontRule",
    "StudyData",
    "finite",
    "front_rule",
    "has_pareto_column",
    "is_nan",
    "milestones",
    "num",
    "number",
    "pareto_front",
    "statuses",
    "style",
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


STATUS_STYLE = {  # colour, marker: the same in every plot
    "completed": ("tab:blue", "o"),
    "early_stopped": ("tab:orange", "s"),
    "diverged": ("tab:red", "X"),
    "errored": ("tab:purple", "P"),
    "running": ("tab:gray", "^"),
    "pending": ("silver", "v"),
}


_OTHER_STYLE = ("black", "D")
"""The colour and marker of a status not in `STATUS_STYLE`."""


TITLES = {
    "sensitivity": "sensitivity to lambda_p",
    "pareto": "accuracy against thinking time",
    "halting_distribution": "halting distribution of the best trial",
    "per_step_accuracy": "accuracy if halted at step n; halted, best-step and stable accuracy",
    "learning_curves": "learning curves",
    "asha": "training iterations per trial (ASHA)",
}
"""Each plot's title: its section's heading in the index, its placeholder's title."""


@dataclass(frozen=True)
class StudyData:
    """What the plots and the index read: the spec, both tables, ASHA's state, the evaluation set
    to plot."""

    name: str
    spec: StudySpec
    paths: StudyPaths
    trials: pd.DataFrame
    history: pd.DataFrame | None
    asha: Any
    set_name: str

    @property
    def metric(self) -> str:
        """The primary objective's metric."""
        return self.spec.metric

    @property
    def accuracy(self) -> str:
        """The plotted set's halted accuracy column."""
        return f"{self.set_name}/halted_accuracy"

    @property
    def steps(self) -> str:
        """The plotted set's mean halting step column."""
        return f"{self.set_name}/mean_halting_step"

    @property
    def best_step(self) -> str:
        """The plotted set's best-step accuracy column."""
        return f"{self.set_name}/best_step_accuracy"

    @property
    def stable(self) -> str:
        """The plotted set's stable accuracy column."""
        return f"{self.set_name}/stable_accuracy"

    def ranked(self) -> pd.DataFrame:
        """The trials with a result, best first by the primary objective (`ranked_trials`)."""
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


def pareto_front(trials: pd.DataFrame, accuracy: str, steps: str) -> npt.NDArray[np.bool_]:
    """Which rows of ``trials`` the Pareto plot marks as the front, a bool per row.

    A trials table with a ``pareto`` column says so itself, and the plot marks the same trials
    as the table. A table written before that column gets the front the export would give it:
    the trials that ended with a result whose ``accuracy`` (max) and ``steps`` (min) no such
    trial beats on both.
    """
    if has_pareto_column(trials):
        return np.array([bool(v) if isinstance(v, bool | np.bool_) else False for v in trials["pareto"]])
    if accuracy not in trials.columns or steps not in trials.columns:
        return np.zeros(len(trials), dtype=bool)
    records = trials.to_dict("records")
    return np.array(pareto_marks(records, [(accuracy, "max"), (steps, "min")]), dtype=bool)


def has_pareto_column(trials: pd.DataFrame) -> bool:
    """Whether the table marks its Pareto front itself: a ``pareto`` column with a value in it."""
    if "pareto" not in trials.columns:
        return False
    return any(v is not None and v is not pd.NA and not is_nan(v) for v in trials["pareto"])


@dataclass(frozen=True)
class FrontRule:
    """The rule a trial must pass to be ringed in the Pareto plot, and what came of it."""

    text: str
    """The rule and how many trials pass it, for the caption."""
    bars: tuple[float, ...]
    """The halted accuracies an eligible trial must exceed (chance plus 3 standard errors)."""
    eligible: int
    """Plotted trials that pass the rule."""
    ringed: int
    """Trials ringed in the plot."""


def front_rule(study: StudyData) -> FrontRule:
    """Which trials may be on the front (`front_eligible`: completed, above chance by 3 standard
    errors), in words, with how many pass and are ringed: a caption true of the plot it sits under."""
    trials = study.trials.reset_index(drop=True)
    from_column = has_pareto_column(trials)
    objectives = (
        study.spec.front_objectives if from_column else ((study.accuracy, "max"), (study.steps, "min"))
    )
    accuracies = [m for m, _ in objectives if m.endswith("/halted_accuracy")]
    plotted = finite(trials, study.steps, study.accuracy)
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
        value = number(r.get("eval_samples"))
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
        best = max((number(r.get(study.accuracy)) for r in completed), default=math.nan)
        text += (
            f" No trial passes this rule (the best completed trial's {study.accuracy} is {num(best)}), "
            "so nothing is ringed: there is no front yet."
        )
    else:
        text += f" {eligible} trials pass this rule, but the trials table marks none: nothing is ringed."
    shown = tuple(sorted(bars)) if study.accuracy in accuracies and chance is not None else ()
    return FrontRule(text, shown, eligible, ringed)


def is_nan(v: Any) -> bool:
    """Whether ``v`` is a float NaN (a null cell of a float column)."""
    return isinstance(v, float) and math.isnan(v)


def finite(df: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """The rows of ``df`` with a finite number in each of ``columns`` (none if one is absent)."""
    if any(c not in df.columns for c in columns):
        return df.iloc[:0]
    keep = np.ones(len(df), dtype=bool)
    for c in columns:
        keep &= np.isfinite(pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float))
    return df[keep]


def number(value: Any) -> float:
    """A cell as a float, NaN for a null or a non-number."""
    try:
        return float(value) if value is not None and value is not pd.NA else math.nan
    except (TypeError, ValueError):
        return math.nan


def milestones(asha: Any) -> dict[float, int]:
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


def num(value: Any, digits: int = 4) -> str:
    """A number for text: 4 significant digits, ``n/a`` for a null."""
    if value is None or value is pd.NA or is_nan(value):
        return "n/a"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return f"{float(value):.{digits}g}"
    return str(value)


def style(status: Any) -> tuple[str, str]:
    """The colour and marker of a trial status, the same in every plot."""
    return STATUS_STYLE.get(str(status), _OTHER_STYLE)


def statuses(df: pd.DataFrame) -> list[str]:
    """The statuses present in ``df``, in the contract's order, unknown ones last."""
    present = [str(s) for s in df["status"].dropna().unique()]
    return [s for s in STATUS_STYLE if s in present] + sorted(s for s in present if s not in STATUS_STYLE)
