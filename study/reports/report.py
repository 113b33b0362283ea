"""A study's report: six plots and an ``index.html`` that shows them, from the study's files alone.

``write_report(name)`` reads what a study left under its storage root (the saved spec, the trials
and history Parquet, ASHA's ``asha.json``; local or ``s3://``, no Ray, no Tune) and writes a
directory that can be moved, mailed or served as it is: one PNG per plot and an ``index.html``
with relative links only, no scripts, no external fonts or styles::

    results/reports/<name>/index.html               summary, which searched field mattered
                                                    (`study.reports.importance`, from the Optuna journal),
                                                    the plots, means and 95 % intervals over seeds
                                                    (`study.reports.seeds`), the top 10 trials
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

The figures are drawn in `study.reports.plots`, the index written in `study.reports.html`, and
what both read, the study and its Pareto front's rule, is `study.reports.data`.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

from study.records.asha_state import read_state
from study.records.parquet import fill_config_defaults
from study.reports.data import PLOTS, StudyData, pareto_front
from study.reports.html import index_html
from study.reports.importance import Importances, importances
from study.spec.spec import NAME_PATTERN, SpecError, parse_spec
from study.storage.storage import StudyPaths, is_remote, join, read_bytes, read_study_table, write_bytes

__all__ = [
    "PLOTS",
    "Report",
    "ReportError",
    "load_study_data",
    "pareto_front",
    "write_report",
]


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
    """Which searched field mattered for each objective (`study.reports.importance`), or why not yet."""

    @property
    def drawn(self) -> int:
        """How many plots show data."""
        return len(self.plots) - len(self.missing)


def write_report(name: str, storage: str = "results", out: str | None = None) -> Report:
    """Write the report of study ``name`` under ``storage`` into ``out`` and return where.

    ``out`` defaults to ``<storage>/reports/<name>``, on an object store too (the report
    travels with the study; ``--out DIR`` puts it on this machine instead). An older report in
    the same directory is overwritten file by file, each file replaced whole.
    Raises `ReportError` when there is no such study or it has no trials Parquet yet.
    """
    from study.reports.plots import draw  # matplotlib and torch (ponder's prior): imported to draw

    study = load_study_data(name, storage)
    if out is None:
        out = join(storage, "reports", name)
    if not is_remote(out):
        out = out.removeprefix("file://")
        os.makedirs(out, exist_ok=True)
    plots: dict[str, str] = {}
    missing: dict[str, str] = {}
    for key in PLOTS:
        fig, why = draw(key, study)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=_DPI)
        path = join(out, f"{key}.png")
        _write(path, buffer.getvalue())
        plots[key] = path
        if why is not None:
            missing[key] = why
    index = join(out, "index.html")
    importance = importances(study.spec, study.paths)
    _write(index, index_html(study, missing, importance).encode())
    return Report(directory=out, index=index, plots=plots, missing=missing, importance=importance)


def load_study_data(name: str, storage: str) -> StudyData:
    """The study as the report (and `study.Study.plot`) reads it, or `ReportError` saying what to do."""
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
    return StudyData(name, spec, paths, trials, history, read_state(paths.asha), set_name)


_load = load_study_data


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
