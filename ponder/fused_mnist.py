"""K MNIST PonderNets as one model: the CNN as grouped convolutions, the MLP step as batched products.

Member k's parameters are row k of the group's ``[K, P]`` tensor (`ponder.fused.ParamLayout`, the
plain `ponder.steps.MnistStep` model's names and order). One fused iteration:

    x [K, B, 1, 28, 28]  -> [B, K, 28, 28]: the members are the channels of one image batch
    conv 5x5, groups = K  (member k's 16 filters see channel k only)   [B, 16K, 24, 24]
    max-pool 2, ReLU; conv 5x5, groups = K                             [B, 32K, 8, 8]
    max-pool 2, ReLU; per member a linear, ReLU                        e [K, B, E]
    h_{n+1} = tanh(W_2 (ReLU(W_e e + W_h h_n + b_1) * mask_n) + b_2)  [K, B, H], N steps
    heads: [logits, lambda logit] = h [W_y; w_l]^T + b                 [K, N, B, 11]

so the ops dispatched do not grow with K. The convolutions run in channels-last memory, where
oneDNN's grouped kernels are fastest on the CPU; ``torch.func.vmap`` over ``functional_call`` of
the plain CNN (PyTorch's model-ensembling recipe) computes the same and was slower on the CPU
(``bench/fused_speed.py --task mnist --conv``; docs/fused.md). ``W_e e + b_1`` is computed once,
not at every step: the plain step multiplies ``[e, h_n]`` by ``W_1`` each step, the same sums in
another order (the numbers agree to rounding).

Each row's batch (its training images' indices) and its dropout masks come from its own counter
stream (`ponder.data.mnist_stream`), drawn for every row by one set of ops inside the loss, so a
compiled group's data, forward pass and loss are one graph. Per-member max_steps are masked as
parity's are (`ponder.fused.fused_log_halting_distribution`): every row computes the group's N
steps (the CNN, the cost, runs once whatever N), a step past its own N_k has p = 0.

Shapes: K members (rows), B samples, N steps, E embedding, H hidden units, C = 10 classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ponder.config import KLDirection, MnistConfig, PonderConfig
from ponder.data.mnist_stream import (
    dropout_scale,
    dropout_threshold,
    stream_indices,
    stream_masks,
    stream_words_per_batch,
)
from ponder.fused import ParamLayout, fused_halting_loss, fused_log_halting_distribution
from ponder.fused_task import FusedTask
from ponder.streams import iteration_keys, stream_words

if TYPE_CHECKING:
    from ponder.trainer import Trainer

__all__ = [
    "MNIST",
    "fused_mnist_embed",
    "fused_mnist_forward",
    "fused_mnist_loss",
    "fused_mnist_stream_forward_loss",
]

_CNN = "step.cnn."


def fused_mnist_embed(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The CNN embedding ``[K, B, E]`` of each row's images ``x`` ``[K, B, 1, 28, 28]``, by its own
    weights (``params``: `ParamLayout.unflatten`'s views, a leading K): two grouped convolutions
    (one group a member), then a batched linear."""
    members, batch = x.shape[:2]
    w1, w2 = params[_CNN + "0.weight"], params[_CNN + "3.weight"]  # [K, 16, 1, 5, 5], [K, 32, 16, 5, 5]
    z = x.view(members, batch, *x.shape[3:]).transpose(0, 1)  # a member a channel  # [B, K, 28, 28]
    z = z.contiguous(memory_format=torch.channels_last)
    z = F.conv2d(z, w1.flatten(0, 1), params[_CNN + "0.bias"].flatten(), groups=members)  # [B, 16K, 24, 24]
    z = F.relu(F.max_pool2d(z, 2))  # [B, 16K, 12, 12]
    z = F.conv2d(z, w2.flatten(0, 1), params[_CNN + "3.bias"].flatten(), groups=members)  # [B, 32K, 8, 8]
    z = F.relu(F.max_pool2d(z, 2))  # [B, 32K, 4, 4]
    flat = z.reshape(batch, members, -1).transpose(0, 1)  # each member's (c, h, w) flattened  # [K, B, 512]
    w3, b3 = params[_CNN + "7.weight"], params[_CNN + "7.bias"]  # [K, E, 512], [K, E]
    return F.relu(torch.baddbmm(b3[:, None], flat, w3.transpose(1, 2)))  # [K, B, E]


def fused_mnist_forward(
    params: dict[str, torch.Tensor], x: torch.Tensor, masks: torch.Tensor, n_steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(class logits ``[K, N, B, C]``, lambda logits ``[K, N, B]``) of K `ponder.steps.MnistStep`
    PonderNets unrolled N steps on their images ``x`` ``[K, B, 1, 28, 28]``, step n's dropout
    ``masks[:, n]`` (``[K, N, B, H]``)."""
    e = fused_mnist_embed(params, x)  # [K, B, E]
    members, batch, embed = e.shape
    w1 = params["step.mix.0.weight"]  # [W_e, W_h]  # [K, H, E + H]
    pre = torch.baddbmm(params["step.mix.0.bias"][:, None], e, w1[..., :embed].transpose(1, 2))  # [K, B, H]
    w_h = w1[..., embed:].transpose(1, 2).contiguous()  # W_h^T once, not a strided read a step  # [K, H, H]
    w_2 = params["step.mix.3.weight"].transpose(1, 2).contiguous()  # [K, H, H]
    b_2 = params["step.mix.3.bias"][:, None]  # [K, 1, H]
    h = torch.zeros_like(pre)  # h_0  # [K, B, H]
    states = []
    for n in range(n_steps):
        hidden = torch.relu(torch.baddbmm(pre, h, w_h)) * masks[:, n]  # [K, B, H]
        h = torch.tanh(torch.baddbmm(b_2, hidden, w_2))  # [K, B, H]
        states.append(h)
    flat_states = torch.stack(states, dim=1).view(members, n_steps * batch, -1)  # [K, N*B, H]
    # both heads in one product: [logits, lambda logit] = h [W_y; w_l]^T + [b_y, b_l]
    w_heads = torch.cat([params["step.output.weight"], params["step.halt.weight"]], dim=1)  # [K, C+1, H]
    b_heads = torch.cat([params["step.output.bias"], params["step.halt.bias"]], dim=1)  # [K, C+1]
    heads = torch.baddbmm(b_heads[:, None], flat_states, w_heads.transpose(1, 2))  # [K, N*B, C+1]
    heads = heads.view(members, n_steps, batch, -1)
    return heads[..., :-1], heads[..., -1]  # [K, N, B, C], [K, N, B]


def fused_mnist_loss(
    layout: ParamLayout,
    flat: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    masks: torch.Tensor,
    log_prior: torch.Tensor,
    beta: torch.Tensor,
    max_steps: torch.Tensor,
    n_steps: int,
    kl_direction: KLDirection,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(L, L_rec, L_reg), each ``[K]``, of the rows ``flat`` ``[K, P]`` on their batches ``x``
    ``[K, B, 1, 28, 28]``, ``y`` ``[K, B]`` with dropout ``masks`` ``[K, N, B, H]``: each member's
    `ponder.trainer.ponder_loss` with its own max_steps masked."""
    logits, lambda_logits = fused_mnist_forward(layout.unflatten(flat), x, masks, n_steps)
    log_p = fused_log_halting_distribution(lambda_logits, max_steps)  # [K, N, B]
    members, _, batch, classes = logits.shape
    labels = y[:, None, :].expand(members, n_steps, batch)  # [K, N, B]
    step_losses = F.cross_entropy(logits.reshape(-1, classes), labels.reshape(-1), reduction="none")
    return fused_halting_loss(
        step_losses.view(members, n_steps, batch), log_p, log_prior, beta, max_steps, kl_direction
    )


def fused_mnist_stream_forward_loss(
    layout: ParamLayout,
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fused_mnist_loss` on each row's own counter-stream batch and dropout masks at its own
    iteration, drawn for all rows by one set of ops (`ponder.data.mnist_stream`).

    ``base`` ``[K, W]``, ``k0`` and ``iterations`` ``[K]``: each row's stream at its iteration;
    ``images`` ``[M, 1, 28, 28]`` and ``labels`` ``[M]``: the group's image pool, held once;
    ``rows`` ``[K, T]`` (or ``[1, T]``, shared): each row's training images as rows of the pool;
    ``threshold`` and ``scale`` ``[K]``: its dropout (`ponder.data.mnist_stream.stream_masks`).
    ``active`` is not used: every row computes every step."""
    members = flat.shape[0]
    hidden = layout.shapes[layout.names.index("step.mix.3.weight")][0]  # H
    words = stream_words(base, iteration_keys(k0, iterations))  # [K, W]
    index = stream_indices(words, batch_size, rows.shape[1])  # into each row's training images  # [K, B]
    picked = rows.expand(members, -1).gather(1, index)  # rows of the pool  # [K, B]
    masks = stream_masks(words, batch_size, hidden, n_steps, threshold, scale)  # [K, N, B, H]
    x, y = images[picked], labels[picked]  # [K, B, 1, 28, 28], [K, B]
    return fused_mnist_loss(layout, flat, x, y, masks, log_prior, beta, max_steps, n_steps, kl_direction)


def _mnist_rows(trainers: Sequence[Trainer | None], device: torch.device) -> tuple[torch.Tensor, ...]:
    """(images, labels, rows, threshold, scale) of `fused_mnist_stream_forward_loss` for these rows
    (a padding row reads the first member's training images, with no dropout)."""
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


def _mnist_width(config: PonderConfig, n_steps: int) -> int:
    assert isinstance(config, MnistConfig)
    return stream_words_per_batch(config.batch_size, config.n_hidden, n_steps)


def _mnist_shared(trainer: Trainer) -> tuple[torch.Tensor, ...]:
    return trainer.stream_data["images"], trainer.stream_data["labels"]


MNIST = FusedTask(
    name="mnist",
    stream_loss=fused_mnist_stream_forward_loss,
    stream_width=_mnist_width,
    row_data=_mnist_rows,
    shared=_mnist_shared,
)
"""MNIST's batched step: counter streams only (dropout masks included), every row every step."""
