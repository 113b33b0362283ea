"""A study's Ray and Tune log records on the terminal as one line each, their tracebacks in a log
file of the study's (`one_line_logs`): a failed trial's traceback fills no screen, and is kept.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from study.storage.storage import StudyPaths, is_remote, resolve

__all__ = ["FULL_RECORD", "TracebacksToFile", "log_dir", "one_line_logs"]


FULL_RECORD = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


class TracebacksToFile(logging.Filter):
    """Ray's and Tune's log records reach the terminal as their first line; the whole record,
    traceback included, goes to a log file (a failed trial's traceback is also in its error.txt)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not record.exc_info and "\n" not in text.strip():
            return True
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(
                    logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(record) + "\n"
                )
        first = text.strip().splitlines()[0] if text.strip() else record.levelname
        record.msg, record.args, record.exc_info, record.exc_text = (
            f"{first} (details in {self.path})",
            None,
            None,
            None,
        )
        return True


def log_dir(paths: StudyPaths) -> Path:
    """The study's folder of log files: beside the local journal for a study on an object store."""
    if is_remote(paths.root):
        return Path(paths.optuna_journal).parent / "logs"
    return Path(resolve(paths.study_dir)[1]) / "logs"


@contextlib.contextmanager
def one_line_logs(paths: StudyPaths) -> Iterator[None]:
    """Keep tracebacks Ray and Tune log off the terminal for the length of a study."""
    from datetime import UTC, datetime

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    keep = TracebacksToFile(log_dir(paths) / f"tune-{stamp}-{os.getpid()}.log")
    handlers = [*logging.getLogger("ray").handlers, *logging.getLogger().handlers]
    for h in handlers:
        h.addFilter(keep)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(keep)
