"""The Ray Tune layer of ponder-study: the only package that imports Ray; and its Python API.

``import study`` is the API (docs/api.md, every name in `__all__`): `run`, `resume`, `load` a
study, a `Study`'s trials, history, best trial, model, evaluation, plots, Optuna study,
importance and report, `check` a spec, `list_studies`, and the exceptions a caller catches.
Each is imported on first use (`__getattr__`): ``import study`` imports neither Ray nor torch,
and ``ponder-study --help`` does not wait for them. ``study.run`` is both the folder
``study/run/`` and the function: the folder's module is callable (`_Callable`), its call
`study.api.driving.run`, so ``study.run(spec)`` runs a study and ``study.run.runner`` is still
the module that drives Tune (and what Tune's pickles name).

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
- `study.api`: the Python API (above), on the CLI's code path;
- `study.cli`: ``ponder-study`` (`study.cli.launch.main`), one `Command` a verb.

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
import inspect
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from study.api.reference import HOMES as _HOMES  # each public name -> its module

if TYPE_CHECKING:
    from study.api.driving import StudyInterrupted, StudyWarning, resume, run
    from study.api.reading import Freshness, Study, list_specs, list_studies, load
    from study.api.specs import check
    from study.records.records import StudyError
    from study.reports.evaluate import Evaluation
    from study.reports.importance import Importances
    from study.reports.report import Report, ReportError
    from study.reports.trial_choice import EvaluateError
    from study.run.lease import LeaseHeld
    from study.search.warmstart import WarmStartError
    from study.spec.check import Check
    from study.spec.spec import SpecError, StudySpec
    from study.storage.filesystems import StorageError

__all__ = [
    "MOVED",
    "Check",
    "EvaluateError",
    "Evaluation",
    "Freshness",
    "Importances",
    "LeaseHeld",
    "Report",
    "ReportError",
    "SpecError",
    "StorageError",
    "Study",
    "StudyError",
    "StudyInterrupted",
    "StudySpec",
    "StudyWarning",
    "WarmStartError",
    "check",
    "list_specs",
    "list_studies",
    "load",
    "resume",
    "run",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module when first asked for (`study.api.reference.HOMES`)."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Callable(ModuleType):
    """The class of the module ``study.run`` (the folder): calling it is `study.api.driving.run`,
    whose signature it shows (``help``, a notebook's ``study.run?``); every attribute is the
    folder's."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from study.api.driving import run as run_study

        return run_study(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        from study.api.driving import run as run_study

        return inspect.signature(run_study)


importlib.import_module("study.run").__class__ = _Callable  # the folder imports nothing: cheap


class _Package(ModuleType):
    """The class of the module ``study``: a module imported under its old name (`MOVED`) is not
    set over the public name it shares (``study.check``, once the module `study.spec.check`, is
    the API's function `check`); ``sys.modules`` holds it under the old name, which is what a
    pickle naming it needs."""

    def __setattr__(self, name: str, value: Any) -> None:
        moved = isinstance(value, ModuleType) and value.__name__ != f"{__name__}.{name}"
        if moved and name in _HOMES:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

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
