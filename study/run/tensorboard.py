"""TensorBoard logging of a study's trials, from the driver, and Tune's loggers a study leaves off.

With ``[run] tensorboard = true``, `ScalarTensorBoard` replaces Tune's TensorBoard logger: scalars
only, one event per report, written in the driver's thread without tensorboardX's writer thread
(`_EventFile`). The driver imports tensorboardX with torch hidden
(`import_tensorboardx_without_torch`): it never logs a torch tensor, and loading torch would cost
it about 1.5 s of CPU and 300 MB. Without it, `NoTensorBoard` stands where Tune would add its own
logger, and `NoCSV` where it would add its CSV logger: Tune adds a default logger only where the
callbacks hold none of its kind. What each costs a trial: docs/parquet.md, "Figures".
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

from ray.air.constants import TRAINING_ITERATION
from ray.tune.experiment import Trial
from ray.tune.logger import CSVLoggerCallback, TBXLoggerCallback
from ray.tune.logger.tensorboardx import VALID_SUMMARY_TYPES
from ray.tune.result import TIME_TOTAL_S, TIMESTEPS_TOTAL
from ray.tune.utils import flatten_dict

from study.search.search import STEP

__all__ = ["NoCSV", "NoTensorBoard", "ScalarTensorBoard", "import_tensorboardx_without_torch"]


def import_tensorboardx_without_torch() -> None:
    """Import tensorboardX with torch hidden: it imports torch only to accept torch tensors, which
    the driver never logs, and treats its absence as normal. Spares the driver loading torch
    (about 1.5 s of CPU and 300 MB); torch stays importable afterwards."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
    try:
        import tensorboardX  # noqa: F401
    except ImportError:  # not installed: Tune then writes no event files
        pass
    finally:
        del sys.modules["torch"]


_SCALAR_TYPES: tuple[type[Any], ...] = tuple(VALID_SUMMARY_TYPES)


class _EventFile:
    """A trial's TensorBoard event file, written in the driver's thread: what Tune's logger uses
    of tensorboardX's ``SummaryWriter`` (``file_writer.add_summary``, ``flush``, ``close``), without
    the writer thread and ``multiprocessing.Queue`` each ``SummaryWriter`` starts (about 4 ms a
    trial to start and close; bench/driver_scale.py)."""

    def __init__(self, logdir: str, flush_secs: int = 30) -> None:
        from tensorboardX.event_file_writer import EventsWriter  # imported without torch (ScalarTensorBoard)

        self._events = EventsWriter(os.path.join(logdir, "events"))  # events.out.tfevents.<time>.<host>

    @property
    def file_writer(self) -> _EventFile:
        return self

    def add_summary(self, summary: Any, global_step: int | None = None) -> None:
        from tensorboardX.proto import event_pb2

        event = event_pb2.Event(summary=summary, wall_time=time.time())
        if global_step is not None:
            event.step = int(global_step)
        self._events.write_event(event)

    def flush(self) -> None:
        self._events.flush()

    def close(self) -> None:
        self._events.close()


class ScalarTensorBoard(TBXLoggerCallback):
    """Tune's TensorBoard logger, scalars only, one event per report, written in the driver's thread.

    List-valued metrics (per-step accuracy, the halting distribution) are left out: a histogram
    would lose the step each value belongs to (they are in the history Parquet). A report's ~40
    scalars go into one ``Summary`` under Tune's tags, written straight to the file (`_EventFile`):
    about 0.3 ms a report against 2 ms through tensorboardX's writer thread
    (bench/driver_scale.py, docs/parquet.md). Trial start and end (HParams included) are Tune's."""

    _SKIPPED = frozenset({"config", "pid", "timestamp", TIME_TOTAL_S, TRAINING_ITERATION})
    """Keys Tune's logger leaves out of TensorBoard."""

    def __init__(self) -> None:
        import_tensorboardx_without_torch()  # before Tune's __init__ imports it
        super().__init__()  # type: ignore[no-untyped-call]
        self._summary_writer_cls = _EventFile

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        if trial not in self._trial_writer:
            self.log_trial_start(trial)
        step = result.get(STEP) or result.get(TIMESTEPS_TOTAL) or result[TRAINING_ITERATION]
        flat: dict[str, Any] = flatten_dict(
            {k: v for k, v in result.items() if k not in self._SKIPPED}, delimiter="/"
        )
        scalars = {  # Tune's rule: its numeric types (bool is an int), NaN left out
            f"ray/tune/{k}": v for k, v in flat.items() if isinstance(v, _SCALAR_TYPES) and not math.isnan(v)
        }
        from tensorboardX.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(v)) for tag, v in scalars.items()])
        writer = self._trial_writer[trial]
        writer.file_writer.add_summary(summary, global_step=step)
        writer.flush()
        self._trial_result[trial] = scalars  # what log_trial_end gives TensorBoard's HParams view


class NoTensorBoard(TBXLoggerCallback):
    """Where Tune would add its TensorBoard logger: writes nothing (``[run] tensorboard = false``)."""

    def __init__(self) -> None:  # tensorboardX is neither imported nor started
        self._trial_writer: dict[Trial, Any] = {}
        self._trial_result: dict[Trial, Any] = {}

    def log_trial_start(self, trial: Trial) -> None:
        pass

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        pass

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        pass


class NoCSV(CSVLoggerCallback):
    """Where Tune would add its CSV logger (each trial's ``progress.csv``): writes nothing."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Ray: untyped

    def log_trial_start(self, trial: Trial) -> None:
        pass

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        pass

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        pass
