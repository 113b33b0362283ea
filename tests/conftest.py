"""Shared fixtures: every step function, built small, with an input batch that fits it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from ponder.model import StepFunction
from ponder.steps import MnistStep, ParityStep
from ponder.tasks import build_task
from tests.ponder.majority import MajorityConfig, majority_task


@dataclass
class StepCase:
    """A step function and a way to make inputs and labels for it."""

    name: str
    make_step: Callable[[], StepFunction]
    make_input: Callable[[int], torch.Tensor]
    make_labels: Callable[[int], torch.Tensor]


def _majority_step() -> StepFunction:
    """The test-only majority task's step, built through the registry as `Trainer` builds one."""
    with majority_task():
        config = MajorityConfig(n_bits=5, n_hidden=16, eval_samples=8, device="cpu")
        return build_task(config, torch.device("cpu")).model.step


STEP_CASES = [
    StepCase(
        "parity",
        lambda: ParityStep(n_elems=6, n_hidden=16),
        lambda b: torch.randint(-1, 2, (b, 6)).float(),
        lambda b: torch.randint(0, 2, (b,)).float(),
    ),
    StepCase(
        "mnist",
        lambda: MnistStep(n_hidden=16, n_embed=8),
        lambda b: torch.randn(b, 1, 28, 28),
        lambda b: torch.randint(0, 10, (b,)),
    ),
    StepCase(  # a task registered from outside ponder/ (tests/ponder/majority.py)
        "majority",
        _majority_step,
        lambda b: torch.randint(0, 2, (b, 5)).float(),
        lambda b: torch.randint(0, 2, (b,)).float(),
    ),
]


@pytest.fixture(params=STEP_CASES, ids=[c.name for c in STEP_CASES])
def step_case(request: pytest.FixtureRequest) -> StepCase:
    """Each step function in turn: shared properties are checked for all of them."""
    torch.manual_seed(0)
    case: StepCase = request.param
    return case


RAY_FIXTURES = frozenset({"smoke", "s3", "cluster", "driver", "api"})
"""Fixtures that start Ray, a CLI driver or moto's server."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``ray`` every test that trains for long (``slow``) or uses a fixture that starts Ray,
    a driver or moto: ``make test-fast`` runs the others, with a ``RAY_ADDRESS`` that makes any
    Ray start fail at once, so a test that starts Ray without the mark shows up there."""
    for item in items:
        if item.get_closest_marker("slow") or RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ray)
    # The longest modules first: a test process that draws a minute-long test near the end leaves
    # the other core idle while it finishes. (This keeps a module's tests together in the queue,
    # not in one process: --dist loadgroup hands ungrouped tests out one by one, so a module whose
    # tests share an expensive module fixture is an xdist_group, its fixture made once.)
    first = {name: rank for rank, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))
    if getattr(config.option, "loadgroup", False):  # a pytest-xdist worker of `--dist loadgroup`
        _group_suffixes(items)


def _group_suffixes(items: list[pytest.Item]) -> None:
    """``@<group>`` after the id of each test marked ``xdist_group``, by which pytest-xdist's
    controller sends a group's tests to one worker (its module fixtures start once). xdist adds
    it by setting ``item._nodeid``, which pytest 9 no longer reads (a node's id is ``item._id``):
    without this, a group's tests were spread over the workers, each starting their fixtures."""
    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
        suffix = f"@{'_'.join(sorted(names))}"
        if names and not item.nodeid.endswith(suffix):
            item._id = type(item._id).parse(item.nodeid + suffix)


LONGEST_MODULES = (
    "test_fused_mnist.py",
    "test_kill_campaign.py",
    "test_resume.py",
    "test_stops.py",
    "test_fused.py",
    "test_location.py",
    "test_cli.py",
    "test_readme.py",
    "test_notebook.py",
    "test_faults.py",
    "test_submit.py",
    "test_runner.py",
    "test_slurm.py",
)
"""Test modules by their wall time in the suite (`--durations`), longest first (by file name: both
``test_fused.py``, say). pytest-xdist sends the ``xdist_group`` modules (cluster, api, torn_state,
ray_contract, the compiling tests) before any of these, the groups with the most tests first."""
