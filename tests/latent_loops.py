"""A tiny VAE trained by a hand-written data-parallel loop as research code writes one: the model is
called with its rows and the reparameterisation noise (``model(x, eps)``), the noise drawn for the
global batch and sliced per rank, and the loss a reconstruction term plus a KL term on the encoder's
output whose weight warms up by optimizer step. For the evidence on the model's other arguments and on
a loss term that reaches part of the model (``tests/test_loss_terms.py``); module level, so the loops
travel by name."""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

X, Z, ROWS, STEPS, WARM = 10, 3, 8, 3, 4


class VAE(nn.Module):
    """``queue``: a queue of past codes (MoCo's) read by the loss and refreshed in the forward with the
    batch's codes: every rank's, gathered (``local``: the rank's own only)."""

    def __init__(self, queue: bool = False, local: bool = False) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(X, 16), nn.Tanh(), nn.Linear(16, 2 * Z))
        self.dec = nn.Sequential(nn.Linear(Z, 16), nn.Tanh(), nn.Linear(16, X))
        self.register_buffer("queue", torch.ones(2 * ROWS, Z) if queue else torch.zeros(0, Z))
        self.local = local

    def forward(self, x: torch.Tensor, eps: torch.Tensor):
        mu, logvar = self.enc(x).chunk(2, dim=1)
        near = (mu @ self.queue.T).mean() if len(self.queue) else mu.new_zeros(())  # the codes against the queue
        out = (self.dec(mu + eps * torch.exp(0.5 * logvar)), mu, logvar, near)
        if len(self.queue):
            keys = mu.detach()
            if tdist.is_initialized() and not self.local:
                parts = [torch.empty_like(keys) for _ in range(tdist.get_world_size())]
                tdist.all_gather(parts, keys)
                keys = torch.cat(parts)
            self.queue = torch.cat([self.queue[len(keys):], keys])
        return out


def batch(step: int):
    """The global batch's rows and its noise, one draw for the whole batch."""
    g = torch.Generator().manual_seed(300 + step)
    return torch.rand(ROWS, X, generator=g), torch.randn(ROWS, Z, generator=g)


def loss_of(out, x, step: int, rows: int, kl_weight: float = 1.0) -> torch.Tensor:
    """Reconstruction plus beta x KL, both summed over the rows and divided by ``rows``; beta warms up
    over WARM optimizer steps (x ``kl_weight``)."""
    recon, mu, logvar, near = out
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    beta = min(1.0, (step + 1) / WARM) * kl_weight
    return (F.mse_loss(recon, x, reduction="sum") + beta * kld) / rows + near


def _model(bug: str = "") -> VAE:
    torch.manual_seed(0)
    return VAE(queue=bug.startswith("queue"), local=bug == "queue_local")


def train(world_size: int, bug: str = "") -> None:
    rank = tdist.get_rank()
    model = _model(bug)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    n = ROWS // world_size
    for step in range(STEPS):
        x, eps = batch(step)
        sl = slice(rank * n, (rank + 1) * n)
        if bug == "eps_rank_seed":  # noise drawn per rank, with a seed of the rank's own
            mine = torch.randn(n, Z, generator=torch.Generator().manual_seed(1000 * rank + step))
        else:
            mine = eps[:n] if bug == "eps_first_block" else eps[sl]  # every rank the first block of the draw
        out = model(x[sl], mine)
        kl_weight = world_size if bug == "kl_weight_global" else 1.0  # a KL weight from the global batch size
        loss = loss_of(out, x[sl], step, n, kl_weight)
        if bug.startswith("two_calls"):  # a second term over another call's outputs (half-scale rows)
            loss = loss + (1.0 if bug == "two_calls_weighted" else 0.5) * loss_of(model(x[sl] / 2, mine), x[sl] / 2, step, n)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            tdist.all_reduce(p.grad)
            p.grad /= world_size
            if bug == "perturbed":  # an ascent step (SAM's) taken and never undone before the update
                p.data.add_(0.05 * p.grad.sign())
        opt.step()


def reference(world_size: int, bug: str = "") -> None:
    model = _model(bug)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, eps = batch(step)
        loss = loss_of(model(x, eps), x, step, ROWS)
        if bug.startswith("two_calls"):
            loss = loss + 0.5 * loss_of(model(x / 2, eps), x / 2, step, ROWS)
        opt.zero_grad()
        loss.backward()
        opt.step()
