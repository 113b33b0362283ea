"""The study's Parquet while it runs: refreshed on a budget, written whole when the run ends.

Writing a trial's rows at its end cost the driver more than Tune and Optuna did for the whole
trial (about 35 ms of tiny trials' 55 ms, bench/driver_scale.py). So the trials that end are
kept, and `LiveParquet` writes them together in a refresh: no sooner than ``refresh_s`` after
the last one (the spec's ``[run] parquet_refresh_s``), and no more often than keeps the
refreshes within `BUDGET_SHARE` of the driver's time (a refresh's cost grows with the study).
A refresh writes:

- the reports of the trials that became final (completed, early stopped, diverged) since the
  last refresh, as one new file of the history folder (``trial-batch-<driver>-<n>.parquet``),
  never rewritten: a cost per trial that does not grow with the study;
- the trials table whole (``trials.parquet``: every final trial, its ``pareto`` mark current),
  from the rows of earlier refreshes kept in memory: a few MB at 10,000 trials;
- a trial that is not final (errored: a resume runs it again) as its own two fragments, as the
  whole export does; they go when the trial becomes final;
- ``studies/<name>/parquet.json``: when, how many trials, and whether the run had ended then
  (`study.storage.storage.parquet_state`), which ``status`` and the readers report.

When the run ends (`finish`, from Tune's end of the experiment, however it ended but a kill)
the trials still running are written as fragments, the history folder is compacted into one file
where it holds more than `COMPACT_AT` files or a fragment that must go, and every end record the
Parquet lacks (trials that ended before this driver, whose rows a kill lost) is added: the
Parquet is then whole, and the driver's final export from Tune's saved state
(`study.run.export.export_experiment`) is not needed. A kill before then leaves a Parquet that
lags the end records by at most one refresh; ``ponder-study export``, or the next run's end,
brings it level. Readers never see a trial twice: a trial leaves its fragments before it is
written final.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from ray.tune.experiment import Trial

from study.records.parquet import TrialRecord, history_table, trials_table
from study.records.ranking import pareto_marks
from study.records.records import ended_trial_ids, read_ended
from study.run.dataset import write_study_table
from study.run.trial_rows import FINAL, fragment_history, record_from_end, record_of
from study.spec.spec import StudySpec
from study.storage.storage import (
    FRAGMENT_PREFIX,
    StudyPaths,
    join,
    parquet_from_bytes,
    read_study_table,
    replaced_folder,
    resolve,
    table_files,
    write_parquet_state,
)

__all__ = ["BATCH_PREFIX", "BUDGET_SHARE", "COMPACT_AT", "REFRESH_S", "LiveParquet"]

log = logging.getLogger("ponder-study")

REFRESH_S = 10.0
"""The default of ``[run] parquet_refresh_s``: the least time between two refreshes."""

BUDGET_SHARE = 0.05
"""The most of the driver's time the refreshes take: after a refresh of ``t`` seconds the next
waits ``t / BUDGET_SHARE`` at least."""

COMPACT_AT = 64
"""The most files the history folder keeps at a run's end (the compacted file and the refreshes'
batches); beyond, it is compacted into one. Readers take a folder of many files as one table
(about 1 ms a file to open)."""

BATCH_PREFIX = f"{FRAGMENT_PREFIX}batch-"
"""A history file of the trials one refresh wrote final (readers take it as any fragment)."""

_SAMPLE_COLUMNS = ("trial_id", "status", "task", "eval_samples")
"""The trials table's columns a Pareto mark needs, besides the objectives."""


def _final_history_ids(paths: StudyPaths) -> set[str]:
    """The trials whose reports the history's compacted file and batch files hold: their
    ``trial_id`` column alone is read."""
    fs, _ = resolve(paths.root)
    ids: set[str] = set()
    for f in table_files(paths, "history"):
        base = f.rsplit("/", 1)[-1]
        if base == paths.compacted_name("history") or base.startswith(BATCH_PREFIX):
            with fs.open_input_file(f) as source:
                ids.update(pq.read_table(source, columns=["trial_id"]).column("trial_id").to_pylist())
    return ids


class LiveParquet:
    """The study's Parquet as trials end (see the module docstring)."""

    def __init__(self, paths: StudyPaths, spec: StudySpec, refresh_s: float = REFRESH_S) -> None:
        self.paths, self.spec, self.refresh_s = paths, spec, refresh_s
        self.pending: dict[str, Trial | None] = {}  # ended or errored since the last refresh
        self.loaded = False
        self.final_tables: list[pa.Table] = []  # the final trials' rows, pareto left to `_whole`
        self.final_ids: set[str] = set()
        self.fragments: set[str] = set()  # trials with their own fragments (not final)
        self.fragment_tables: dict[str, tuple[pa.Table, pa.Table]] = {}  # those this driver wrote
        self.exported: dict[str, list[dict[str, Any]]] = {}  # those fragments' history rows
        self.in_history: set[str] = set()  # final trials the history held when the driver started
        self.last_at = time.monotonic()
        self.last_cost = 0.0
        self.refreshes = 0
        self._driver = uuid.uuid4().hex[:8]
        self._batches = itertools.count(1)

    # -- what a driver calls -----------------------------------------------------------------------
    def add(self, trial: Trial) -> None:
        """A trial that ended or errored: written at the next refresh."""
        self.pending[trial.trial_id] = trial

    def due(self) -> bool:
        """Whether a refresh is due: trials wait, and the interval and the budget allow it."""
        wait = max(self.refresh_s, self.last_cost / BUDGET_SHARE)
        return bool(self.pending) and time.monotonic() - self.last_at >= wait

    def refresh(self) -> None:
        """Write the trials kept since the last refresh (see the module docstring)."""
        if not self.loaded:
            self._load()
        started = time.monotonic()
        self._write(self._take_pending(), final=False)
        self.last_at = time.monotonic()
        self.last_cost = self.last_at - started
        self.refreshes += 1

    def finish(self, trials: Sequence[Trial]) -> Counter[str]:
        """The run's end: everything kept written, the trials not final as their fragments, the
        end records the Parquet lacks added, the history compacted. Returns the trials by status."""
        if not self.loaded:
            self._load()
        for trial in trials:  # Tune's trial rather than its end record alone
            written = trial.status == Trial.TERMINATED and trial.trial_id in self.final_ids
            if not written and self.pending.get(trial.trial_id) is None:
                self.pending[trial.trial_id] = trial
        # a kill lost their rows (the ledgers of a study from before end records were read at `_load`)
        for trial_id in ended_trial_ids(self.paths, ledgers=False) - self.final_ids:
            self.pending.setdefault(trial_id, None)
        statuses = self._write(self._take_pending(), final=True)
        live = {t.trial_id for t in trials} - self.final_ids  # what else is in a folder goes
        self._compact(live)
        return statuses

    # -- inside ------------------------------------------------------------------------------------
    def _load(self) -> None:
        """What the Parquet holds when this driver starts: the final trials' rows (kept), the
        trials with fragments (not final) and their history rows; the end records it lacks are
        written at the first refresh."""
        self.loaded = True
        ended = ended_trial_ids(self.paths)
        table = read_study_table(self.paths, "trials")
        if table is not None and table.num_rows:
            ids = table.column("trial_id")
            final = pc.and_(  # a row that says final, of a trial the end records hold
                pc.is_in(table.column("status"), pa.array(list(FINAL), pa.string())),
                pc.is_in(ids, pa.array(sorted(ended), pa.string())),
            )
            if "checkpoint_path" in table.column_names:  # a copied or moved study: written again
                here = pc.starts_with(table.column("checkpoint_path"), join(self.paths.root, ""))
                final = pc.and_(final, pc.fill_null(here, True))
            self.final_tables.append(table.filter(final))
            self.final_ids = set(table.filter(final).column("trial_id").to_pylist())
            self.fragments = set(table.filter(pc.invert(final)).column("trial_id").to_pylist())
        self.exported = fragment_history(self.paths, self.fragments)
        self.in_history = _final_history_ids(self.paths)
        for trial_id in ended - self.final_ids:
            self.pending.setdefault(trial_id, None)

    def _take_pending(self) -> list[TrialRecord]:
        pending, self.pending = self.pending, {}
        records = []
        try:
            for trial_id, trial in pending.items():
                end, saved = read_ended(self.paths, trial_id)
                exported = self.exported.get(trial_id, [])
                if trial is not None:
                    rec = record_of(trial, self.paths, end, saved, exported)
                    if end is None and rec.tune_status == Trial.TERMINATED:
                        # stopped by the run's end (Tune terminates its running trials as it
                        # cleans up), not ended: pending, as Tune's saved state holds it
                        rec.tune_status = Trial.PENDING
                    records.append(rec)
                elif end is not None:
                    records.append(record_from_end(self.paths, end, saved, exported))
        except BaseException:
            self.pending = {**pending, **self.pending}  # tried again at the next refresh
            raise
        return records

    def _write(self, records: list[TrialRecord], final: bool) -> Counter[str]:
        """Write ``records``: the final ones into a new history file and the trials table, the
        others as their own fragments; the fragments of trials now final go first."""
        spec, paths = self.spec, self.paths
        done = [r for r in records if r.ended and r.status() in FINAL and r.trial_id not in self.final_ids]
        done_ids = {d.trial_id for d in done}
        rest = [r for r in records if r.trial_id not in done_ids and r.trial_id not in self.final_ids]
        for rec in done:
            if rec.trial_id in self.fragments:  # gone before it is written final: never twice
                self._remove_fragments(rec.trial_id)
        # a driver killed between a refresh's two writes left some of these in history already
        reports = [r for r in done if r.trial_id not in self.in_history]
        if reports:
            history = history_table(reports, spec.objectives)
            name = f"{BATCH_PREFIX}{self._driver}-{next(self._batches):06d}.parquet"
            write_study_table(paths, "history", history, file=join(paths.table_dir("history"), name))
        if done:
            self.final_tables.append(trials_table(done, spec.metric, spec.mode, (), spec.objectives))
            self.final_ids.update(r.trial_id for r in done)
        for rec in rest:
            row = trials_table([rec], spec.metric, spec.mode, (), spec.objectives)
            history = history_table([rec], spec.objectives)
            write_study_table(paths, "history", history, file=paths.fragment("history", rec.trial_id))
            write_study_table(paths, "trials", row, file=paths.fragment("trials", rec.trial_id))
            self.fragments.add(rec.trial_id)
            self.fragment_tables[rec.trial_id] = (row, history)
        whole = self._whole()
        if done or final:
            write_study_table(paths, "trials", whole, file=paths.trials_parquet)
        statuses: Counter[str] = Counter(whole.column("status").to_pylist()) if whole.num_rows else Counter()
        statuses.update(r.status() for r in rest)
        write_parquet_state(paths, whole.num_rows + len(self.fragments), final)
        return statuses

    def _whole(self) -> pa.Table:
        """Every final trial's row, its ``pareto`` mark among them all."""
        tables = [t for t in self.final_tables if t.num_rows]
        if not tables:
            return trials_table([], self.spec.metric, self.spec.mode, (), self.spec.objectives)
        whole = pa.concat_tables(tables, promote_options="permissive").combine_chunks()
        self.final_tables = [whole]  # one table from here on
        objectives = self.spec.front_objectives
        if objectives:
            names = [c for c in (*_SAMPLE_COLUMNS, *(m for m, _ in objectives)) if c in whole.column_names]
            marks = pareto_marks(whole.select(names).to_pylist(), objectives)
        else:
            marks = [False] * whole.num_rows
        index = whole.schema.get_field_index("pareto")
        return whole.set_column(index, whole.schema.field(index), pa.array(marks, pa.bool_()))

    def _remove_fragments(self, trial_id: str) -> None:
        for kind in ("history", "trials"):
            fs, path = resolve(self.paths.fragment(kind, trial_id))
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(path)
        self.fragments.discard(trial_id)
        self.fragment_tables.pop(trial_id, None)

    def _compact(self, live: set[str]) -> None:
        """Each table's folder as one file of every final trial and a fragment for each trial of
        ``live`` that is not final, swapped in whole (`study.storage.storage.replaced_folder`): the
        history first, so that every trial the trials table shows has its reports; a fragment of a
        trial no longer in Tune's trials (a resume dropped it) goes. Left as they are when every
        fragment is of a trial still in flight and the history is `COMPACT_AT` files or fewer:
        rewriting 120,000 reports took most of the 7 s of a 10,000-trial study's end."""
        paths = self.paths
        fs, _ = resolve(paths.root)
        keep = sorted(live & set(self.fragment_tables))
        history_files = [f for f in table_files(paths, "history") if not self._fragment_file(f)]
        if self.fragments <= set(keep) and len(history_files) <= COMPACT_AT:
            return
        history = [self._final_history(fs)]
        for kind, whole in (("history", history[0]), ("trials", self._whole())):
            with replaced_folder(paths.table_dir(kind)) as folder:
                write_study_table(paths, kind, whole, file=join(folder, paths.compacted_name(kind)))
                for trial_id in keep:
                    table = self.fragment_tables[trial_id][0 if kind == "trials" else 1]
                    write_study_table(paths, kind, table, file=join(folder, paths.fragment_name(trial_id)))
        self.fragments = set(keep)

    def _fragment_file(self, file: str) -> bool:
        """Whether ``file`` of a table's folder is a trial's own fragment (not final)."""
        base = file.rsplit("/", 1)[-1]
        return base.startswith(FRAGMENT_PREFIX) and not base.startswith(BATCH_PREFIX)

    def _final_history(self, fs: Any) -> pa.Table:
        """The reports of every final trial: the compacted file's and the batch files'."""
        paths = self.paths
        tables: list[pa.Table] = []
        for f in table_files(paths, "history"):
            base = f.rsplit("/", 1)[-1]
            if base == paths.compacted_name("history") or base.startswith(BATCH_PREFIX):
                with fs.open_input_stream(f) as stream:
                    tables.append(parquet_from_bytes(stream.readall()))
        if not tables:
            return history_table([], self.spec.objectives)
        history = pa.concat_tables(tables, promote_options="permissive")
        return history.filter(
            pc.is_in(history.column("trial_id"), pa.array(sorted(self.final_ids), pa.string()))
        )
