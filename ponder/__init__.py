"""PonderNet in plain PyTorch: the halting distribution, its losses, two tasks, training.

No Ray here: the study layer (``study/``) wraps this library; this library knows nothing of it.
"""

from ponder.config import CONFIGS, ConfigError, MnistConfig, ParityConfig, PonderConfig, TaskConfig
from ponder.halting import (
    expected_steps,
    halting_distribution,
    log_geometric_prior,
    log_halting_distribution,
    sample_halting_step,
)
from ponder.losses import kl_to_prior, per_step_cross_entropy, reconstruction_loss
from ponder.model import HaltedOutput, PonderNet, PonderOutput, StepFunction
from ponder.steps import MnistStep, ParityStep
from ponder.trainer import Metrics, StepResult, Trainer

__all__ = [
    "CONFIGS",
    "ConfigError",
    "HaltedOutput",
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
    "halting_distribution",
    "kl_to_prior",
    "log_geometric_prior",
    "log_halting_distribution",
    "per_step_cross_entropy",
    "reconstruction_loss",
    "sample_halting_step",
]
