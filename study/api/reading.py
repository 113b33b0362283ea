"""`Study`: a study read from its files, as ``ponder-study status``, ``report`` and ``evaluate``
read it, and by the same functions; `load`, `list_studies`, `list_specs`.

No Ray: a study is read on any machine that reaches its storage (a local folder, a copy moved
elsewhere, ``s3://...``), and while a driver runs it in another process: every method reads
what has been written at the moment it is called, and `Study.freshness` says how current that
is. Torch is imported only for `Study.model`, `Study.evaluate` and the plots.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from study.api.specs import StorageLike, check_storage, given_storage
from study.records.records import StudyError, load_study_spec
from study.spec.spec import StudySpec, check_name
from study.spec.spec import list_specs as _list_specs
from study.storage.hints import DEFAULT_STORAGE, count
from study.storage.storage import (
    StudyPaths,
    parquet_state,
    read_bytes,
    read_study_table,
    resolve,
    table_files,
)
from study.storage.storage import list_studies as _list_studies

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    from matplotlib.figure import Figure

    from ponder.model import PonderNet
    from study.reports.evaluate import Evaluation
    from study.reports.importance import Importances
    from study.reports.report import Report

__all__ = ["Freshness", "Study", "import_optuna", "list_specs", "list_studies", "load"]


@dataclass(frozen=True)
class Freshness:
    """How current a study's tables were when they were read."""

    read_at: datetime
    """When this was read (UTC)."""
    written_at: datetime | None
    """When the Parquet was last written: at most ``[run] parquet_refresh_s`` apart while the study
    runs, whole at a run's end (`study.storage.storage.parquet_state`); None before any write."""
    statuses: dict[str, int]
    """Trials by status, as `Study.trials` reads them now."""
    not_in_parquet: int
    """Ended trials the Parquet lacks yet (the driver writes them at its next refresh):
    `Study.trials` shows them from their end records."""
    driver: str | None
    """Who drives the study now (its lease's holder), or None: nothing is running it."""

    def __str__(self) -> str:
        trials = sum(self.statuses.values())
        line = f"read at {self.read_at:%Y-%m-%d %H:%M:%S} UTC: {count(trials, 'trial')}"
        if self.statuses:
            line += " (" + ", ".join(f"{n} {s}" for s, n in self.statuses.items()) + ")"
        if self.written_at is not None:
            ago = (self.read_at - self.written_at).total_seconds()
            line += f"; the Parquet was written {max(ago, 0):.0f} s before"
        if self.not_in_parquet:
            line += f", without {self.not_in_parquet} ended (read from their records)"
        running = f"running now: {self.driver}" if self.driver else "no driver is running it"
        return f"{line}; {running}"


class Study:
    """A study under its storage, read from its files: what `study.load`, `study.run` and
    `study.resume` return. Each method reads the files anew (a running study grows)."""

    spec: StudySpec
    """The spec the study was started with (its saved ``spec.toml``)."""
    paths: StudyPaths
    """Where its files are: ``paths.trials_parquet``, ``paths.experiment`` (Tune's), ..."""

    def __init__(self, spec: StudySpec, paths: StudyPaths) -> None:
        self.spec = spec
        self.paths = paths

    @property
    def name(self) -> str:
        """The study's name."""
        return self.paths.name

    @property
    def storage(self) -> str:
        """The storage it lives under (a folder or a URI)."""
        return self.paths.root

    @property
    def metric(self) -> str:
        """The primary objective's metric: what "best" means unless told otherwise."""
        return self.spec.metric

    @property
    def mode(self) -> str:
        """``"max"`` or ``"min"``: the primary objective's direction."""
        return self.spec.mode

    def trials(self) -> pd.DataFrame:
        """One row per trial, with the trials Parquet's columns: ``trial_id``, ``status``, every
        config field, every metric's final value, ``best/<metric>``, the timings, ``error``, ...
        (docs/parquet.md). As ``ponder-study status`` reads it: an ended trial the Parquet lacks
        yet comes from its end record, a pending one that has reported shows ``running``. Empty
        before any trial has ended."""
        import pandas as pd

        from study.reports.summary import current_trials

        df, _ = current_trials(self.paths)
        return pd.DataFrame() if df is None else df.reset_index(drop=True)

    def history(self) -> pd.DataFrame:
        """One row per report of every ended trial (the history Parquet): ``trial_id``,
        ``report``, ``iteration``, ``outcome``, the timings, every metric. Empty before any
        trial has ended."""
        import pandas as pd

        table = read_study_table(self.paths, "history")
        return pd.DataFrame() if table is None else table.to_pandas()

    def best(self, metric: str | None = None, mode: str | None = None) -> pd.Series:
        """The best trial's row of `trials`: among those that ended with a result (completed or
        stopped by ASHA) and a finite ``metric``, the top by ``mode``, ties by trial id: the rule
        ``status``, ``report`` and ``evaluate`` rank by. ``metric`` defaults to the study's
        objective; ``mode`` to that objective's direction (required for another metric).
        Raises `StudyError` when no trial has such a result yet."""
        from study.records.ranking import ENDED_WITH_RESULT, ranked_trials

        metric = metric or self.metric
        if mode is None:
            mode = dict(self.spec.objectives).get(metric)
            if mode is None:
                raise StudyError(f"mode: {metric} is not this study's objective; pass mode='max' or 'min'")
        if mode not in ("max", "min"):
            raise StudyError(f"mode must be 'max' or 'min', got {mode!r}")
        ranked = ranked_trials(self.trials(), metric, mode)
        if ranked.empty:
            ended = " or ".join(ENDED_WITH_RESULT)
            raise StudyError(f"study {self.name!r} has no {ended} trial with a value of {metric} yet")
        return ranked.iloc[0]

    def model(self, trial_id: str | None = None, device: str = "cpu") -> PonderNet:
        """The trained network of trial ``trial_id`` (default: the best, as ``ponder-study
        evaluate`` picks it) from its last checkpoint, weights only, in eval mode on ``device``:
        ``model(x)`` unrolls all ``max_steps``, ``model.infer(x)`` halts each sample when its coin
        says (early exit). Raises `EvaluateError` (no such trial, no checkpoint, a bad device)."""
        from study.reports.evaluate import load_trainer
        from study.reports.trial_choice import choose_trial

        chosen = choose_trial(self.name, self.storage, trial_id)
        _check_device(device)
        trainer, _ = load_trainer(chosen.row, device, self.paths)
        trainer.model.eval()
        return trainer.model

    def evaluate(self, trial_id: str | None = None, *, device: str = "cpu", repeats: int = 5) -> Evaluation:
        """``ponder-study evaluate``: trial ``trial_id``'s checkpoint (default: the best) run with
        real early exit on every evaluation set of its task, timed ``repeats`` times against the
        full unroll. Its ``str`` is the command's table. Raises `EvaluateError`."""
        from study.reports.evaluate import evaluate_trial
        from study.reports.trial_choice import choose_trial

        chosen = choose_trial(self.name, self.storage, trial_id)  # a wrong id: answered before torch
        _check_device(device)
        name, storage = self.name, self.storage
        return evaluate_trial(name, storage, trial_id, device=device, repeats=repeats, chosen=chosen)

    def plot(self, kind: str) -> Figure:
        """One of the report's plots as a matplotlib `Figure` (no pyplot), by its name:
        ``"sensitivity"``, ``"pareto"``, ``"halting_distribution"``, ``"per_step_accuracy"``,
        ``"learning_curves"``, ``"asha"``. A plot the study has no data for yet is the report's
        placeholder, saying why. Raises `ReportError` (another name, no trials Parquet yet)."""
        from study.reports.data import PLOTS
        from study.reports.report import ReportError, load_study_data

        if kind not in PLOTS:
            raise ReportError(f"kind: no plot named {kind!r}; the report's plots: {', '.join(PLOTS)}")
        from study.reports.plots import draw

        figure, _ = draw(kind, load_study_data(self.name, self.storage))
        return figure

    def optuna(self) -> optuna.Study:
        """The study's Optuna study, read from its journal: `optuna.visualization`,
        `optuna.importance` and ``trials_dataframe()`` work on it; it is read-only (``ask``,
        ``tell`` and ``optimize`` are refused: `study.resume` adds trials). Raises `StudyError`
        before the journal exists."""
        from study.reports.importance import read_journal_study

        import_optuna()
        found: optuna.Study | None = read_journal_study(self.paths)
        if found is None:
            raise StudyError(f"study {self.name!r} has no Optuna journal yet under {self.storage}")
        return found

    def importance(self) -> Importances:
        """Which searched field mattered for each objective (Optuna's fANOVA over the journal's
        complete trials), or why not yet: the lines ``ponder-study status`` ends with, its ``str``."""
        from study.reports.importance import importances

        import_optuna()
        return importances(self.spec, self.paths)

    def report(self, out: StorageLike | None = None) -> Report:
        """``ponder-study report``: the six plots as PNGs and an ``index.html`` written to ``out``
        (default ``<storage>/reports/<name>``); returns where. Raises `ReportError`."""
        from study.reports.report import write_report

        where = None if out is None else os.path.expanduser(os.fspath(out))
        return write_report(self.name, self.storage, out=where)

    def summary(self, top: int = 10) -> str:
        """The table ``ponder-study status`` prints: trials by status, the ``top`` ones by the
        objective, then those without a final result, and where the Parquet is."""
        from study.reports.summary import summary

        return summary(self.paths, self.metric, self.mode, top)

    def freshness(self) -> Freshness:
        """How current the tables are now: when the Parquet was written, the ended trials it
        lacks yet, and who is running the study (None: nobody)."""
        from study.reports.summary import current_trials
        from study.run.lease import driver_of

        read_at = datetime.now(UTC)
        df, stale = current_trials(self.paths)
        statuses = {} if df is None else {str(k): int(v) for k, v in df["status"].value_counts().items()}
        return Freshness(read_at, _written_at(self.paths), statuses, stale, driver_of(self.paths))

    def __repr__(self) -> str:
        return f"Study({self.name!r}, storage={self.storage!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython (a notebook's output): the summary and how current it is."""
        printer.text(repr(self) if cycle else f"{self.summary()}\n{self.freshness()}")


def import_optuna() -> Any:
    """Optuna, imported without the warning tqdm gives in a notebook's kernel without ipywidgets
    ("IProgress not found"): Optuna imports tqdm for a progress bar no study shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import optuna
    return optuna


def _written_at(paths: StudyPaths) -> datetime | None:
    """When the Parquet was last written: as its driver recorded it (`parquet_state`), else (a
    study written by ``export``, or before drivers recorded it) its trials files' newest time."""
    state = parquet_state(paths)
    if state is not None and state.get("written"):
        return datetime.fromisoformat(str(state["written"]))
    files = table_files(paths, "trials")
    if not files:
        return None
    fs, _ = resolve(paths.root)
    times = [i.mtime for i in fs.get_file_info(files) if i.mtime is not None]
    return max(times).astimezone(UTC) if times else None


def _check_device(device: str) -> None:
    """`EvaluateError` for a device torch cannot run on here, before a checkpoint is loaded."""
    import torch

    from study.reports.trial_choice import EvaluateError

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise EvaluateError(f"device {device!r} is not a device; use 'cpu', 'cuda' or 'cuda:N'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EvaluateError(f"device {device!r}: CUDA is not available on this machine; use 'cpu'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise EvaluateError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if dev.type not in ("cpu", "cuda"):
        raise EvaluateError(f"device {device!r}: studies evaluate on 'cpu' or 'cuda', not {dev.type}")


def load(name: str, storage: StorageLike | None = None) -> Study:
    """The study ``name`` under ``storage`` (else ``$PONDER_STUDY_STORAGE``, else ``"results"``),
    read without Ray: a local folder, a copy moved elsewhere, or a URI (``s3://bucket/prefix``),
    also while it runs. Raises `StudyError` (no such study: the message lists those there),
    `SpecError` (not a study name) or `StorageError` (a storage that cannot be reached)."""
    check_name(name, "name")
    where = given_storage(storage) or DEFAULT_STORAGE
    check_storage(where)
    if read_bytes(StudyPaths(where, name).spec) is None:
        there = _list_studies(where)
        known = f"studies there: {', '.join(there)}" if there else "no studies there"
        raise StudyError(f"no study named {name!r} under {where}; {known}")
    spec, paths = load_study_spec(name, where)
    return Study(spec, paths)


def list_studies(storage: StorageLike | None = None) -> list[str]:
    """The names of the studies under ``storage`` (else ``$PONDER_STUDY_STORAGE``, else
    ``"results"``), sorted: those ``ponder-study list`` shows."""
    where = given_storage(storage) or DEFAULT_STORAGE
    check_storage(where)
    return _list_studies(where)


def list_specs() -> list[str]:
    """The shipped specs' names, which `study.run` and `study.check` take as ``spec``."""
    return _list_specs()
