"""Step functions: the parity GRU step and the MNIST CNN + MLP step.

Each has a fused twin that trains K runs as one model (`ponder.fused.parity.FusedParityStep`,
`ponder.fused.mnist.FusedMnistStep`), built from the plain step's own layers: a layer added here
is either followed by its twin (a layer of ``MnistStep.cnn`` or ``MnistStep.mix`` that
`ponder.fused.layers` batches) or stops a fused group from being built, naming its parameter.
"""

from __future__ import annotations

import torch
from torch import nn

from ponder.gru import gru_unroll, gru_unroll_plain
from ponder.model import StepFunction

__all__ = ["MnistStep", "ParityStep"]


class ParityStep(StepFunction):
    """A GRU cell fed the whole parity vector at every step; linear heads read h.

    h_{n+1} = GRU(x, h_n);  y_hat_n = w_y . h_{n+1};  lambda_n = sigmoid(w_l . h_{n+1}).

    The training unroll runs `ponder.gru.gru_unroll` on the cell's weights: the same numbers
    as N ``GRUCell`` calls, with a hand-written backward pass that is several times cheaper.
    Under ``torch.compile`` it runs `ponder.gru.gru_unroll_plain` instead, the same equations
    in plain ops, which the compiler can fuse forward and backward (the autograd Function is
    opaque to it).
    """

    def __init__(self, n_elems: int, n_hidden: int) -> None:
        super().__init__()
        self.n_hidden = n_hidden
        self.cell = nn.GRUCell(n_elems, n_hidden)
        self.output = nn.Linear(n_hidden, 1)  # parity logit
        self.halt = nn.Linear(n_hidden, 1)  # lambda logit

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The parity vector itself, ``[B, n_elems]``."""
        return x

    def initial_state(self, ctx: torch.Tensor) -> torch.Tensor:
        """h_0 = 0, ``[B, H]``."""
        return ctx.new_zeros(ctx.shape[0], self.n_hidden)

    def transition(self, ctx: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """h_{n+1} = GRU(x, h_n), ``[B, H]``."""
        h_next: torch.Tensor = self.cell(ctx, h)
        return h_next

    def unroll(
        self, ctx: torch.Tensor, h: torch.Tensor, n_steps: int, masks: torch.Tensor | None = None
    ) -> torch.Tensor:
        """N GRU steps on the same input, ``[N, B, H]``, through the fused `gru_unroll` (no dropout:
        ``masks`` is never given)."""
        c = self.cell
        unroll = gru_unroll_plain if torch.compiler.is_compiling() else gru_unroll
        return unroll(ctx, h, c.weight_ih, c.weight_hh, c.bias_ih, c.bias_hh, n_steps)

    def heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(parity logit, lambda logit), each ``h.shape[:-1]``."""
        return self.output(h).squeeze(-1), self.halt(h).squeeze(-1)


class MnistStep(StepFunction):
    """A small CNN embeds the image once per forward; an MLP mixes embedding and h at each step.

    e = CNN(x);  h_{n+1} = MLP([e, h_n]);  logits_n = W_y h_{n+1};  lambda_n = sigmoid(w_l . h_{n+1}).

    The MLP's dropout: ``nn.Dropout`` (torch's global generator) in training mode, the stream of
    runs made before counter streams; or, given ``masks`` (`unroll`), each step's mask from the
    run's counter stream (`ponder.data.mnist_stream`), what a fused member draws too.
    """

    def __init__(
        self, n_hidden: int = 64, n_embed: int = 64, n_classes: int = 10, dropout: float = 0.2
    ) -> None:
        super().__init__()
        self.n_hidden = n_hidden
        self.cnn = nn.Sequential(  # [B, 1, 28, 28] -> [B, n_embed]
            nn.Conv2d(1, 16, kernel_size=5),  # [B, 16, 24, 24]
            nn.MaxPool2d(2),  # [B, 16, 12, 12]
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=5),  # [B, 32, 8, 8]
            nn.MaxPool2d(2),  # [B, 32, 4, 4]
            nn.ReLU(),
            nn.Flatten(),  # [B, 512]
            nn.Linear(32 * 4 * 4, n_embed),
            nn.ReLU(),
        )
        self.mix = nn.Sequential(  # [B, n_embed + H] -> [B, H]
            nn.Linear(n_embed + n_hidden, n_hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(n_hidden, n_hidden),
        )
        self.output = nn.Linear(n_hidden, n_classes)
        self.halt = nn.Linear(n_hidden, 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The CNN embedding, once per forward, ``[B, n_embed]``."""
        embedding: torch.Tensor = self.cnn(x)
        return embedding

    def initial_state(self, ctx: torch.Tensor) -> torch.Tensor:
        """h_0 = 0, ``[B, H]``."""
        return ctx.new_zeros(ctx.shape[0], self.n_hidden)

    def transition(
        self, ctx: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """h_{n+1} = tanh(MLP([e, h_n])), ``[B, H]``; tanh keeps h bounded over many steps. ``mask``
        ``[B, H]`` (0, or the kept units' scale) replaces the MLP's dropout."""
        z = torch.cat([ctx, h], dim=-1)  # [B, n_embed + H]
        if mask is None:
            return torch.tanh(self.mix(z))
        for layer in self.mix:  # ReLU(W_1 [e, h] + b_1), dropped by the mask, then W_2 . + b_2
            z = z * mask if isinstance(layer, nn.Dropout) else layer(z)
        return torch.tanh(z)

    def unroll(
        self, ctx: torch.Tensor, h: torch.Tensor, n_steps: int, masks: torch.Tensor | None = None
    ) -> torch.Tensor:
        """h_1 .. h_N ``[N, B, H]``; step n's dropout from ``masks[n]`` (``[N, B, H]``) if given."""
        states = []
        for n in range(n_steps):
            h = self.transition(ctx, h, None if masks is None else masks[n])
            states.append(h)
        return torch.stack(states)

    def heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(class logits ``[..., 10]``, lambda logit ``[...]``)."""
        return self.output(h), self.halt(h).squeeze(-1)
