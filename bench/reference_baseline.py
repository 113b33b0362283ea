"""The reference formulation of PonderNet parity training, kept only as a benchmark baseline.

Written after the reference implementations (sources in docs/RESULTS.md): labml.ai's annotated
PonderNet (https://nn.labml.ai/adaptive_computation/ponder_net/index.html) and the parity code
of the video walk-through that follows it (``github_adventures/pondernet`` in
https://github.com/jankrepl/mildlyoverfitted), both after the paper (Banino, Balaguer, Blundell,
"PonderNet: Learning to Ponder", arXiv:2107.05407). Their path: parity samples built one at a
time by a Dataset and collated by a DataLoader, the halting distribution as a running product
of probabilities, a Bernoulli halting draw inside the training unroll, a Python loop over steps
in the reconstruction loss, and ``KLDivLoss(p.log(), p_g)`` against a truncated geometric
prior. Do not use it for anything else.

A library, not a benchmark: `bench/iteration_speed.py` and `bench/time_to_accuracy.py` import
`ReferenceTrainer` as their baseline; it runs nothing by itself.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class ParityDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """One sample per ``__getitem__``, drawn afresh: the reference data path."""

    def __init__(self, n_samples: int, n_elems: int) -> None:
        self.n_samples, self.n_elems = n_samples, n_elems

    def __len__(self) -> int:
        return self.n_samples

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.zeros((self.n_elems,))
        n_non_zero = int(torch.randint(1, self.n_elems + 1, (1,)).item())
        x[:n_non_zero] = torch.randint(0, 2, (n_non_zero,)) * 2 - 1
        x = x[torch.randperm(self.n_elems)]
        y = (x == 1.0).sum() % 2
        return x, y


class ParityPonderGRU(nn.Module):
    def __init__(self, n_elems: int, n_hidden: int, max_steps: int) -> None:
        super().__init__()
        self.max_steps, self.n_hidden = max_steps, n_hidden
        self.cell = nn.GRUCell(n_elems, n_hidden)
        self.output_layer = nn.Linear(n_hidden, 1)
        self.lambda_layer = nn.Linear(n_hidden, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch_size = x.shape[0]
        h = x.new_zeros(batch_size, self.n_hidden)
        h = self.cell(x, h)
        un_halted_prob = x.new_ones(batch_size)
        y_list, p_list = [], []
        halting_step = torch.zeros(batch_size, dtype=torch.long, device=x.device)
        for n in range(1, self.max_steps + 1):
            if n == self.max_steps:
                lambda_n = x.new_ones(batch_size)
            else:
                lambda_n = torch.sigmoid(self.lambda_layer(h))[:, 0]
            y_list.append(self.output_layer(h)[:, 0])
            p_list.append(un_halted_prob * lambda_n)
            halting_step = torch.maximum(
                n * (halting_step == 0) * torch.bernoulli(lambda_n).to(torch.long), halting_step
            )
            un_halted_prob = un_halted_prob * (1 - lambda_n)
            h = self.cell(x, h)
        return torch.stack(y_list), torch.stack(p_list), halting_step


class ReconstructionLoss(nn.Module):
    def __init__(self, loss_func: nn.Module) -> None:
        super().__init__()
        self.loss_func = loss_func

    def forward(self, p: torch.Tensor, y_pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        total = p.new_tensor(0.0)
        for n in range(p.shape[0]):  # a Python loop over steps
            total = total + (p[n] * self.loss_func(y_pred[n], y)).mean()
        return total


class RegularizationLoss(nn.Module):
    def __init__(self, lambda_p: float, max_steps: int) -> None:
        super().__init__()
        p_g = torch.zeros((max_steps,))
        not_halted = 1.0
        for k in range(max_steps):
            p_g[k] = not_halted * lambda_p
            not_halted = not_halted * (1 - lambda_p)
        self.register_buffer("p_g", p_g)
        self.kl_div = nn.KLDivLoss(reduction="batchmean")

    def forward(self, p: torch.Tensor) -> torch.Tensor:
        p = p.transpose(0, 1)
        p_g = self.p_g[None, : p.shape[1]].expand_as(p)
        return self.kl_div(p.log(), p_g)  # KL(p_g || p), and log(0) = -inf when p underflows


class ReferenceTrainer:
    """One training iteration per `step`, as the reference training script does it."""

    def __init__(
        self,
        n_elems: int,
        n_hidden: int,
        max_steps: int,
        batch_size: int,
        lambda_p: float = 0.2,
        beta: float = 0.01,
        lr: float = 3e-4,
        device: str = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.model = ParityPonderGRU(n_elems, n_hidden, max_steps).to(self.device)
        self.loss_rec = ReconstructionLoss(nn.BCEWithLogitsLoss(reduction="none"))
        self.loss_reg = RegularizationLoss(lambda_p, max_steps).to(self.device)
        self.beta = beta
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        loader = DataLoader(ParityDataset(batch_size * 10**7, n_elems), batch_size=batch_size)
        self.batches = iter(loader)

    def step(self) -> float:
        x, y = next(self.batches)
        x, y = x.to(self.device), y.to(self.device)  # batches are built on the CPU, then moved
        y_pred, p, _ = self.model(x)
        loss = self.loss_rec(p, y_pred, y.float()) + self.beta * self.loss_reg(p)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())
