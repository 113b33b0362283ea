"""The command lines printed for the user to paste: ``ponder-study ...`` as their shell reaches it."""

from __future__ import annotations

import os
import shlex
import shutil
import sys

__all__ = ["PROG", "command_name", "run_again"]

PROG = "ponder-study"


def command_name() -> str:
    """How the user's shell reaches this command, for the command lines printed to paste:
    ``ponder-study`` when ``$PATH`` finds this script, else the script's path (a venv not
    activated puts no ``ponder-study`` on ``$PATH``), relative to the working directory when
    that is shorter. Run another way (``python -m study``), the name."""
    script = sys.argv[0] if sys.argv else ""
    if os.path.basename(script) != PROG or os.sep not in script or not os.path.isfile(script):
        return PROG
    found = shutil.which(PROG)
    try:
        if found is not None and os.path.samefile(found, script):
            return PROG
        absolute = os.path.abspath(script)
        relative = os.path.relpath(absolute)
    except (OSError, ValueError):  # a working directory since removed; another drive
        return shlex.quote(script)
    if os.sep not in relative:
        relative = os.path.join(os.curdir, relative)  # ./ponder-study: a bare name is looked up
    return shlex.quote(min(relative, absolute, key=len))


def run_again() -> str:
    """The command line this process was started with, as a shell would read it: what a stop
    that came before a study was known tells the user to run again."""
    return " ".join([command_name(), *map(shlex.quote, sys.argv[1:])])
