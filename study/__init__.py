"""The Ray Tune layer of ponder-study: the only package that imports Ray.

The path of a study through the folders, each importing only those below it:

- `study.storage`: where a study's files live (`StudyPaths`), local or on a pyarrow
  filesystem, how they are read and written, and the command lines printed to reach a study again;
- `study.spec`: a TOML spec, validated before Ray starts (`load_spec`, `SpecError`), and
  ``ponder-study check``'s estimate of what running it would do;
- `study.records`: the study's own truth: one end record per trial, ASHA's saved state, the
  Optuna journal's copy, and the Parquet contract (`study.records.parquet.SCHEMA_VERSION`);
- `study.search`: the spec as Tune's param space, Optuna (journal on disk), `PersistentASHA`
  whose rungs survive a resume, the Tune-Optuna trial map, warm starts;
- `study.launchers`: a study on Slurm or sent to a Ray cluster's job server, and Ray's token;
- `study.run`: `run_study`, `resume_study`, `export` (`study.run.runner`), the trainable, the
  Parquet written as trials end, the driver's stops, its lease, Tune's saved state, TensorBoard;
- `study.reports`: what is read from a study: its summary, HTML report, plots, Pareto front,
  importance, intervals over seeds, ``status --watch``, ``evaluate``;
- `study.cli`: ``ponder-study`` (`study.cli.launch.main`), one `Command` a verb.

Nothing is imported here, so ``ponder-study --help`` does not wait for Ray.

Every module's name from before the folders (``study.runner``, ``study.spec_models``, ...) still
imports, as the module it became: Tune's ``tuner.pkl`` and searcher state name the classes they
hold by module, so a study started before the move resumes. `MOVED` lists them; a finder on
`sys.meta_path` imports the new module when the old name is asked for. The four old names that
are folders now (``study.spec``, ``study.search``, ``study.storage``, ``study.records``) are
those folders, which re-export their main module's names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED"]

MOVED: dict[str, str] = {
    f"study.{old}": f"study.{new}"
    for old, new in {
        "filesystems": "storage.filesystems",
        "files": "storage.files",
        "study_paths": "storage.paths",
        "commands": "storage.commands",
        "hints": "storage.hints",
        "spec_models": "spec.models",
        "spec_toml": "spec.toml",
        "check": "spec.check",
        "asha_state": "records.asha_state",
        "journal_copy": "records.journal_copy",
        "parquet": "records.parquet",
        "pareto": "records.pareto",
        "ray_private": "search.ray_private",
        "scheduler": "search.scheduler",
        "trial_map": "search.trial_map",
        "warmstart": "search.warmstart",
        "ray_token": "launchers.ray_token",
        "slurm": "launchers.slurm",
        "slurm_script": "launchers.slurm_script",
        "submit": "launchers.submit",
        "dataset": "run.dataset",
        "diskspace": "run.diskspace",
        "export": "run.export",
        "lease": "run.lease",
        "processes": "run.processes",
        "runner": "run.runner",
        "stops": "run.stops",
        "tensorboard": "run.tensorboard",
        "trainable": "run.trainable",
        "tune_logs": "run.tune_logs",
        "tune_state": "run.tune_state",
        "evaluate": "reports.evaluate",
        "importance": "reports.importance",
        "live": "reports.live",
        "report": "reports.report",
        "report_data": "reports.data",
        "report_html": "reports.html",
        "report_plots": "reports.plots",
        "seeds": "reports.seeds",
        "summary": "reports.summary",
        "trial_choice": "reports.trial_choice",
        "launch": "cli.launch",
    }.items()
}
"""A module's name before study/ had folders -> its name now. Four old names need no entry, being
the folders' own names: ``study.spec``, ``study.search``, ``study.storage``, ``study.records``."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name (`MOVED`) as the module it became: the same module object, so that
    ``study.runner.ParquetCallback is study.run.export.ParquetCallback``. Asked last, after the
    files on disk: no file has an old name any more."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder, which `exec_module` swaps for the module itself

    def exec_module(self, module: ModuleType) -> None:
        # the import system hands back what sys.modules holds under the name once this returns
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
