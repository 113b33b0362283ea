"""Where a member's parameters lie in its row of the group's ``[K, P]`` tensor, and how a fused
step learns their names: from the plain model, by object, never from a string of its own.

`ParamLayout`: row k is member k's parameters flattened in the plain model's
``named_parameters()`` order, so a member's weights, gradient and Adam moments are each one row
(its gradient norm a row norm, its update touching its row only), and row i of Adam's moments is
parameter i of the plain optimiser's state.

`PlainNames`: a fused step is built from a plain model (`ponder.fused.step.FusedStep.of`) and
reads each plain layer it mirrors through here: `layer` checks its kind, `param` gives the name
of one of its parameters in the layout. What the fused step never read (a parameter, or a layer
without one) is refused by `PlainNames.check` in one line naming it: a layer added to the plain
step stops its group from being built instead of being silently left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["ParamLayout", "Params", "PlainNames"]

Params = dict[str, torch.Tensor]
"""A rows' parameters by the plain model's names, each ``[R, *shape]`` (`ParamLayout.unflatten`)."""


@dataclass(frozen=True)
class ParamLayout:
    """Each parameter's name and shape, in the plain model's ``named_parameters()`` order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, model: nn.Module) -> ParamLayout:
        """The layout of ``model``'s parameters."""
        named = list(model.named_parameters())
        return cls(tuple(n for n, _ in named), tuple(tuple(p.shape) for _, p in named))

    @property
    def sizes(self) -> list[int]:
        """Elements per parameter, in order."""
        return [math.prod(s) for s in self.shapes]

    @property
    def size(self) -> int:
        """P, the elements in one row."""
        return sum(self.sizes)

    def unflatten(self, flat: torch.Tensor) -> Params:
        """Views ``[R, *shape]`` of every parameter of the rows ``flat`` ``[R, P]``, by name."""
        pieces = torch.split(flat, self.sizes, dim=1)  # its backward is one cat: one [R, P] grad
        return {n: p.view(-1, *s) for n, p, s in zip(self.names, pieces, self.shapes, strict=True)}

    @torch.no_grad()
    def read(self, model: nn.Module) -> torch.Tensor:
        """``model``'s parameters as one row ``[P]``."""
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    @torch.no_grad()
    def write(self, row: torch.Tensor, model: nn.Module) -> None:
        """Copy one row ``[P]`` into ``model``'s parameters."""
        for p, piece in zip(model.parameters(), torch.split(row, self.sizes), strict=True):
            p.copy_(piece.view(p.shape))


class PlainNames:
    """A plain model's parameters and layers (modules without submodules) by object, each with its
    name in the model; ``twin`` names the fused step reading them, for the errors."""

    def __init__(self, model: nn.Module, twin: str) -> None:
        self._params: dict[int, str] = {id(p): name for name, p in model.named_parameters()}
        self._layers: dict[int, str] = {
            id(m): name for name, m in model.named_modules() if name and not any(m.children())
        }
        self._read: set[str] = set()
        self.twin = twin

    def layer(self, module: object, *kinds: type[nn.Module]) -> str:
        """The name of the plain layer ``module``, now read; ValueError if it is not one of
        ``kinds`` (none: any kind) or not a layer of the model."""
        name = self._layers.get(id(module)) if isinstance(module, nn.Module) else None
        if name is None:
            raise ValueError(f"{self.twin} reads {module!r}, which is not a layer of the plain model")
        if kinds and not isinstance(module, kinds):
            want = " or ".join(k.__name__ for k in kinds)
            raise ValueError(f"{name} is a {type(module).__name__}, where {self.twin} reads a {want}")
        self._read.add(name)
        return name

    def param(self, param: torch.Tensor | None) -> str:
        """The name of the plain parameter ``param`` in the layout, now read."""
        name = self._params.get(id(param))
        if name is None:
            raise ValueError(f"{self.twin} reads a tensor that is not a parameter of the plain model")
        self._read.add(name)
        return name

    def refuse(self, module: nn.Module, why: str) -> ValueError:
        """The error for a plain layer the fused step cannot follow: one line naming its first
        parameter (the layer itself where it has none) and ``why``."""
        name = self._layers.get(id(module), type(module).__name__)
        first = next((self._params[id(p)] for p in module.parameters()), name)
        return ValueError(f"{first} (a {type(module).__name__}) {why}")

    def unread(self) -> list[str]:
        """The plain parameters, then the plain layers, that nothing read, in the model's order."""
        return [n for n in (*self._params.values(), *self._layers.values()) if n not in self._read]

    def check(self) -> None:
        """ValueError naming the first plain parameter or layer the fused step did not read."""
        unread = self.unread()
        if unread:
            raise ValueError(
                f"{self.twin} does not read {unread[0]} of the plain model: give the fused step that "
                "layer's twin (ponder/fused/), or set fuse = 1"
            )
