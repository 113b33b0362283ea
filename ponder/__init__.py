"""PonderNet in plain PyTorch: the halting distribution, its losses, two tasks, training.

No Ray here: the study layer (``study/``) wraps this library; this library knows nothing of it.

The names below load their module on first use (PEP 562), so importing ``ponder.config`` or
``ponder.metrics`` (what checking a spec or reading a study needs) does not load torch. The
built-in tasks are registered here (`ponder.tasks`, torch-free at import), so that whichever
module of ponder is imported first, ``ponder.config.CONFIGS`` and the registry have them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ponder import tasks as _tasks  # noqa: F401  (registers the built-in tasks)

if TYPE_CHECKING:
    from ponder.config import CONFIGS, ConfigError, MnistConfig, ParityConfig, PonderConfig, TaskConfig
    from ponder.halting import (
        HaltingAccuracies,
        expected_steps,
        halting_accuracies,
        halting_distribution,
        log_geometric_prior,
        log_halting_distribution,
        sample_halting_step,
    )
    from ponder.losses import kl_to_prior, per_step_cross_entropy, reconstruction_loss
    from ponder.model import HaltedOutput, PonderNet, PonderOutput, StepFunction
    from ponder.steps import MnistStep, ParityStep
    from ponder.trainer import Metrics, StepResult, Trainer

_HOMES = {
    "config": ("CONFIGS", "ConfigError", "MnistConfig", "ParityConfig", "PonderConfig", "TaskConfig"),
    "halting": (
        "HaltingAccuracies",
        "expected_steps",
        "halting_accuracies",
        "halting_distribution",
        "log_geometric_prior",
        "log_halting_distribution",
        "sample_halting_step",
    ),
    "losses": ("kl_to_prior", "per_step_cross_entropy", "reconstruction_loss"),
    "model": ("HaltedOutput", "PonderNet", "PonderOutput", "StepFunction"),
    "steps": ("MnistStep", "ParityStep"),
    "trainer": ("Metrics", "StepResult", "Trainer"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "CONFIGS",
    "ConfigError",
    "HaltedOutput",
    "HaltingAccuracies",
    "Metrics",
    "MnistConfig",
    "MnistStep",
    "ParityConfig",
    "ParityStep",
    "PonderConfig",
    "PonderNet",
    "PonderOutput",
    "StepFunction",
    "StepResult",
    "TaskConfig",
    "Trainer",
    "expected_steps",
    "halting_accuracies",
    "halting_distribution",
    "kl_to_prior",
    "log_geometric_prior",
    "log_halting_distribution",
    "per_step_cross_entropy",
    "reconstruction_loss",
    "sample_halting_step",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'ponder' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ponder.{module}"), name)
    globals()[name] = value  # once: later lookups find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
