"""MNIST's fused step: `ponder.steps.MnistStep` for K members, its CNN as grouped convolutions and
its MLP step as batched products, both read layer by layer from the plain step.

    plain `ponder.steps.MnistStep`, one run                fused `FusedMnistStep`, K rows
    encode  e = cnn(x)                      [B, E]         members as channels: x [B, K, 28, 28],
                                                           step.cnn's layers batched  e [K, B, E]
                                                           (conv: groups = K; linear: baddbmm)
    unroll  h_{n+1} = tanh(mix([e, h_n]))   [N, B, H]      mix's first linear split into W_e e + b_1
            mix: linear, ReLU, dropout, linear             (once) and W_h h_n (a step); the rest of
                                                           step.mix batched; dropout: the step's mask
    heads   logits = W_y h, logit = w_l . h                both in one product (`fused_heads`)

so the ops dispatched do not grow with K. The convolutions run in channels-last memory, where
oneDNN's grouped kernels are fastest on the CPU; ``torch.func.vmap`` over ``functional_call`` of
the plain CNN (PyTorch's model-ensembling recipe) computes the same and was slower on the CPU
(``bench/fused_speed.py --task mnist --conv``; docs/fused.md). ``W_e e + b_1`` is computed once,
not at every step: the plain step multiplies ``[e, h_n]`` by ``W_1`` each step, the same sums in
another order (the numbers agree to rounding).

The twin follows the plain ``step.cnn`` and ``step.mix`` as they are (`ponder.fused.layers`): a
layer added, removed or moved there is in the fused step too, and one with no batched twin stops
the group from being built, naming its parameter.

Each row's batch (its training images' indices) and its dropout masks come from its own counter
stream (`ponder.data.mnist_stream`), drawn for every row by one set of ops inside the loss, so a
compiled group's data, forward pass and loss are one graph. Per-member max_steps are masked
(`ponder.fused.halting`): every row computes the group's N steps (the CNN, the cost, runs once
whatever N), a step past its own N_k has p = 0.

Shapes: K members (rows), B samples, N steps, E embedding, H hidden units, C = 10 classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ponder.config import KLDirection, MnistConfig, PonderConfig
from ponder.data.mnist_stream import (
    dropout_scale,
    dropout_threshold,
    stream_indices,
    stream_masks,
    stream_words_per_batch,
)
from ponder.fused.layers import BatchedLayer, Linear, batched_layers
from ponder.fused.layout import Params, PlainNames
from ponder.fused.loss import Losses
from ponder.fused.step import FusedStep, fused_forward_loss, fused_heads
from ponder.streams import iteration_keys, stream_words

if TYPE_CHECKING:
    from ponder.trainer import Trainer

__all__ = ["FusedMnistStep"]


@dataclass(frozen=True)
class FusedMnistStep(FusedStep):
    """`ponder.steps.MnistStep` over K rows: the CNN embeds each member's images once, the MLP
    mixes embedding and h at each step. Draws its rows' batches and dropout masks from their
    counter streams."""

    cnn: tuple[BatchedLayer, ...]
    """The plain ``step.cnn``'s layers, from images to rows."""
    mix_in: Linear
    """The plain ``step.mix``'s first layer, a linear map of ``[e, h_n]``."""
    mix: tuple[BatchedLayer, ...]
    """The rest of the plain ``step.mix``, on rows at every step."""
    output: Linear
    halt: Linear
    hidden: int
    """H, the hidden units (a dropout mask's width)."""

    @classmethod
    def read(cls, step: nn.Module, names: PlainNames) -> dict[str, Any]:
        first, *rest = step.get_submodule("mix").children()
        return {
            "cnn": batched_layers(step.get_submodule("cnn").children(), names, images=True),
            "mix_in": Linear.read(first, names),
            "mix": batched_layers(rest, names, repeated=True),
            "output": Linear.read(step.get_submodule("output"), names),
            "halt": Linear.read(step.get_submodule("halt"), names),
            "hidden": step.get_submodule("output").in_features,
        }

    def encode(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        """The CNN embedding ``[K, B, E]`` of each row's images ``x`` ``[K, B, C, 28, 28]``, by its
        own weights: the members' images are the channels of one batch."""
        members, batch = x.shape[:2]
        z = x.transpose(0, 1).reshape(batch, members * x.shape[2], *x.shape[3:])  # [B, K*C, 28, 28]
        z = z.contiguous(memory_format=torch.channels_last)
        for layer in self.cnn:  # e.g. [B, 16K, 24, 24] ... [B, 32K, 4, 4], then rows [K, B, E]
            z = layer(z, params, members)
        return z

    def unroll(
        self,
        params: Params,
        ctx: torch.Tensor,
        n_steps: int,
        masks: torch.Tensor | None = None,
        active: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """h_1 .. h_N ``[K, N, B, H]``, h_{n+1} = tanh(mix([e, h_n])) with step n's dropout masks
        ``masks[:, n]`` (``[K, N, B, H]``); every row at every step (``active`` is not read).

            [e, h] W_1^T + b_1 = (e W_e^T + b_1) + h W_h^T,   W_1 = [W_e, W_h]"""
        embed = ctx.shape[2]
        assert self.mix_in.bias is not None
        w_1, b_1 = params[self.mix_in.weight], params[self.mix_in.bias]  # [W_e, W_h]  # [K, H, E + H]
        pre = torch.baddbmm(b_1[:, None], ctx, w_1[..., :embed].transpose(1, 2))  # [K, B, H]
        w_h = w_1[..., embed:].transpose(1, 2).contiguous()  # W_h^T once, not a read a step  # [K, H, H]
        ready = [layer.ready(params) for layer in self.mix]
        h = torch.zeros_like(pre)  # h_0  # [K, B, H]
        states = []
        for n in range(n_steps):
            z = torch.baddbmm(pre, h, w_h)  # [K, B, H]
            for layer, once in zip(self.mix, ready, strict=True):  # ReLU, dropout, linear
                z = layer.repeat(z, once, masks, n)
            h = torch.tanh(z)  # [K, B, H]
            states.append(h)
        return torch.stack(states, dim=1)  # [K, N, B, H]

    def heads(self, params: Params, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(class logits ``[K, N, B, C]``, lambda logits ``[K, N, B]``)."""
        heads = fused_heads(params, states, self.output, self.halt)  # [K, N, B, C+1]
        return heads[..., :-1], heads[..., -1]

    def stream_loss(
        self,
        flat: torch.Tensor,
        base: torch.Tensor,
        k0: torch.Tensor,
        iterations: torch.Tensor,
        images: torch.Tensor,
        labels: torch.Tensor,
        rows: torch.Tensor,
        threshold: torch.Tensor,
        scale: torch.Tensor,
        batch_size: int,
        log_prior: torch.Tensor,
        beta: torch.Tensor,
        max_steps: torch.Tensor,
        n_steps: int,
        kl_direction: KLDirection,
        active: Sequence[int] | None = None,
    ) -> Losses:
        """`fused_forward_loss` on each row's counter-stream batch and dropout masks
        (`FusedStep.stream_loss`). ``images`` ``[M, 1, 28, 28]`` and ``labels`` ``[M]``: the group's
        image pool, held once; ``rows`` ``[R, T]`` (or ``[1, T]``, shared): each row's training
        images as rows of the pool; ``threshold`` and ``scale`` ``[R]``: its dropout
        (`ponder.data.mnist_stream.stream_masks`)."""
        members = flat.shape[0]
        words = stream_words(base, iteration_keys(k0, iterations))  # [R, W]
        index = stream_indices(words, batch_size, rows.shape[1])  # into each row's training images  # [R, B]
        picked = rows.expand(members, -1).gather(1, index)  # rows of the pool  # [R, B]
        masks = stream_masks(words, batch_size, self.hidden, n_steps, threshold, scale)  # [R, N, B, H]
        x, y = images[picked], labels[picked]  # [R, B, 1, 28, 28], [R, B]
        return fused_forward_loss(self, flat, x, y, masks, log_prior, beta, max_steps, n_steps, kl_direction)

    @staticmethod
    def stream_width(config: PonderConfig, n_steps: int) -> int:
        assert isinstance(config, MnistConfig)
        return stream_words_per_batch(config.batch_size, config.n_hidden, n_steps)

    @staticmethod
    def row_data(trainers: Sequence[Trainer | None], device: torch.device) -> tuple[torch.Tensor, ...]:
        """(images, labels, rows, threshold, scale) of `stream_loss` for these rows (a padding row
        reads the first member's training images, with no dropout)."""
        first = next(t for t in trainers if t is not None)
        data = first.stream_data
        trains = [(t or first).stream_data["train"] for t in trainers]
        # one [1, T] row when every member reads the same training images (a data_dir, or one seed)
        rows = trains[0][None] if all(t is trains[0] for t in trains) else torch.stack(trains)
        dropouts = [
            t.config.dropout if t is not None and isinstance(t.config, MnistConfig) else 0.0 for t in trainers
        ]
        threshold = torch.tensor([dropout_threshold(p) for p in dropouts], device=device)  # [R]
        scale = torch.tensor([dropout_scale(p) for p in dropouts], device=device)  # [R]
        return data["images"], data["labels"], rows, threshold, scale

    @staticmethod
    def shared(trainer: Trainer) -> tuple[torch.Tensor, ...]:
        """The image pool and its labels, held once by the group."""
        return trainer.stream_data["images"], trainer.stream_data["labels"]
