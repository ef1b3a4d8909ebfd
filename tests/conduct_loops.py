"""DDP loops with a validation pass inside the training loop (as pytorch/examples' ImageNet loop
does): every 2 steps a forward over held-out rows in ``eval()`` under ``torch.no_grad()``, then
``train()`` again. The model has dropout whose masks come from one generator every process seeds
alike (drawn for the global batch, each rank keeping its rows), so a correct loop agrees with the
one-device loop. ``bug=`` breaks the validation the ways users do (``skip_step``: rank 1 skips one optimizer step);
``rank0_validates`` is correct (validation only on rank 0, its result not fed back)."""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

D, H, C, ROWS, STEPS, EVERY = 6, 12, 3, 4, 5, 2


class Dropout(nn.Module):
    def __init__(self, p: float = 0.3) -> None:
        super().__init__()
        self.p, self.gen = p, torch.Generator().manual_seed(5)

    def forward(self, x):
        if not self.training:
            return x
        w = tdist.get_world_size() if tdist.is_initialized() else 1
        r = tdist.get_rank() if tdist.is_initialized() else 0
        keep = torch.rand(x.shape[0] * w, *x.shape[1:], generator=self.gen).chunk(w)[r] >= self.p
        return x * keep / (1 - self.p)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), Dropout(), nn.Linear(H, C))


def _rows(step, n):
    g = torch.Generator().manual_seed(40 + step)
    return torch.randn(n, D, generator=g), torch.randint(0, C, (n,), generator=g)


def _validate(model, bug):
    if bug != "no_eval":
        model.eval()
    x, y = _rows(1000, ROWS)
    if bug == "val_backward":
        F.cross_entropy(model(x), y).backward()
    else:
        with torch.no_grad():
            F.cross_entropy(model(x), y)
    if bug != "left_in_eval":
        model.train()


def _fit(model, rows_of, bug=None, validates=True):
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    for step in range(STEPS):
        x, y = rows_of(step)
        F.cross_entropy(model(x), y).backward()
        if not (bug == "skip_step" and tdist.get_rank() == 1 and step == 2):
            opt.step()
        opt.zero_grad()
        if (step + 1) % EVERY == 0 and validates:
            _validate(model, bug)


def train(world_size, bug=None):
    from torch.nn.parallel import DistributedDataParallel as DDP

    r, w = tdist.get_rank(), tdist.get_world_size()
    model = DDP(_model())
    validates = bug != "rank0_validates" or r == 0
    _fit(model, lambda s: tuple(t.chunk(w)[r] for t in _rows(s, ROWS * w)), bug, validates)


def reference(world_size):
    _fit(_model(), lambda s: _rows(s, ROWS * world_size))
