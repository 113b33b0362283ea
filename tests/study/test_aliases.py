"""Every module name study/ had before its folders still imports, as the module it became
(`study.MOVED`): Tune's ``tuner.pkl``, searcher state and search generator state name the classes
they hold by module, and a study started before the folders must still resume."""

from __future__ import annotations

import importlib
import importlib.util
import io
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

import study
from study.api.reference import HOMES

OLD_MODULES = [
    "asha_state",
    "check",
    "commands",
    "dataset",
    "diskspace",
    "evaluate",
    "export",
    "files",
    "filesystems",
    "hints",
    "importance",
    "journal_copy",
    "launch",
    "lease",
    "live",
    "pareto",
    "parquet",
    "processes",
    "ray_private",
    "ray_token",
    "records",
    "report",
    "report_data",
    "report_html",
    "report_plots",
    "runner",
    "scheduler",
    "search",
    "seeds",
    "slurm",
    "slurm_script",
    "spec",
    "spec_models",
    "spec_toml",
    "stops",
    "storage",
    "study_paths",
    "submit",
    "summary",
    "tensorboard",
    "trainable",
    "trial_choice",
    "trial_map",
    "tune_logs",
    "tune_state",
    "warmstart",
]
"""study/'s 46 modules before it had folders."""

FOLDERS = {"records", "search", "spec", "storage"}
"""The old names that are folders now: the folder re-exports its main module's names."""

PICKLED = {
    ("study.export", "ParquetCallback"): "study.run.export",
    ("study.runner", "ParquetCallback"): "study.run.export",
    ("study.runner", "ScalarTensorBoard"): "study.run.tensorboard",
    ("study.runner", "_EventFile"): "study.run.tensorboard",
    ("study.runner", "_StudyReporter"): "study.run.runner",
    ("study.scheduler", "PersistentASHA"): "study.search.scheduler",
    ("study.search", "DivergenceAwareOptunaSearch"): "study.search.search",
    ("study.search", "SamplerRecipe"): "study.search.search",
    ("study.spec", "Dimension"): "study.spec.spec",
    ("study.spec", "StudySpec"): "study.spec.spec",
    ("study.spec_models", "ResourcesSpec"): "study.spec.models",
    ("study.spec_models", "RunSpec"): "study.spec.models",
    ("study.spec_models", "SchedulerSpec"): "study.spec.models",
    ("study.spec_models", "SearchSpec"): "study.spec.models",
    ("study.storage", "StudyPaths"): "study.storage.paths",
    ("study.study_paths", "StudyPaths"): "study.storage.paths",
    ("study.tensorboard", "ScalarTensorBoard"): "study.run.tensorboard",
    ("study.tensorboard", "_EventFile"): "study.run.tensorboard",
}
"""Every class a study's pickles named before the folders (a smoke study's ``tune/`` folder and
the repro in tests/study/data), and the module it is defined in now."""

STUCK = Path(__file__).parent / "data" / "stuck-after-sigkill.tar.gz"


def test_every_old_module_name_is_moved_or_a_folder() -> None:
    assert {name.removeprefix("study.") for name in study.MOVED} == set(OLD_MODULES) - FOLDERS
    for new in study.MOVED.values():
        assert importlib.util.find_spec(new) is not None, new


@pytest.mark.parametrize("old", sorted(study.MOVED))
def test_an_old_name_imports_as_the_module_it_became(old: str) -> None:
    module = importlib.import_module(old)
    assert module is importlib.import_module(study.MOVED[old])
    assert sys.modules[old] is module
    name = old.removeprefix("study.")
    if name in study.__all__:  # `study.check`: the API's function, not the module it once named
        assert getattr(study, name) is getattr(importlib.import_module(HOMES[name]), name)
        assert not isinstance(getattr(study, name), ModuleType)
    else:
        assert getattr(study, name) is module  # `from study import runner`


@pytest.mark.parametrize(("where", "new"), sorted(PICKLED.items()))
def test_a_class_pickled_under_its_old_module_loads_as_the_class_it_is_now(
    where: tuple[str, str], new: str
) -> None:
    module, name = where
    found = pickle.Unpickler(io.BytesIO()).find_class(module, name)  # what pickle.load calls
    assert found is getattr(importlib.import_module(new), name)


class _Recorder(pickle.Unpickler):
    """Unpickles as Tune does, and records the study classes the pickle names."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.named: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str) -> object:
        if module.split(".")[0] == "study":
            self.named.add((module, name))
        return super().find_class(module, name)


def test_the_repro_studys_pickles_load() -> None:
    """tuner.pkl, each searcher state and search generator state of a study saved before the
    folders load; the classes they name are the ones study/ has now."""
    named: set[tuple[str, str]] = set()
    with tarfile.open(STUCK) as tar:
        for member in tar.getmembers():
            base = member.name.rsplit("/", 1)[-1]
            if not (base == "tuner.pkl" or base.startswith(("searcher-state-", "search_gen_state-"))):
                continue
            file = tar.extractfile(member)
            assert file is not None
            data = file.read()
            if not data:
                continue  # a save the kill left empty: Tune skips it too
            recorder = _Recorder(data)
            recorder.load()
            named |= recorder.named
    assert named, "the repro names no class of study's"
    assert named <= set(PICKLED), named - set(PICKLED)


def test_the_folders_import_neither_ray_nor_torch() -> None:
    """`import study` and its light folders stay light: the entry point imports
    `study.cli.launch`, `study.storage.commands` and `study.run.stops` before handling signals."""
    code = (
        "import sys\n"
        "import study, study.spec, study.storage, study.records, study.search, study.run\n"
        "import study.reports, study.launchers, study.cli, study.cli.launch\n"
        "print(sorted(m for m in ('ray', 'torch', 'pyarrow', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    ("folder", "module"),
    [
        ("study.storage", "study.storage.storage"),
        ("study.spec", "study.spec.spec"),
        ("study.records", "study.records.records"),
        ("study.search", "study.search.search"),
    ],
)
def test_a_folder_re_exports_its_main_modules_public_names(folder: str, module: str) -> None:
    """A folder's names are its main module's ``__all__``, listed there once and imported when first
    asked for (`study.storage.lazy`): every name the module's own object."""
    package, main = importlib.import_module(folder), importlib.import_module(module)
    assert sorted(package.__all__) == sorted(main.__all__)
    for name in main.__all__:
        assert getattr(package, name) is getattr(main, name)
