"""The private names of Ray's this project uses (`study.ray_private.PRIVATE`) are still there."""

from __future__ import annotations

import inspect

import pytest
import ray

from study.ray_private import PRIVATE, RAY_CHECKED


@pytest.mark.parametrize(("cls", "name"), [(c, n) for c, names in PRIVATE.items() for n in names])
def test_every_private_name_of_ray_used_is_still_there(cls: type, name: str) -> None:
    """An attribute set in ``__init__`` is found in its source; a method or class attribute on
    the class. A failure means the Ray upgrade changed what study/ray_private.py relies on."""
    source = inspect.getsource(cls)
    assert hasattr(cls, name) or f"self.{name} =" in source or f"self.{name}:" in source, (
        f"study/ray_private.py: Ray {ray.__version__} has no {cls.__name__}.{name} "
        f"(checked against Ray {RAY_CHECKED}); update the adapter before relying on this Ray"
    )
