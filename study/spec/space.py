"""The searched space of a spec: one `Dimension` a ``[space.<field>]`` table, and every corner of
the space built as a config before Ray starts (`check_corners`), so that the config's own checks
speak in one line naming the key."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ponder.config import CONFIGS, ConfigError, TaskConfig
from ponder.metrics import eval_set_names
from study.spec.errors import config_error_field, fail
from study.spec.models import Range, Values

__all__ = ["Dimension", "check_corners", "dimension"]

_MAX_CORNERS = 4096  # past this many corners of the space, check each dimension's ends alone


@dataclass(frozen=True)
class Dimension:
    """One searched config field: an inclusive range (``low``/``high``) or a list of ``values``."""

    name: str
    """The config field, e.g. ``lambda_p``."""
    low: float | None
    """Lower end of the range (an int for an integer field); None for a categorical dimension."""
    high: float | None
    """Upper end, inclusive; None for a categorical dimension."""
    log: bool = False
    """Sample the range on a log scale."""
    values: tuple[Any, ...] | None = None
    """The choices of a categorical dimension; None for a range."""
    integer: bool = False
    """The config field is an int (``max_steps``, ``n_hidden``): the range holds integers."""

    @property
    def categorical(self) -> bool:
        """Whether the dimension is a list of values rather than a range."""
        return self.values is not None

    def coerce(self, value: Any) -> Any:
        """A sampled (or stored) value in the field's own type: ``5.0`` becomes ``5`` for an int field."""
        if self.integer and isinstance(value, float) and value.is_integer():
            return int(value)
        if (
            not self.integer
            and self.values is None
            and isinstance(value, int)
            and not isinstance(value, bool)
        ):
            return float(value)
        return value


def dimension(name: str, dim: Range[Any] | Values[Any], integer: bool) -> Dimension:
    """A validated ``[space.<name>]`` table as a `Dimension` (of an int field: ``integer``)."""
    if isinstance(dim, Values):
        return Dimension(name, None, None, values=tuple(dim.values), integer=integer)
    return Dimension(name, dim.low, dim.high, log=dim.log, integer=integer)


def check_corners(task: str, fixed: Mapping[str, Any], space: tuple[Dimension, ...]) -> list[str]:
    """Build the config at every corner of the space (each range's ends, each listed value) so that
    the config's own validation speaks before Ray starts; returns the evaluation sets reported at
    every corner."""
    cls = CONFIGS[task]
    points = [
        [("values", v) for v in d.values] if d.values is not None else [("low", d.low), ("high", d.high)]
        for d in space
    ]
    sets: list[str] | None = None
    for combo in _corners(points):
        searched: dict[str, Any] = {
            d.name: points[i][j][1] for i, (d, j) in enumerate(zip(space, combo, strict=True))
        }
        try:
            config = cls(**fixed, **searched)
        except ConfigError as exc:
            field_name = config_error_field(exc)
            moved = [i for i, j in enumerate(combo) if j != 0]
            names = [d.name for d in space]
            if field_name in names:
                i = names.index(field_name)
                key = f"space.{field_name}.{points[i][combo[i]][0]}"
                alone = moved in ([], [i])
            elif field_name in fixed:
                key, alone = f"config.{field_name}", _fails_alone(cls, fixed, field_name)
            else:
                i = moved[0] if moved else 0
                key, alone = f"space.{names[i]}.{points[i][combo[i]][0]}", False
            at = "" if alone else " (at " + ", ".join(f"{k}={v!r}" for k, v in searched.items()) + ")"
            fail(key, f"{exc}{at}")
        here = eval_set_names(config)
        sets = here if sets is None else [s for s in sets if s in here]
    assert sets is not None
    return sets


def _fails_alone(cls: type[TaskConfig], fixed: Mapping[str, Any], field_name: str) -> bool:
    """Whether the fixed fields, with defaults for the searched ones, fail on ``field_name`` too."""
    try:
        cls(**fixed)
    except ConfigError as exc:
        return config_error_field(exc) == field_name
    return False


def _corners(points: list[list[tuple[str, Any]]]) -> Iterator[tuple[int, ...]]:
    """Indices into ``points``: all firsts, then each dimension's other points alone, then every
    combination (or, past `_MAX_CORNERS`, all lasts)."""
    base = tuple(0 for _ in points)
    yield base
    seen = {base}
    for i, options in enumerate(points):
        for j in range(1, len(options)):
            combo = (*base[:i], j, *base[i + 1 :])
            seen.add(combo)
            yield combo
    if math.prod(len(p) for p in points) <= _MAX_CORNERS:
        rest: Iterable[tuple[int, ...]] = itertools.product(*(range(len(p)) for p in points))
    else:
        rest = [tuple(len(p) - 1 for p in points)]
    for combo in rest:
        if combo not in seen:
            yield combo
