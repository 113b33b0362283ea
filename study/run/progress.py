"""Tune's progress table where the driver's output goes: a terminal (or a log) gets it printed at
every redraw, as Tune prints it; a Jupyter kernel (a study run from a notebook) gets one output
under the cell, redrawn in place, instead of a new table appended every 15 s.

IPython is never imported here: a kernel has imported it already, and without one there is
nothing to draw in. No Ray, no torch.
"""

from __future__ import annotations

import importlib
import sys
import weakref
from typing import Any

__all__ = ["in_a_kernel", "shown_in_place"]

_shown: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
"""A reporter -> the display it redraws: one per run or resume (a resumed study's reporter is a
new object, unpickled from Tune's state)."""


def in_a_kernel() -> bool:
    """Whether this process is a Jupyter kernel (IPython's shell with a kernel behind it)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def shown_in_place(reporter: object, text: str) -> bool:
    """Show ``text`` (a progress table) as ``reporter``'s one output in the kernel's cell, drawn
    the first time and updated after; False (nothing shown) outside a kernel."""
    if not in_a_kernel():
        return False
    ipython: Any = importlib.import_module("IPython.display")  # untyped
    table = ipython.Pretty(text)  # text/plain, as printed
    handle = _shown.get(reporter)
    if handle is None:
        _shown[reporter] = ipython.display(table, display_id=True)
    else:
        handle.update(table)
    return True
