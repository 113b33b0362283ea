"""The ``ponder-study`` command's first lines: signals handled before anything heavy is imported.

Importing the CLI takes seconds (torch, pandas, pyarrow). A Ctrl-C, ``kill`` (SIGTERM) or a
closed terminal (SIGHUP) in that time would end the process with a traceback or silently; here
it ends with exit 130 and the command to run again, like a stop at any later moment.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from study.run.stops import crash_handler_off_for_the_driver, install_stop_handlers
from study.storage.commands import PROG, run_again

__all__ = ["main"]


def main() -> NoReturn:
    """Install the handlers, import the CLI, run it (`study.cli.verbs.entry`)."""
    crash_handler_off_for_the_driver()
    install_stop_handlers()
    try:
        from study.cli.verbs import entry
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted before it started; run it again: {run_again()}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(130)
    entry()
