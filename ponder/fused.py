"""K parity PonderNets as one model: the members' weights stacked along a leading dimension K,
every op batched over K (``torch.baddbmm``), one loss per member.

Why: a parity trial's model is tiny (a GRU step of 64 units, batch 128), so one training iteration
is mostly per-op overhead, not arithmetic. K members stepped by one set of batched ops pay that
overhead once (`ponder.fused_trainer.FusedTrainer` trains them; ``bench/fused_speed.py`` measures it).

Layout: the K members' parameters are one ``[K, P]`` tensor; row k is member k's parameters
flattened in the plain model's parameter order (`ParamLayout`). A member's weights, gradient and
Adam moments are each one row: its gradient norm is a row norm, its update touches its row only.

Per-member ``max_steps`` N_k: the group unrolls N = max_k N_k steps. Member k's lambda is forced to 1
at its own step N_k and its p is 0 past it: log p = -inf there, kept out of every loss term (no
0 * -inf, no NaN gradient). Its first N_k steps compute what the plain `ponder.model.PonderNet`
computes: the GRU is causal, so the steps it runs past N_k change nothing before.

``torch.func.vmap`` over the plain model does not fit: its GRU (`ponder.gru.gru_unroll`) is an
autograd Function writing into preallocated outputs, which vmap cannot batch. The GRU here is the
same equations in plain batched ops, differentiated by autograd and traceable by ``torch.compile``.

What every task's fused loss shares (the masked halting distribution, `fused_halting_loss`) is
here too; `PARITY` is parity's `ponder.fused_task.FusedTask`, MNIST's is in `ponder.fused_mnist`.

Shapes: K members (rows), N steps, B samples, I = n_elems inputs, H hidden units, P parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ponder.config import KLDirection, ParityConfig, PonderConfig
from ponder.data.parity import stream_batches, stream_words_per_batch
from ponder.fused_task import FusedTask
from ponder.streams import iteration_keys, stream_words
from ponder.tasks import task_of
from ponder.trainer import resolve_device

if TYPE_CHECKING:
    from ponder.trainer import Trainer

__all__ = [
    "FUSED_KEY_FIELDS",
    "PARITY",
    "ParamLayout",
    "fusable_key",
    "fusable_mismatch",
    "fused_forward",
    "fused_forward_loss",
    "fused_gru_unroll",
    "fused_halting_loss",
    "fused_log_halting_distribution",
    "fused_ponder_loss",
    "fused_stream_forward_loss",
    "padded_log_prior",
]

_SHARED = ("task", "n_hidden", "batch_size", "kl_direction", "device", "compile", "data_stream")

FUSED_KEY_FIELDS: dict[str, tuple[str, ...]] = {
    "parity": (*_SHARED[:1], "n_elems", *_SHARED[1:]),
    "mnist": (*_SHARED[:1], "n_embed", *_SHARED[1:], "data_dir", "train_rotation"),
}
"""Per task, the config fields every member of one fused group shares. The shapes (n_elems or
n_embed, n_hidden, batch_size) are the stacked tensors' shapes; the KL direction is a different
formula, not a masked value; the device holds every tensor; the data stream is how the group draws
its batches (counter: all at once; generator: one draw per member, for parity runs made before
counter streams); ``compile`` is how the group's step runs (`ponder.compiled.should_compile` on
the device, as for a plain run); MNIST's ``data_dir`` and ``train_rotation`` are the training
images the group holds once (`ponder.data.mnist_shared`). Everything else is per member: lambda_p
and prior_tail (its own log prior row), beta, lr, grad_clip, dropout (per-row scalars), seed (its
own weights, data and evaluation sets), max_steps (masked, module docstring), the nonzero range,
the evaluation sets' sizes and angles, the budget and the NaN limit."""


def fusable_key(config: PonderConfig) -> tuple[tuple[str, object], ...]:
    """The ``(field, value)`` pairs members of one fused group must share (`FUSED_KEY_FIELDS`);
    configs with equal keys can train fused. ``device`` is resolved (``auto`` is what it means
    here). Raises ValueError, saying why in one line, for a task without a batched step or a data
    stream it does not fuse on (MNIST's generator stream: `ponder.tasks.TaskDef.fuse_refusal`)."""
    refusal = task_of(config).fuse_refusal(config.data_stream)
    if refusal is not None:
        raise ValueError(refusal)
    fields = FUSED_KEY_FIELDS[config.task]
    values = config.to_dict()
    values["device"] = str(resolve_device(config.device))
    return tuple((name, values[name]) for name in fields)


def fusable_mismatch(key: tuple[tuple[str, object], ...], config: PonderConfig) -> str | None:
    """Why ``config`` cannot join a group whose key is ``key`` (the first differing field and both
    values), or None if it can."""
    for (name, want), (_, got) in zip(key, fusable_key(config), strict=True):
        if want != got:
            return f"{name} is {got!r} but this fused group's is {want!r}"
    return None


@dataclass(frozen=True)
class ParamLayout:
    """Where each parameter of the plain model lies in a member's row of the ``[K, P]`` tensor:
    the plain model's ``named_parameters()`` order, so row i of Adam's moments is parameter i of
    the plain optimiser's state dict."""

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

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
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


def fused_gru_unroll(
    x: torch.Tensor,  # [K, B, I]
    w_ih: torch.Tensor,  # [K, 3H, I]
    w_hh: torch.Tensor,  # [K, 3H, H]
    b_ih: torch.Tensor,  # [K, 3H]
    b_hh: torch.Tensor,  # [K, 3H]
    n_steps: int,
    active: Sequence[int] | None = None,
) -> torch.Tensor:
    """h_1 .. h_N ``[K, N, B, H]`` of K GRU cells, each applied N times to its own constant input,
    from h_0 = 0: `ponder.gru.gru_unroll`'s equations (PyTorch's gate order r, z, c), batched over K.

        gi = x W_ih^T + b_ih (once);  gh_n = h_n W_hh^T + b_hh
        r = sigma(gi_r + gh_r);  z = sigma(gi_z + gh_z);  c = tanh(gi_c + r * gh_c)
        h_{n+1} = c + z (h_n - c)

    ``active`` (``[N]``, non-increasing): step n is computed for the first ``active[n]`` rows only,
    the others keep their last state. With the rows ordered by max_steps, longest first, a member
    whose own N_k is short stops costing arithmetic after its step N_k (its later states are never
    read: p is 0 there). None: every row at every step (one shape, as ``torch.compile`` wants).
    """
    members, batch, _ = x.shape
    hidden = w_hh.shape[2]
    gi = torch.baddbmm(b_ih[:, None], x, w_ih.transpose(1, 2))  # the same at every step  # [K, B, 3H]
    # r and z read gi + gh through one matmul a step: fold gi and b_hh into its bias
    rz_bias = gi[..., : 2 * hidden] + b_hh[:, None, : 2 * hidden]  # [K, B, 2H]
    gi_c = gi[..., 2 * hidden :]  # [K, B, H]
    w_t = w_hh.transpose(1, 2).contiguous()  # W_hh^T once, not a strided read a step      # [K, H, 3H]
    w_rz, w_c, b_c = w_t[..., : 2 * hidden], w_t[..., 2 * hidden :], b_hh[:, None, 2 * hidden :]
    h = x.new_zeros(members, batch, hidden)  # h_0 of the rows still stepping  # [k, B, H]
    done = h[:0]  # the last states of the rows past their own N_k, in row order  # [K - k, B, H]
    states = []
    for n in range(n_steps):
        k = members if active is None else active[n]  # rows still inside their own max_steps
        if k < h.shape[0]:  # rows k.. end here: keep their last state, slice the rest (once)
            done = torch.cat([h[k:], done])
            h, rz_bias, gi_c, w_rz, w_c, b_c = (t[:k] for t in (h, rz_bias, gi_c, w_rz, w_c, b_c))
        r, z = torch.sigmoid(torch.baddbmm(rz_bias, h, w_rz)).chunk(2, dim=2)  # [k, B, H] each
        c = torch.tanh(torch.addcmul(gi_c, r, torch.baddbmm(b_c, h, w_c)))  # [k, B, H]
        h = torch.lerp(c, h, z)  # c + z (h - c)  # [k, B, H]
        states.append(h if k == members else torch.cat([h, done]))  # [K, B, H]
    return torch.stack(states, dim=1)  # [K, N, B, H]


def fused_forward(
    params: dict[str, torch.Tensor], x: torch.Tensor, n_steps: int, active: Sequence[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(parity logits, lambda logits), each ``[K, N, B]``, of K `ponder.steps.ParityStep`
    PonderNets unrolled N steps on their inputs ``x`` ``[K, B, I]``; ``params`` are
    `ParamLayout.unflatten`'s views (the plain model's names, a leading K); ``active`` as in
    `fused_gru_unroll`."""
    states = fused_gru_unroll(
        x,
        params["step.cell.weight_ih"],
        params["step.cell.weight_hh"],
        params["step.cell.bias_ih"],
        params["step.cell.bias_hh"],
        n_steps,
        active,
    )
    members, _, batch, hidden = states.shape
    # both heads in one matmul: [y_hat, lambda logit] = h [w_out; w_halt]^T + [b_out, b_halt]
    w_heads = torch.cat([params["step.output.weight"], params["step.halt.weight"]], dim=1)  # [K, 2, H]
    b_heads = torch.cat([params["step.output.bias"], params["step.halt.bias"]], dim=1)  # [K, 2]
    flat_states = states.view(members, n_steps * batch, hidden)  # [K, N*B, H]
    heads = torch.baddbmm(b_heads[:, None], flat_states, w_heads.transpose(1, 2))  # [K, N*B, 2]
    heads = heads.view(members, n_steps, batch, 2)
    return heads[..., 0], heads[..., 1]  # [K, N, B] each


def fused_log_halting_distribution(lambda_logits: torch.Tensor, max_steps: torch.Tensor) -> torch.Tensor:
    """log p_n ``[K, N, B]`` from lambda's logits ``[K, N, B]``, member k halting for sure at its
    own step ``max_steps[k]`` (``[K]``, each <= N) and never after (log p = -inf there).

    p_n = lambda_n prod_{j<n} (1 - lambda_j), lambda_{N_k} = 1, p_n = 0 for n > N_k: each member's
    sum_n p_n = 1, and its first N_k entries are `ponder.halting.log_halting_distribution`'s.
    """
    n_steps = lambda_logits.shape[1]
    n = torch.arange(n_steps, device=lambda_logits.device)  # 0-based step index n - 1  # [N]
    last = n[None, :] == (max_steps - 1)[:, None]  # member k's last step  # [K, N]
    after = n[None, :] >= max_steps[:, None]  # past it  # [K, N]
    # log lambda_n = logsigmoid(l_n);  log(1 - lambda_n) = log lambda_n - l_n  # [K, N, B]
    log_lambda = F.logsigmoid(lambda_logits)
    log_not_lambda = log_lambda - lambda_logits
    log_lambda = log_lambda.masked_fill(last[..., None], 0.0)  # lambda_{N_k} = 1
    # log prod_{j<n} (1 - lambda_j): an exclusive cumulative sum over steps  # [K, N, B]
    log_survival = torch.cumsum(log_not_lambda, dim=1) - log_not_lambda
    # p_n = 0 past N_k; masked_fill's gradient there is 0, so nothing flows into those steps
    return (log_lambda + log_survival).masked_fill(after[..., None], -math.inf)


def fused_ponder_loss(
    y_hat: torch.Tensor,
    log_p: torch.Tensor,
    y: torch.Tensor,
    log_prior: torch.Tensor,
    beta: torch.Tensor,
    max_steps: torch.Tensor,
    kl_direction: KLDirection,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(L, L_rec, L_reg), each ``[K]``: every member's `ponder.trainer.ponder_loss`, from parity
    logits and log p ``[K, N, B]``, labels ``[K, B]``, log priors ``[K, N]`` (`padded_log_prior`),
    beta ``[K]`` and max_steps ``[K]`` (`fused_halting_loss` of the binary cross-entropies).
    """
    step_losses = F.binary_cross_entropy_with_logits(
        y_hat, y[:, None, :].expand_as(y_hat), reduction="none"
    )  # L(y, y_hat_n)  # [K, N, B]
    return fused_halting_loss(step_losses, log_p, log_prior, beta, max_steps, kl_direction)


def fused_halting_loss(
    step_losses: torch.Tensor,
    log_p: torch.Tensor,
    log_prior: torch.Tensor,
    beta: torch.Tensor,
    max_steps: torch.Tensor,
    kl_direction: KLDirection,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(L, L_rec, L_reg), each ``[K]``, from each step's loss L(y, y_hat_n) and log p ``[K, N, B]``,
    log priors ``[K, N]``, beta ``[K]`` and max_steps ``[K]``: what any task's fused loss shares. A
    member's loss reads only its own rows, so a NaN in one member reaches no other member's loss or
    gradient.

        L_rec = mean_b sum_{n <= N_k} p_n L(y, y_hat_n);   L = L_rec + beta L_reg
        L_reg = KL(p || p_G) = sum_{n <= N_k} p_n (log p_n - log p_G,n)          (forward)
                KL(p_G || p) = sum_{n <= N_k} p_G,n (log p_G,n - log p_n)        (reverse)
    """
    n_steps = log_p.shape[1]
    n = torch.arange(n_steps, device=log_p.device)  # [N]
    valid = (n[None, :] < max_steps[:, None])[..., None]  # steps <= N_k  # [K, N, 1]
    # log p with the -inf past N_k made 0: no 0 * -inf below; p itself is exactly 0 there
    log_p_kept = log_p.masked_fill(~valid, 0.0)  # [K, N, B]
    p = log_p.exp()  # [K, N, B]
    rec = (p * step_losses).sum(dim=1).mean(dim=1)  # [K]
    log_q = log_prior[..., None]  # [K, N, 1], broadcast over the batch
    if kl_direction == "forward":
        kl = (p * (log_p_kept - log_q)).sum(dim=1)  # [K, B]
    elif kl_direction == "reverse":
        terms = log_q.exp() * (log_q - log_p_kept)  # [K, N, B]
        kl = torch.where(valid, terms, torch.zeros_like(terms)).sum(dim=1)  # [K, B]
    else:
        raise ValueError(f"direction must be forward or reverse, got {kl_direction!r}")
    reg = kl.mean(dim=1)  # [K]
    return rec + beta * reg, rec, reg


def fused_forward_loss(
    layout: ParamLayout,
    flat: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    log_prior: torch.Tensor,
    beta: torch.Tensor,
    max_steps: torch.Tensor,
    n_steps: int,
    kl_direction: KLDirection,
    active: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training forward pass and loss of the rows ``flat`` ``[K, P]`` on ``x`` ``[K, B, I]``,
    ``y`` ``[K, B]``, unrolled ``n_steps`` = N: (L, L_rec, L_reg), each ``[K]``. What
    `ponder.fused_trainer.FusedTrainer` runs (and compiles, when asked); ``active`` as in
    `fused_gru_unroll`."""
    y_hat, lambda_logits = fused_forward(layout.unflatten(flat), x, n_steps, active)  # [K, N, B] each
    log_p = fused_log_halting_distribution(lambda_logits, max_steps)  # [K, N, B]
    return fused_ponder_loss(y_hat, log_p, y, log_prior, beta, max_steps, kl_direction)


def fused_stream_forward_loss(
    layout: ParamLayout,
    flat: torch.Tensor,
    base: torch.Tensor,
    k0: torch.Tensor,
    iterations: torch.Tensor,
    low: torch.Tensor,
    high: torch.Tensor,
    batch_size: int,
    log_prior: torch.Tensor,
    beta: torch.Tensor,
    max_steps: torch.Tensor,
    n_steps: int,
    kl_direction: KLDirection,
    active: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fused_forward_loss` on each row's own counter-stream batch at its own iteration: the
    batches of all K rows drawn by one set of ops (`ponder.data.parity.stream_batches`), inside
    what is compiled, so a compiled group's data, forward pass and loss are one graph.

    ``base`` ``[K, W]`` and ``k0`` ``[K]``: each row's `ponder.streams.stream_base` and seed key;
    ``iterations`` ``[K]``: the iteration each row draws for; ``low``, ``high`` ``[K]``: its
    non-zero range."""
    n_elems = layout.shapes[layout.names.index("step.cell.weight_ih")][1]  # I, the inputs
    words = stream_words(base, iteration_keys(k0, iterations))  # [K, W]
    x, y = stream_batches(words, batch_size, n_elems, low, high)  # [K, B, I], [K, B]
    return fused_forward_loss(layout, flat, x, y, log_prior, beta, max_steps, n_steps, kl_direction, active)


def padded_log_prior(log_prior: torch.Tensor, n_steps: int) -> torch.Tensor:
    """A member's log prior ``[N_k]`` (`ponder.halting.log_geometric_prior`) padded with zeros to
    ``[N]``: the padding is never read (`fused_ponder_loss` masks steps past N_k)."""
    return F.pad(log_prior, (0, n_steps - log_prior.shape[0]))


def _parity_rows(trainers: Sequence[Trainer | None], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Each row's non-zero range ``(low [R], high [R])`` (padding rows: 1, 1)."""
    ranges = [
        t.config.nonzero_range if t is not None and isinstance(t.config, ParityConfig) else (1, 1)
        for t in trainers
    ]
    return torch.tensor([lo for lo, _ in ranges], device=device), torch.tensor(
        [hi for _, hi in ranges], device=device
    )


def _parity_width(config: PonderConfig, n_steps: int) -> int:
    assert isinstance(config, ParityConfig)
    return stream_words_per_batch(config.batch_size, config.n_elems)


PARITY = FusedTask(
    name="parity",
    stream_loss=fused_stream_forward_loss,
    stream_width=_parity_width,
    row_data=_parity_rows,
    forward_loss=fused_forward_loss,
    ordered=True,
)
"""Parity's batched step: the GRU over rows, each row's stream batch drawn inside the loss."""
