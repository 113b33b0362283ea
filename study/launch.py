"""The ``ponder-study`` command's first lines: signals handled before anything heavy is imported.

Importing the CLI takes seconds (torch, pandas, pyarrow). A Ctrl-C, ``kill`` (SIGTERM) or a
closed terminal (SIGHUP) in that time would end the process with a traceback or silently; here
it ends with exit 130 and the command to run again, like a stop at any later moment.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
from typing import NoReturn

__all__ = [
    "PROG",
    "RAY_CRASH_HANDLER_OFF",
    "command_name",
    "crash_handler_back_for_ray_processes",
    "install_stop_handlers",
    "main",
    "raise_a_swallowed_stop",
    "run_again",
]

RAY_CRASH_HANDLER_OFF = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"
"""Ray's C++ crash handler (absl's) also takes SIGTERM, and ``ray.shutdown()`` removes it by
setting SIGTERM back to "die at once", under the driver's own handler: a `kill` in the driver's
last second (~1 s while Ray's processes stop) ended it with exit 143, its summary unprinted. Set
here for the driver only (read when Ray is imported); `study.runner` takes it back out before
Ray starts its processes, so trials keep the crash handler."""

_set_here = False


def crash_handler_back_for_ray_processes() -> None:
    """Called once Ray is imported, before it starts processes: they inherit the environment."""
    global _set_here
    if _set_here:
        os.environ.pop(RAY_CRASH_HANDLER_OFF, None)
        _set_here = False


_stop_asked = False


def _as_ctrl_c(signum: int, frame: object) -> None:
    global _stop_asked
    _stop_asked = True
    raise KeyboardInterrupt


def _quiet_when_a_stop_was_swallowed(unraisable: sys.UnraisableHookArgs) -> None:
    """Python prints an exception it cannot raise ("Exception ignored in ...", a traceback):
    a stop that lands in an at-fork hook (logging's, while Ray forks its processes) or in a
    finaliser is one. That stop is not lost, `raise_a_swallowed_stop` raises it again at the
    driver's next phase, so its traceback would only be noise on a clean exit 130 (seen in a
    suite run: a Ctrl-C 3 s into `run`). The same goes for the ``SystemExit(15)`` of the SIGTERM
    handler that ``ray.init`` installs while it runs: it is remembered as a stop here. Any other
    exception is printed as Python would."""
    global _stop_asked
    if isinstance(unraisable.exc_value, SystemExit) and unraisable.exc_value.code == signal.SIGTERM:
        _stop_asked = True
        return
    if _stop_asked and issubclass(unraisable.exc_type, KeyboardInterrupt):
        return
    sys.__unraisablehook__(unraisable)


def install_stop_handlers() -> None:
    """Ctrl-C, SIGTERM and SIGHUP raise KeyboardInterrupt and are remembered (see `main`)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _as_ctrl_c)
    sys.unraisablehook = _quiet_when_a_stop_was_swallowed


def raise_a_swallowed_stop() -> None:
    """Raise again a stop (Ctrl-C, SIGTERM, SIGHUP) that came but did not end the command.

    A stop raises KeyboardInterrupt wherever the driver is; code that catches every exception
    around its own imports or start-up would swallow it (seen once in three suite runs under load:
    a Ctrl-C 3 s into `run` was lost and the study ran to its end). The driver calls this between
    its phases (imports, Ray's start, Tune's run), so a stop is never lost for long."""
    if _stop_asked:
        raise KeyboardInterrupt


PROG = "ponder-study"


def command_name() -> str:
    """How the user's shell reaches this command, for the command lines printed to paste:
    ``ponder-study`` when ``$PATH`` finds this script, else the script's path (a bare name run
    from ``.venv/bin/`` without the venv activated answered "command not found"), relative to
    the working directory when that is shorter. Run another way (``python -m study``), the name."""
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


def main() -> NoReturn:
    """Install the handlers, import the CLI, run it (`study.cli.entry`)."""
    global _set_here
    if RAY_CRASH_HANDLER_OFF not in os.environ:  # a user's own setting stands
        os.environ[RAY_CRASH_HANDLER_OFF] = "1"
        _set_here = True
    install_stop_handlers()
    try:
        from study.cli import entry
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted before it started; run it again: {run_again()}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(130)
    entry()
