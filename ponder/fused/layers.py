"""Batched twins of the plain layers a step is built of: K members' layers applied by one set of
ops, each member with its own weights (its row's views, `ponder.fused.layout.ParamLayout.unflatten`:
the plain parameter's shape with a leading K).

A plain ``nn.Sequential`` of a step is read layer by layer (`batched_layers`), so its fused twin is
built from the plain layers themselves: a layer added, removed or moved in the plain step is
added, removed or moved in its twin, and a layer with no twin here stops the group from being
built, naming its parameter (`ponder.fused.layout.PlainNames.refuse`).

Two layouts of K members' activations:

    images  [B, K*C, H, W]   member k's C channels side by side: a convolution is one grouped
                             call (groups = K, member k's filters see its own channels only),
                             in channels-last memory, where oneDNN's grouped kernels are fastest
    rows    [K, B, F]        a linear layer is one batched product: y_k = z_k W_k^T + b_k

``nn.Flatten`` turns images into rows. A layer applied at every step of an unroll (`repeat`)
computes what it can once (`ready`: W^T made contiguous, not a strided read a step); there a
dropout layer multiplies by the step's mask from the member's counter stream, as the plain step
does given ``masks`` (`ponder.steps.MnistStep.transition`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ponder.fused.layout import Params, PlainNames

__all__ = [
    "BatchedLayer",
    "Conv2d",
    "Dropout",
    "Flatten",
    "Linear",
    "MaxPool2d",
    "ReLU",
    "Tanh",
    "batched_layers",
]


class BatchedLayer:
    """One plain layer's twin over K members."""

    def __call__(self, z: torch.Tensor, params: Params, members: int) -> torch.Tensor:
        """The layer applied once to K members' activations ``z``."""
        raise NotImplementedError(f"{type(self).__name__} is applied at each step only")

    def ready(self, params: Params) -> tuple[torch.Tensor, ...]:
        """What `repeat` reads at every step, computed once an unroll."""
        return ()

    def repeat(
        self, z: torch.Tensor, ready: tuple[torch.Tensor, ...], masks: torch.Tensor | None, n: int
    ) -> torch.Tensor:
        """The layer at step ``n`` of an unroll, on rows ``[K, B, F]``; ``masks`` ``[K, N, B, F]``:
        each step's dropout masks."""
        return self(z, {}, z.shape[0])


@dataclass(frozen=True)
class Conv2d(BatchedLayer):
    """``nn.Conv2d`` on images: one convolution with groups = K."""

    weight: str
    bias: str | None
    stride: tuple[int, ...]
    padding: tuple[int, ...] | str
    dilation: tuple[int, ...]

    def __call__(self, z: torch.Tensor, params: Params, members: int) -> torch.Tensor:
        w = params[self.weight].flatten(0, 1)  # [K, O, C, kh, kw] -> [K*O, C, kh, kw]
        b = None if self.bias is None else params[self.bias].flatten()  # [K*O]
        return F.conv2d(z, w, b, self.stride, self.padding, self.dilation, groups=members)  # [B, K*O, h, w]


@dataclass(frozen=True)
class MaxPool2d(BatchedLayer):
    """``nn.MaxPool2d`` on images: each channel on its own, whichever member it is."""

    kernel_size: int | tuple[int, ...]
    stride: int | tuple[int, ...]
    padding: int | tuple[int, ...]
    dilation: int | tuple[int, ...]
    ceil_mode: bool

    def __call__(self, z: torch.Tensor, params: Params, members: int) -> torch.Tensor:
        return F.max_pool2d(z, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)


@dataclass(frozen=True)
class ReLU(BatchedLayer):
    """``nn.ReLU``, elementwise in either layout."""

    def __call__(self, z: torch.Tensor, params: Params, members: int) -> torch.Tensor:
        return torch.relu(z)


@dataclass(frozen=True)
class Tanh(BatchedLayer):
    """``nn.Tanh``, elementwise in either layout."""

    def __call__(self, z: torch.Tensor, params: Params, members: int) -> torch.Tensor:
        return torch.tanh(z)


@dataclass(frozen=True)
class Flatten(BatchedLayer):
    """``nn.Flatten()`` from images ``[B, K*C, H, W]`` to rows ``[K, B, C*H*W]``: each member's
    (c, h, w) flattened in the plain order."""

    def __call__(self, z: torch.Tensor, params: Params, members: int) -> torch.Tensor:
        return z.reshape(z.shape[0], members, -1).transpose(0, 1)


@dataclass(frozen=True)
class Linear(BatchedLayer):
    """``nn.Linear`` on rows: y_k = z_k W_k^T + b_k, one batched product ``[K, B, O]``."""

    weight: str
    bias: str | None

    @classmethod
    def read(cls, layer: object, names: PlainNames) -> Linear:
        """The twin of the plain ``nn.Linear`` ``layer``."""
        names.layer(layer, nn.Linear)
        assert isinstance(layer, nn.Linear)
        return cls(names.param(layer.weight), None if layer.bias is None else names.param(layer.bias))

    def __call__(self, z: torch.Tensor, params: Params, members: int) -> torch.Tensor:
        w_t = params[self.weight].transpose(1, 2)  # [K, F, O]
        if self.bias is None:
            return torch.bmm(z, w_t)
        return torch.baddbmm(params[self.bias][:, None], z, w_t)  # [K, B, O]

    def ready(self, params: Params) -> tuple[torch.Tensor, ...]:
        w_t = params[self.weight].transpose(1, 2).contiguous()  # W^T once  # [K, F, O]
        return (w_t,) if self.bias is None else (w_t, params[self.bias][:, None])  # [K, 1, O]

    def repeat(
        self, z: torch.Tensor, ready: tuple[torch.Tensor, ...], masks: torch.Tensor | None, n: int
    ) -> torch.Tensor:
        return torch.bmm(z, ready[0]) if len(ready) == 1 else torch.baddbmm(ready[1], z, ready[0])


@dataclass(frozen=True)
class Dropout(BatchedLayer):
    """``nn.Dropout`` inside an unroll: step n's mask ``masks[:, n]`` (0, or the kept units' scale)."""

    def repeat(
        self, z: torch.Tensor, ready: tuple[torch.Tensor, ...], masks: torch.Tensor | None, n: int
    ) -> torch.Tensor:
        assert masks is not None, "a fused dropout reads its masks from the counter stream"
        return z * masks[:, n]


def batched_layers(
    layers: Iterable[nn.Module], names: PlainNames, images: bool = False, repeated: bool = False
) -> tuple[BatchedLayer, ...]:
    """The twins of the plain ``layers`` in order (an ``nn.Sequential``, or some of its layers),
    starting on images or on rows; ``repeated``: applied at every step of an unroll, where a
    dropout reads the step's masks. ValueError, naming the layer's parameter, for a layer with no
    twin here."""
    twins = []
    for layer in layers:
        twin = _twin(layer, names, images, repeated)
        images = images and not isinstance(twin, Flatten)
        twins.append(twin)
    return tuple(twins)


def _twin(layer: nn.Module, names: PlainNames, images: bool, repeated: bool) -> BatchedLayer:
    if isinstance(layer, nn.Linear) and not images:
        return Linear.read(layer, names)
    names.layer(layer)
    if isinstance(layer, nn.ReLU | nn.Tanh):
        return ReLU() if isinstance(layer, nn.ReLU) else Tanh()
    if isinstance(layer, nn.Conv2d) and images and layer.groups == 1 and layer.padding_mode == "zeros":
        bias = None if layer.bias is None else names.param(layer.bias)
        padding = layer.padding if isinstance(layer.padding, str) else tuple(layer.padding)
        return Conv2d(names.param(layer.weight), bias, layer.stride, padding, layer.dilation)
    if isinstance(layer, nn.MaxPool2d) and images and not layer.return_indices:
        return MaxPool2d(layer.kernel_size, layer.stride, layer.padding, layer.dilation, layer.ceil_mode)
    if isinstance(layer, nn.Flatten) and images and (layer.start_dim, layer.end_dim) == (1, -1):
        return Flatten()
    if isinstance(layer, nn.Dropout) and repeated:
        return Dropout()
    where = "on images" if images else "on rows" if repeated else "once on rows"
    raise names.refuse(layer, f"has no batched twin {where} in ponder.fused.layers: add one, or set fuse = 1")
