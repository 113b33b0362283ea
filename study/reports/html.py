"""The report's ``index.html``: a summary of the study, which searched field mattered, the six
plots with their captions, the means and intervals over seeds and the top trials; relative links
only, no scripts, no external fonts or styles.
"""

from __future__ import annotations

import datetime
import html
import re
from collections.abc import Sequence
from typing import Any

import pandas as pd

from study.reports.data import PLOTS, TITLES, TOP, StudyData, front_rule, milestones, num, statuses
from study.reports.importance import EVALUATOR, SEED, Importances
from study.reports.seeds import GAP

__all__ = ["TABLE_ROWS", "index_html"]


TABLE_ROWS = 10
"""Trials in the index's table."""


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


def _captions(study: StudyData) -> dict[str, str]:
    """Each plot's caption: what it shows, and how to read it."""
    s, m = study.set_name, study.metric
    rungs = ", ASHA's rungs dotted" if milestones(study.asha) else ""
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
        f"mean halting step, coloured by status. {front_rule(study).text}",
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


def index_html(study: StudyData, missing: dict[str, str], importance: Importances | None = None) -> str:
    """The report's page: its summary, which searched field mattered, each plot with its caption
    (``missing``: why a plot has no data), the means over seeds and the top trials."""
    e = html.escape
    spec = study.spec
    ranked = study.ranked()
    seeds = study.seeds()
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
        *_summary(study, ranked, seeds),
        "</ul>",
        "</section>",
        _importance_html(importance) if importance is not None else "",
        *_plot_sections(study, missing),
    ]
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
        f"<code>{e(study.paths.trials_parquet)}</code> and "
        f"<code>{e(study.paths.table_dir('history'))}/</code>."
        "</footer>",
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(p for p in parts if p)


def _summary(study: StudyData, ranked: pd.DataFrame, seeds: pd.DataFrame) -> list[str]:
    """The summary's list items: the task, the trials by status, the objectives and budget, the
    search space, the best trial (of ``ranked``) and, where there are ``seeds``, their count."""
    e = html.escape
    spec, trials = study.spec, study.trials
    counts = trials["status"].value_counts() if "status" in trials.columns else pd.Series(dtype=int)
    by_status = ", ".join(f"{int(counts[s])} {s}" for s in statuses(trials)) if len(counts) else "none yet"
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
        f"<li>Best trial: {_best_line(study, ranked)}</li>",
    ]
    if not seeds.empty:
        keys = list(seeds.columns[: list(seeds.columns).index("metric")])
        configs = len(seeds.drop_duplicates(keys)) if keys else 1
        summary.append(
            f"<li>Seeds: {configs} configuration{'s' if configs != 1 else ''} run under "
            f"{_range(seeds['n'])} seeds; their means and 95 % intervals are in the table after the "
            "plots</li>"
        )
    return summary


def _best_line(study: StudyData, ranked: pd.DataFrame) -> str:
    """The best trial of ``ranked`` in one line of HTML: its id, status, hyperparameters, result."""
    e = html.escape
    if ranked.empty:
        return f"no completed or early-stopped trial has a finite {e(study.metric)} yet"
    b = ranked.iloc[0]
    return (
        f"<code>{e(str(b['trial_id']))}</code> ({e(str(b['status']))}): "
        f"lambda_p = {num(b.get('lambda_p'))}, beta = {num(b.get('beta'))}, "
        f"max_steps = {num(b.get('max_steps'))}; {e(study.metric)} = <b>{num(b[study.metric])}</b>"
        f" after {num(b.get('iteration'))} iterations, mean halting step {num(b.get(study.steps))}"
    )


def _plot_sections(study: StudyData, missing: dict[str, str]) -> list[str]:
    """A section for each plot: its title, its caption, why it has no data (``missing``), its PNG."""
    e = html.escape
    captions = _captions(study)
    parts: list[str] = []
    for key in PLOTS:
        title = TITLES[key][0].upper() + TITLES[key][1:]
        parts += [
            f'<section id="{key}">',
            f"<h2>{e(title)}</h2>",
            f"<p>{e(captions[key])}</p>",
        ]
        if key in missing:
            parts.append(f'<p class="nodata">No data: {e(missing[key])}.</p>')
        parts += [f'<img src="{key}.png" alt="{e(title)} for study {e(study.name)}">', "</section>"]
    return parts


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


def _top_table(study: StudyData, ranked: pd.DataFrame) -> str:
    """The best `TABLE_ROWS` trials of ``ranked`` as a table: their hyperparameters and metrics."""
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
        row: dict[str, Any] = {k: num(v) for k, v in zip(keys, values, strict=True)}
        row["seeds"] = seeds_run
        by_metric = part.set_index("metric")
        for metric in metrics:
            if metric not in by_metric.index:
                row[metric] = ""
                continue
            r = by_metric.loc[metric]
            n = f" (n={int(r['n'])})" if int(r["n"]) != seeds_run else ""
            row[metric] = f"{num(r['mean'])} [{num(r['low'])}, {num(r['high'])}]{n}"
        rows.append(row)
    text: str = pd.DataFrame(rows, columns=[*keys, "seeds", *metrics]).to_html(
        index=False, border=0, classes="seeds"
    )
    return _fitting(text)
