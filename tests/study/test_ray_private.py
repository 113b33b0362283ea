"""The private names of Ray's this project uses (`study.search.ray_private.PRIVATE`) are still there."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import ray

from study.search.ray_private import PRIVATE, RAY_CHECKED


@pytest.mark.parametrize(("cls", "name"), [(c, n) for c, names in PRIVATE.items() for n in names])
def test_every_private_name_of_ray_used_is_still_there(cls: type, name: str) -> None:
    """An attribute set in ``__init__`` is found in its source; a method or class attribute on
    the class. A failure means the Ray upgrade changed what study/search/ray_private.py relies on."""
    source = inspect.getsource(cls)
    assert hasattr(cls, name) or f"self.{name} =" in source or f"self.{name}:" in source, (
        f"study/search/ray_private.py: Ray {ray.__version__} has no {cls.__name__}.{name} "
        f"(checked against Ray {RAY_CHECKED}); update the adapter before relying on this Ray"
    )


_MONITORS = """
import os, sys
from pathlib import Path
import ray
from study.search.ray_private import stop_local_monitor

def monitors():  # the autoscaler monitors below this process
    from study.run.processes import descendants
    found = []
    for pid, _ in descendants(os.getpid()):
        try:
            if b"autoscaler/_private/monitor.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found

before = stop_local_monitor()
ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False)  # a cluster's, joined
joined = stop_local_monitor()
ray.shutdown()
ray.init(address="local", include_dashboard=False, log_to_driver=False, num_cpus=1)  # its own
running = monitors()
own = stop_local_monitor()
print(before, joined, len(running), own, len(monitors()), stop_local_monitor())
ray.shutdown()
"""


@pytest.mark.ray
def test_only_the_monitor_of_an_instance_the_process_started_is_killed() -> None:
    """`stop_local_monitor` kills the autoscaler monitor of the driver's own instance (Ray would
    wait out its 1 s of grace at every exit), once, and nothing of a cluster the driver joined."""
    from tests.study.conftest import shared_ray

    address = shared_ray()
    env = {**os.environ, "RAY_AUTH_MODE": "token"}  # the shared instance's, as its drivers join it
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", _MONITORS, address], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, joined, running, own, left, again = map(int, done.stdout.split()[-6:])
    assert (before, joined) == (0, 0)  # no Ray yet; a joined cluster's monitor is not the driver's
    assert running == 1 and own == 1 and left == 0 and again == 0
