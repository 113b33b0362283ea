"""The Tune trainable: one `ponder.Trainer` run, reported to Tune at every evaluation.

NaN safety lives here: Tune's scheduler and Optuna only ever see finite numbers. A metric
that is not finite is left out of the report (it reads as null in Parquet); the objective,
which ASHA and Optuna need at every report, is replaced by a finite value worse than any
real one. A run that passes its NaN limit reports ``outcome = "diverged"`` and returns;
`DivergenceAwareOptunaSearch` turns that into a FAILED Optuna trial.

Fault drills: with ``PONDER_STUDY_FAULT=raise@<iteration>`` in the environment of the Ray
nodes, every trial raises once, right after its first report (and checkpoint) at or past that
iteration; Tune retries it from that checkpoint (``[run] max_failures``). It checks, on a real
cluster and its storage, that a failed trial loses nothing; the tests use it the same way.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray import tune

from study.records.ranking import WORST
from study.records.records import has_ended
from study.run.fused import FusedRun, Fusion
from study.storage.storage import CHECKPOINT_FILE, StudyPaths

if TYPE_CHECKING:  # torch loads in the trial's process, never in the driver (about 1.5 s of CPU)
    from ponder.trainer import Metrics, Trainer

__all__ = [
    "CHECKPOINT_FILE",
    "FAULT_ENV",
    "InjectedFault",
    "fault_iteration",
    "train_trial",
    "tune_metrics",
]

FAULT_ENV = "PONDER_STUDY_FAULT"


class InjectedFault(RuntimeError):
    """The failure ``PONDER_STUDY_FAULT`` asks for."""


def fault_iteration() -> int | None:
    """The iteration after which each trial raises once, from ``PONDER_STUDY_FAULT=raise@N``."""
    value = os.environ.get(FAULT_ENV, "").strip()
    if not value:
        return None
    kind, _, at = value.partition("@")
    if kind != "raise" or not at.isdigit() or int(at) < 1:
        raise ValueError(f"{FAULT_ENV}={value!r}: expected raise@<iteration>, e.g. raise@20")
    return int(at)


def tune_metrics(metrics: Metrics, objectives: Mapping[str, str]) -> dict[str, Any]:
    """What Tune receives: ``metrics`` without non-finite numbers, and always a finite value for
    each objective (``{metric: "max" | "min"}``)."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if isinstance(value, list):
            value = [v if math.isfinite(v) else None for v in value]
        out[key] = value
    for objective, mode in objectives.items():
        if objective not in out:
            out[objective] = -WORST if mode == "max" else WORST
    return out


def train_trial(
    config: dict[str, Any],
    *,
    objectives: Mapping[str, str],
    paths: StudyPaths,
    threads: int,
    fusion: Fusion | None = None,
) -> None:
    """Train one trial, resuming from Tune's checkpoint when there is one; with ``fusion``, in its
    device's fused group (`study.run.fused`), which reports exactly what a `Trainer` would.

    A trial that had already ended (it has an end record, or its checkpoint says it finished)
    returns at once without training or reporting: nothing runs twice, even when Tune's saved
    state lags behind the study's records.
    """
    trial_id = tune.get_context().get_trial_id()
    if has_ended(paths, trial_id):
        return
    checkpoint = tune.get_checkpoint()
    if fusion is not None:
        state = None
        if checkpoint is not None:
            with checkpoint.as_directory() as d:
                state = (Path(d) / CHECKPOINT_FILE).read_bytes()
        fused = FusedRun(fusion, trial_id, dict(config), state)
        try:
            _report(fused, trial_id, objectives)
        finally:
            fused.leave()
        return
    trainer = _trainer(config, checkpoint, threads)
    if trainer.outcome == "running":
        _report(trainer, trial_id, objectives)


def _trainer(config: dict[str, Any], checkpoint: tune.Checkpoint | None, threads: int) -> Trainer:
    """The trial's own `Trainer`: its checkpoint's run continued, or a new one."""
    import torch

    from ponder.compiled import forget_compiled
    from ponder.config import config_from_dict, stored_config
    from ponder.trainer import Trainer

    torch.set_num_threads(threads)
    # Tune reuses this actor for trial after trial: without this, a compiled step's ninth shape
    # (another max_steps) would silently train eagerly, and old CUDA graphs would keep GPU memory
    forget_compiled()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            return Trainer.from_checkpoint(Path(d) / CHECKPOINT_FILE)
    return Trainer(config_from_dict(stored_config(config)))


def _report(run: FusedRun | Trainer, trial_id: str, objectives: Mapping[str, str]) -> None:
    """Report each of the run's metrics to Tune with its checkpoint, and where it ran."""
    where = {
        "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpu_ids": ",".join(str(i) for i in ray.get_gpu_ids()),
    }
    fault, started_at = fault_iteration(), run.iteration
    for metrics in run.run():
        fused = {"fuse_group": run.group, "fuse_members": run.members} if isinstance(run, FusedRun) else {}
        with tempfile.TemporaryDirectory() as d:
            run.save(Path(d) / CHECKPOINT_FILE)
            tune.report(
                {**tune_metrics(metrics, objectives), **where, "device": _device(run), **fused},
                checkpoint=tune.Checkpoint.from_directory(d),
            )
        if fault is not None and started_at < fault <= run.iteration:  # a retry starts past it
            raise InjectedFault(f"{FAULT_ENV}: trial {trial_id} fails once, at iteration {run.iteration}")


def _device(run: FusedRun | Trainer) -> str:
    if isinstance(run, FusedRun):
        return run.device
    from ponder.trainer import device_label

    return device_label(run.device)
