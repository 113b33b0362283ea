"""What a study's driver loads: torch is for the trials, not for the process that drives them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SNIPPET = """
import sys
from study.run.tensorboard import import_tensorboardx_without_torch
import_tensorboardx_without_torch()
assert "tensorboardX" in sys.modules and "torch" not in sys.modules, sorted(sys.modules)
from ray.tune.logger import TBXLoggerCallback  # what Tune's default loggers use
from tensorboardX import SummaryWriter
writer = SummaryWriter(sys.argv[1])
writer.add_scalar("test/halted_accuracy", 0.75, 3)
writer.close()
assert "torch" not in sys.modules
import torch  # still importable by whatever needs it later
print(torch.__name__)
"""


def test_tensorboardx_loads_without_torch_and_still_writes_events(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SNIPPET, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "torch"
    events = list(tmp_path.glob("events.out.tfevents.*"))
    assert len(events) == 1 and b"test/halted_accuracy" in events[0].read_bytes()


TRIAL_IMPORTS = """
import ray, ray.tune, torch  # what a Ray worker running a trial has loaded anyway
import study.run.trainable
from study.spec.models import document
assert document.cache_info().currsize == 0  # no spec models built for a trial
from study.spec.spec import load_spec
load_spec("parity-smoke")  # built when a spec is parsed
assert document.cache_info().currsize == 1
"""


def test_a_trial_worker_builds_no_spec_models() -> None:
    """A trial imports `study.run.trainable`, which reaches `study.spec.spec`; pydantic's models of the spec
    document are built when a spec is parsed, not at that import (built there, under the
    import's frames, they cost a Ray worker 0.6 s of CPU at every trial actor's start)."""
    done = subprocess.run([sys.executable, "-c", TRIAL_IMPORTS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
