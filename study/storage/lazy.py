"""A folder's public names, served from its main module when first asked for (PEP 562).

`study.storage`, `study.spec`, `study.records` and `study.search` each re-export their main
module's names (a study pickled before the folders names ``study.search.DivergenceAwareOptunaSearch``,
``study.storage.StudyPaths``), without importing it until a name is asked for: importing a module
of a folder must not import the rest of it (``study.search.trial_map`` without Ray). The names are
listed once, in the main module's ``__all__``; each folder's ``__init__`` is::

    if TYPE_CHECKING:  # its names, typed, for mypy and editors
        from study.spec.spec import *  # noqa: F403
    __getattr__ = public_names(__name__, "study.spec.spec")
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

__all__ = ["public_names"]


def public_names(package: str, module: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: a name of ``module``'s ``__all__`` (and ``__all__`` itself,
    for ``from package import *``), imported from ``module`` when first asked for. A submodule of
    the package is left to the import system (``from study.search import ray_private`` asks for it
    first), so asking for one imports nothing else."""

    def __getattr__(name: str) -> Any:
        if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is None:
            main = importlib.import_module(module)
            if name in main.__all__:
                return getattr(main, name)
        elif name == "__all__":
            return list(importlib.import_module(module).__all__)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
