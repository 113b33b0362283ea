"""Every reach into Ray's private attributes, in one place: checked against Ray 2.60.0.

A resume must act between Tune loading its saved trials and queueing them, and must correct
what Tune unpickled (the searcher's count, its storage, the callbacks' paths); Tune offers no
public hook for either. The subclasses of Ray's classes (`study.search.scheduler.PersistentASHA`,
`study.search.search.DivergenceAwareOptunaSearch`, `study.run.tensorboard.ScalarTensorBoard`,
`study.run.export._TuneTrials`) also read or override their parents' private state. `PRIVATE` lists
every such name; tests/study/test_ray_private.py fails, naming this module, when a Ray upgrade
changes one.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import os
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import ray._private.ray_constants as ray_constants
import ray._private.worker as ray_worker
import ray.train._internal.storage as ray_storage
import ray.tune.experiment.trial as ray_trial
import ray.tune.logger.json as ray_json_logger
import ray.tune.registry as ray_registry
import ray.tune.trainable.metadata as ray_trial_metadata
from ray._private.node import Node
from ray.train._internal.session import _TrainingResult
from ray.tune import ExperimentAnalysis
from ray.tune.execution.tune_controller import TuneController
from ray.tune.logger.tensorboardx import TBXLoggerCallback
from ray.tune.schedulers.async_hyperband import AsyncHyperBandScheduler, _Bracket
from ray.tune.search.optuna import OptunaSearch
from ray.tune.search.search_generator import SearchGenerator
from ray.tune.trainable.metadata import _TrainingRunMetadata

__all__ = [
    "PRIVATE",
    "RAY_CHECKED",
    "before_restored_trials_queue",
    "callbacks",
    "controller_of",
    "incremental_uploads",
    "remember_registered",
    "running_statistics_of",
    "scheduler",
    "search_alg",
    "searcher_experiment",
    "set_trial_count",
    "sorted_cutoffs",
    "stop_local_monitor",
    "storage",
    "training_result",
    "tune_json_in_c",
]

RAY_CHECKED = "2.60.0"

PRIVATE: dict[type | ModuleType, tuple[str, ...]] = {
    TuneController: (
        "_scheduler_alg",
        "_search_alg",
        "_callbacks",
        "_storage",
        "_requeue_restored_trials",
    ),
    SearchGenerator: ("_total_samples", "_counter", "_experiment"),
    AsyncHyperBandScheduler: ("_brackets", "_trial_info", "_time_attr", "_max_t"),
    _Bracket: ("_rungs", "cutoff", "rf"),
    OptunaSearch: (
        "_ot_study",
        "_ot_trials",
        "_space",
        "_completed_trials",
        "_sampler",
        "_storage",
        "_study_name",
        "_setup_study",
    ),
    # overridden or filled by subclasses elsewhere: study.run.tensorboard.ScalarTensorBoard,
    # study.run.export._TuneTrials
    TBXLoggerCallback: ("_summary_writer_cls", "_trial_writer", "_trial_result"),
    ExperimentAnalysis: ("_fetch_trial_dataframes",),
    # the local instance's processes, for `stop_local_monitor`
    ray_worker: ("_global_node",),
    Node: ("all_processes",),
    ray_constants: ("PROCESS_TYPE_MONITOR",),
    # Tune's registry of trainables, answered from memory (`remember_registered`)
    ray_registry: ("_global_registry", "TRAINABLE_CLASS"),
    # the json module with which Tune encodes a trial's saved state and reports (`tune_json_in_c`)
    ray_trial: ("json",),
    ray_trial_metadata: ("json",),
    ray_json_logger: ("json",),
    # Tune's upload of its experiment, made of the files changed since (`incremental_uploads`)
    ray_storage._FilesystemSyncer: ("_sync_up_command", "storage_filesystem"),
    # Tune's running statistics of a trial's metrics, kept for some only (`running_statistics_of`)
    _TrainingRunMetadata: ("update_metric", "metric_analysis", "metric_n_steps"),
}
"""Ray's classes and modules, and the private names of theirs this project uses."""


def controller_of(tune_controller: Any) -> Any:
    """The controller itself: a scheduler is handed a wrapper that warns on calls outside an
    allow-list (``checkpoint``, the forced save, is one)."""
    return getattr(tune_controller, "_tune_controller", tune_controller)


def scheduler(controller: Any) -> Any:
    return controller._scheduler_alg


def search_alg(controller: Any) -> Any:
    return controller._search_alg


def callbacks(controller: Any) -> list[Any]:
    return list(getattr(controller._callbacks, "_callbacks", []))


def storage(controller: Any) -> Any:
    return controller._storage


def stop_local_monitor() -> int:
    """Kill the autoscaler monitor of the Ray instance this process started, before
    ``ray.shutdown``; returns how many were killed. Ray stops the GCS first, and the monitor then
    spends its whole 1 s of grace reporting its own end to a GCS that is gone (1.01 s of every
    study's exit, measured on Ray 2.60). A single machine's monitor autoscales nothing and keeps
    no state; a driver that joined a cluster started none."""
    node = ray_worker._global_node
    if node is None:
        return 0
    killed = 0
    for info in node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []):
        if info.process.poll() is None:
            info.process.kill()
            info.process.wait(timeout=5)
            killed += 1
    return killed


def set_trial_count(search_alg: Any, total: int, created: int) -> None:
    """The search generator's target (``num_samples``) and its count of trials created so far."""
    if hasattr(search_alg, "_total_samples"):
        search_alg._total_samples = total
    if hasattr(search_alg, "_counter"):
        search_alg._counter = created


def searcher_experiment(search_alg: Any) -> Any:
    """The experiment the search generator creates new trials from (None if it has none)."""
    return getattr(search_alg, "_experiment", None)


def training_result(checkpoint: Any, metrics: dict[str, Any]) -> Any:
    """What a trial sends with a checkpoint, as Tune's ``Trial.on_checkpoint`` takes it."""
    return _TrainingResult(checkpoint=checkpoint, metrics=metrics)


@contextlib.contextmanager
def before_restored_trials_queue(hook: Callable[[Any, list[Any]], None]) -> Iterator[None]:
    """Call ``hook(controller, trials)`` inside Tune's restore, after it loaded the saved trials
    and the searcher's and callbacks' state, before it queues any trial."""
    original = TuneController._requeue_restored_trials

    def requeue(controller: Any, trials: list[Any], resume_config: Any) -> None:
        hook(controller, trials)
        original(controller, trials, resume_config)

    TuneController._requeue_restored_trials = requeue  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        TuneController._requeue_restored_trials = original  # type: ignore[method-assign]


def remember_registered() -> None:
    """Answer Tune's "is this trainable registered?" from memory once Ray's GCS said yes, and
    its trainable class once read. Tune asks the GCS twice for every trial it creates whether
    the trainable is registered, and reads and unpickles it once: 1 to 4 ms each on 2 cores,
    slower as a long study runs (bench/driver_scale.py). A registration or removal in this
    process forgets both answers."""
    registry = ray_registry._global_registry
    if getattr(registry, "_remembered", None) is not None:
        return
    known: set[tuple[str, str]] = set()
    classes: dict[tuple[str, str], Any] = {}
    contains, get = registry.contains, registry.get
    register, unregister = registry.register, registry.unregister

    def remembered(category: str, key: str) -> bool:
        if (category, key) in known:
            return True
        found = bool(contains(category, key))  # type: ignore[no-untyped-call]  # Ray: untyped
        if found:
            known.add((category, key))
        return found

    def remembered_class(category: str, key: str) -> Any:
        if category != ray_registry.TRAINABLE_CLASS:
            return get(category, key)  # type: ignore[no-untyped-call]  # Ray: untyped
        if (category, key) not in classes:
            classes[(category, key)] = get(category, key)  # type: ignore[no-untyped-call]
        return classes[(category, key)]

    def forgetting(change: Callable[..., Any]) -> Callable[..., Any]:
        def changed(category: str, key: str, *args: Any, **kwargs: Any) -> Any:
            known.discard((category, key))
            classes.pop((category, key), None)
            return change(category, key, *args, **kwargs)

        return changed

    registry.contains = remembered  # type: ignore[method-assign]
    registry.get = remembered_class  # type: ignore[method-assign]
    registry.register = forgetting(register)  # type: ignore[method-assign]
    registry.unregister = forgetting(unregister)  # type: ignore[method-assign]
    registry._remembered = known  # type: ignore[attr-defined]


class _JsonInC:
    """The json module as Tune's modules use it, written by Python's C encoder: ``dumps`` drops
    ``indent`` (the C encoder takes none), ``dump`` encodes in one go and writes the text (a
    streamed ``dump`` is always encoded in Python)."""

    def __init__(self, unindented: bool) -> None:
        self.unindented = unindented

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)

    def dumps(self, obj: Any, *, indent: Any = None, **kwargs: Any) -> str:
        return json.dumps(obj, **kwargs) if self.unindented else json.dumps(obj, indent=indent, **kwargs)

    def dump(self, obj: Any, fp: Any, **kwargs: Any) -> None:
        fp.write(self.dumps(obj, **kwargs))


def tune_json_in_c() -> None:
    """Have Tune's JSON written by Python's C encoder, the same values: each trial's saved state
    (its part of every save of the experiment) without indentation, and each report's line of a
    trial's ``result.json`` encoded in one go. Indented or streamed, Python's json encodes in
    Python: about a third of the driver's time a trial went to the report lines, and a trial's
    saved state took 1.7 ms, 1.3 ms unindented (bench/driver_scale.py, 12 reports a trial). Tune
    reads either form."""
    for module, unindented in ((ray_trial, True), (ray_trial_metadata, True), (ray_json_logger, False)):
        if not isinstance(getattr(module, "json", None), _JsonInC):
            setattr(module, "json", _JsonInC(unindented))  # noqa: B010  # mypy: the module's own import


_STATISTICS: frozenset[str] | None = None
"""The metrics Tune keeps running statistics of while `running_statistics_of` is in force."""


@contextlib.contextmanager
def running_statistics_of(metrics: Iterable[str]) -> Iterator[None]:
    """Within, Tune keeps its running statistics of a trial's metrics (max, min, mean, last, the
    means of the last 5 and 10 reports) for ``metrics`` alone. Tune updates them for every number
    of every report, 43 numbers a parity report: about a fifth of the driver's time a trial
    (bench/driver_scale.py under cProfile, N = 1,000), for statistics the study reads only of its
    objectives (`study.run.slim_trials`). Tune elsewhere in the process is left as it is."""
    global _STATISTICS
    if not getattr(_TrainingRunMetadata.update_metric, "_selective", False):
        update = _TrainingRunMetadata.update_metric

        def update_metric(self: Any, metric: str, value: Any, step: int | None = 1) -> None:
            if _STATISTICS is None or metric in _STATISTICS:
                update(self, metric, value, step)

        update_metric._selective = True  # type: ignore[attr-defined]
        _TrainingRunMetadata.update_metric = update_metric  # type: ignore[method-assign]
    previous, _STATISTICS = _STATISTICS, frozenset(metrics)
    try:
        yield
    finally:
        _STATISTICS = previous


def sorted_cutoffs(scheduler: AsyncHyperBandScheduler) -> None:
    """ASHA's cutoffs from each rung's values kept sorted (`_SortedCutoff`), in place of Ray's,
    which builds an array of every value the rung holds at each report that reaches it."""
    for bracket in scheduler._brackets:
        if not isinstance(bracket.__dict__.get("cutoff"), _SortedCutoff):
            bracket.cutoff = _SortedCutoff(bracket.rf)  # type: ignore[method-assign]


class _SortedCutoff:
    """A rung's cutoff as Ray's `_Bracket.cutoff` computes it (numpy's ``nanpercentile`` of the
    rung's values at ``(1 - 1 / rf) * 100``, linear interpolation), bit for bit, from the values
    kept sorted: Ray's took 226 µs a call at 10,000 trials against 26 µs at 1,000 (cProfile of
    bench/driver_scale.py), the growth of a report's cost. A rung only gains values (Ray's
    ``on_result``, `study.search.scheduler.PersistentASHA.replay`), in the dict's order: those
    past the ones seen are new. Values other than Python floats and ints take Ray's own path
    (numpy computes a float32 array in float32). Pickled without its cache."""

    def __init__(self, rf: float) -> None:
        self.rf = rf
        self._seen: dict[int, tuple[dict[str, Any], list[float], int]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"rf": self.rf}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["rf"])  # type: ignore[misc]

    def __call__(self, recorded: dict[str, Any]) -> Any:
        if not recorded:
            return None
        percent = (1 - 1 / self.rf) * 100
        seen = self._seen.get(id(recorded))
        if seen is None or seen[0] is not recorded or seen[2] > len(recorded):
            seen = (recorded, [], 0)
        values = seen[1]
        for value in itertools.islice(recorded.values(), seen[2], None):
            if type(value) is not float and type(value) is not int:
                self._seen.pop(id(recorded), None)
                return np.nanpercentile(list(recorded.values()), percent)  # Ray's own
            if value == value:  # NaN, which nanpercentile leaves out, is not equal to itself
                bisect.insort(values, value)
        self._seen[id(recorded)] = (recorded, values, len(recorded))  # holds it: its id stays its own
        return _linear_percentile(values, percent)


def _linear_percentile(values: list[float], percent: float) -> np.float64:
    """numpy's ``nanpercentile(values, percent)`` of NaN-free ``values``, sorted: its virtual index
    ``(n - 1) * q``, the two values around it (the last past the end), and its interpolation
    (``numpy.lib._function_base_impl._lerp``: from the upper value when the weight is 0.5 or more)."""
    n = len(values)
    if n == 0:
        return np.float64(np.nan)
    virtual = (n - 1) * np.true_divide(percent, 100)
    if virtual >= n - 1:  # numpy's index -1, for both
        below, lo, hi = -1, n - 1, n - 1
    else:
        below = lo = int(np.floor(virtual))
        hi = lo + 1
    gamma = virtual - below
    a, b = np.float64(values[lo]), np.float64(values[hi])
    diff = b - a
    return np.float64(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)


def incremental_uploads() -> None:
    """Tune's uploads of its experiment carry the files changed since this driver's last upload.

    Tune saves its experiment in a staging folder on the driver, then copies the whole folder to
    the study's storage (`ray.train._internal.storage._upload_to_fs_path`): every trial's folder
    (its ``params.json``, ``params.pkl``, ``result.json``) at every periodic save, and once more
    at the run's end. On S3 that is thousands of requests a save at 1,000 trials (3.6 writes a
    trial, and 80 s of the study's end, on moto), on a local disk a copy of every file. Here a
    file is copied when its size or modification time differs from what this syncer last copied
    (kept in memory, `_COPIED`: a new driver copies everything once, as Tune does). A file
    that changes while it is read is copied again at the next upload; a failed upload marks
    nothing copied. Uploads with exclusions take Tune's own path."""
    cls = ray_storage._FilesystemSyncer
    if getattr(cls._sync_up_command, "_incremental", False):
        return
    tunes = cls._sync_up_command

    def _sync_up_command(self: Any, local_path: str, uri: str, exclude: list[str] | None = None) -> Any:
        if exclude or not os.path.isdir(local_path):
            return tunes(self, local_path, uri, exclude)
        record = _COPIED.setdefault(self, _Copied())
        return _upload_changed, {
            "local_path": local_path,
            "fs": self.storage_filesystem,
            "fs_path": uri,
            "record": record,
        }

    _sync_up_command._incremental = True  # type: ignore[attr-defined]
    cls._sync_up_command = _sync_up_command  # type: ignore[method-assign]


UPLOAD_THREADS = 4
"""Files copied at once by `incremental_uploads` (Tune's own copy uses pyarrow's thread pool)."""


class _Copied:
    """What a syncer copied: each file's size and modification time, the folders it made. Tune
    pickles and deep-copies its syncer (with the experiment, while a copy runs in its thread, and
    the command it ran with it): a copy of this starts empty, and never reads the live one."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[int, int]] = {}
        self.folders: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


_COPIED: weakref.WeakKeyDictionary[Any, _Copied] = weakref.WeakKeyDictionary()
"""A syncer -> what it copied (`_Copied`)."""


def _upload_changed(local_path: str, fs: pafs.FileSystem, fs_path: str, record: _Copied) -> int:
    """Copy the files under ``local_path`` whose size and modification time ``record`` does not
    hold to the same place under ``fs_path``, making the folders there; returns how many."""
    copied, folders = record.files, record.folders
    changed: list[tuple[str, tuple[int, int]]] = []
    for root, _, files in os.walk(local_path):
        for name in files:
            path = os.path.join(root, name)
            try:
                stat = os.stat(path)
            except FileNotFoundError:  # removed since it was listed
                continue
            key = (stat.st_size, stat.st_mtime_ns)
            if copied.get(path) != key:
                changed.append((path, key))
    object_store = fs.type_name in ("s3", "gcs")  # where a folder is a prefix of names, not made
    targets = []
    for path, _ in changed:
        dest = f"{fs_path.rstrip('/')}/{os.path.relpath(path, local_path).replace(os.sep, '/')}"
        parent = dest.rsplit("/", 1)[0]
        if parent not in folders and not object_store:
            fs.create_dir(parent, recursive=True)
        folders.add(parent)
        targets.append(dest)

    def copy(path: str, dest: str) -> None:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:  # Tune removed it (an older state file) since it was listed
            return
        with fs.open_output_stream(dest) as out:
            out.write(data)

    if not changed:
        return 0
    with ThreadPoolExecutor(max_workers=UPLOAD_THREADS) as pool:  # each PUT waits on the network
        for (path, key), _ in zip(changed, pool.map(copy, [p for p, _ in changed], targets), strict=True):
            copied[path] = key  # the size and time seen before the read: a write since copies again
    return len(changed)
