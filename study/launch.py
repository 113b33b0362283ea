"""The ``ponder-study`` command's first lines: signals handled before anything heavy is imported.

Importing the CLI takes seconds (torch, pandas, pyarrow). A Ctrl-C, ``kill`` (SIGTERM) or a
closed terminal (SIGHUP) in that time would end the process with a traceback or silently; here
it ends with exit 130 and the command to run again, like a stop at any later moment.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from typing import NoReturn

__all__ = ["main"]


def _as_ctrl_c(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> NoReturn:
    """Install the handlers, import the CLI, run it (`study.cli.entry`)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _as_ctrl_c)
    try:
        from study.cli import entry
    except KeyboardInterrupt:
        again = shlex.join(["ponder-study", *sys.argv[1:]])
        print(f"ponder-study: interrupted before it started; run it again: {again}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(130)
    entry()
