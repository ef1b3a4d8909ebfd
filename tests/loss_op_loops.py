"""Loops for ``test_loss_ops.py``: a student distilled from a frozen teacher under DDP (Hinton's loss:
cross entropy plus a temperature-softened KL), each rank on its block of one seeded global batch, and the
one-device reference. ``gathered`` computes the same loss over the global batch on every rank (the ranks'
outputs gathered with autograd, the rank's own rows' targets sliced, the loss times the world size as DDP
averages): another layout's calls for the same loss. Written as users write them."""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

DIM, OUT, BATCH, T, ALPHA = 8, 5, 16, 2.0, 0.5


def _models():
    torch.manual_seed(0)
    student = nn.Sequential(nn.Linear(DIM, 16), nn.Tanh(), nn.Linear(16, OUT))
    teacher = nn.Sequential(nn.Linear(DIM, 16), nn.Tanh(), nn.Linear(16, OUT)).requires_grad_(False)
    return student, teacher


def batch(step: int):
    g = torch.Generator().manual_seed(10 + step)
    return torch.randn(BATCH, DIM, generator=g), torch.randint(0, OUT, (BATCH,), generator=g)


def kd_loss(s, t, y, bug: str = ""):
    ce = F.cross_entropy(s, y)
    p_t = F.softmax(t if bug == "teacher_not_softened" else t / T, dim=1)
    kl = F.kl_div(F.log_softmax(s / T, dim=1), p_t, reduction="mean" if bug == "kl_mean" else "batchmean")
    return (1 - ALPHA) * ce + ALPHA * T * T * kl


def distilled(world_size: int, bug: str = "", steps: int = 3, reference: bool = False) -> None:
    student, teacher = _models()
    rank = 0 if reference else tdist.get_rank()
    model = student if reference else nn.parallel.DistributedDataParallel(student)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rows = BATCH if reference else BATCH // world_size
    for step in range(steps):
        x, y = batch(step)
        x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        s = model(x)
        with torch.no_grad():
            t = teacher(x)  # after the student's forward: the teacher's calls are its model's, not the loss's
        later = bug == "kl_mean_later" and step >= 1  # a code path taken from the second step on
        loss = kd_loss(s, t, y, "" if reference else "kl_mean" if later else bug)
        loss.backward()
        opt.step()
        opt.zero_grad()


def gathered(world_size: int, bug: str = "", steps: int = 3) -> None:
    """The global batch's loss on every rank: outputs gathered with autograd; ``targets_shifted`` reads
    the targets of another rank's rows, ``kl_mean`` as ``distilled``'s."""
    from torch.distributed.nn.functional import all_gather

    student, teacher = _models()
    model = nn.parallel.DistributedDataParallel(student)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rank, rows = tdist.get_rank(), BATCH // world_size
    for step in range(steps):
        x, y = batch(step)
        mine = x[rank * rows:(rank + 1) * rows]
        with torch.no_grad():
            t = teacher(x)
        s = torch.cat(all_gather(model(mine)))
        if bug == "targets_shifted":
            y = torch.roll(y, rows)
        loss = kd_loss(s, t, y, bug)  # all_gather's backward sums every rank's terms: DDP's mean is the global one
        loss.backward()
        opt.step()
        opt.zero_grad()


def reference(world_size: int, bug: str = "", steps: int = 3) -> None:
    distilled(world_size, bug, steps, reference=True)


class TwoHeads(nn.Module):
    """A main and an auxiliary head (deep supervision): the loss weighs both outputs."""

    def __init__(self):
        super().__init__()
        self.body, self.main, self.aux = nn.Linear(DIM, 16), nn.Linear(16, OUT), nn.Linear(16, OUT)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        return self.main(h), self.aux(h)


def two_heads(world_size: int, bug: str = "", steps: int = 3, reference: bool = False) -> None:
    """``aux_weight``: the ranks weigh the auxiliary head's loss otherwise (the main output's gradient is the
    reference's). ``labels_in_eval``: a correct loop that labels each batch with the DDP-wrapped model's inner
    module in ``eval()`` under ``no_grad`` (the wrapper's own flag stays on) and then trains ``aux_weight``'s
    way."""
    torch.manual_seed(0)
    net = TwoHeads()
    rank = 0 if reference else tdist.get_rank()
    model = net if reference else nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rows = BATCH if reference else BATCH // world_size
    weight = 0.4 if bug and not reference else 0.3
    for step in range(steps):
        x, y = batch(step)
        x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        if bug == "labels_in_eval" or reference:
            net.eval()
            with torch.no_grad():
                y = (model(x)[0].argmax(1) + y) % OUT  # labels mixed with the model's own guesses
            net.train()
        main, aux = model(x)
        loss = F.cross_entropy(main, y) + weight * F.cross_entropy(aux, y)
        loss.backward()
        opt.step()
        opt.zero_grad()


def two_heads_reference(world_size: int, bug: str = "", steps: int = 3) -> None:
    two_heads(world_size, bug, steps, reference=True)
