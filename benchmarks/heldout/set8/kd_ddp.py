"""Knowledge distillation under DDP: a frozen teacher (an MLP with BatchNorm, in ``eval()``, under
``no_grad``, loaded from a saved state dict on every rank) and a small student wrapped in DDP; the loss
``alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T))`` (``reduction="batchmean"``) plus
``(1 - alpha) * CE(student, labels)``; SGD with momentum; a ``DistributedSampler`` with ``set_epoch``.
Variant ``cached``: offline distillation, the teacher's logits computed once for the whole dataset and
looked up by each sample's dataset index.

The one-device reference takes the ranks' batches of an iteration together (rank order, the samplers
rebuilt with explicit ``rank=``): batchmean over the global batch is the mean of the ranks' batchmeans.

Follows peterliht/knowledge-distillation-pytorch ``model/net.py`` (``loss_fn_kd``: ``nn.KLDivLoss()(
F.log_softmax(outputs/T, dim=1), F.softmax(teacher_outputs/T, dim=1)) * (alpha * T * T) +
F.cross_entropy(outputs, labels) * (1. - alpha)``; ``fetch_teacher_outputs`` for the cached logits),
wonbeomjang/Knowledge-Distilling-PyTorch ``loss.py`` (``reduction='batchmean'``) and the Hinton et al.
T^2 scaling; pytorch/examples ``imagenet/main.py`` for the DDP loop and ``set_epoch``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .common import gen, rank

DIM, C, N, GB, EPOCHS, SEED = 10, 5, 24, 8, 2, 17
TEMP, ALPHA, LR, MOMENTUM = 4.0, 0.7, 0.1, 0.9
STEPS = 6   # EPOCHS * N / GB
CORRECT = {"default": (2, 4), "cached": (2,)}
BUGS = {
    "no_t_squared": "the KL term is not multiplied by T^2",
    "kl_mean_reduction": "KLDivLoss with reduction='mean' (divides by batch * classes) instead of 'batchmean'",
    "teacher_no_temperature": "the teacher's probabilities are softmax(teacher) without dividing by T",
    "teacher_train_mode": "the teacher is left in train mode (BatchNorm uses each rank's batch statistics)",
    "teacher_loaded_rank0_only": "the teacher's state dict is loaded only on rank 0; the other ranks keep a random teacher",
    "alpha_swapped": "alpha weights the hard-label CE and (1 - alpha) the KL term",
    "cached_logits_local_index": "offline KD: cached teacher logits looked up by the sample's position in the local batch, not its dataset index",
}


def teacher_net() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, C))


def teacher_state() -> dict:
    """The 'pretrained' teacher: a seeded init with non-trivial BatchNorm running statistics."""
    torch.manual_seed(SEED + 1)
    t = teacher_net()
    t[1].running_mean.normal_(0, 0.5)
    t[1].running_var.uniform_(0.5, 2.0)
    return t.state_dict()


def student_net() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 16), nn.ReLU(), nn.Linear(16, C))


def dataset() -> TensorDataset:
    g = gen(SEED)
    x = torch.randn(N, DIM, generator=g)
    y = (x[:, :C] + 0.5 * torch.randn(N, C, generator=g)).argmax(1)
    return TensorDataset(x, y, torch.arange(N))


def kd_loss(out, labels, t_out, bug=None) -> torch.Tensor:
    t_probs = F.softmax(t_out if bug == "teacher_no_temperature" else t_out / TEMP, dim=1)
    kl = F.kl_div(F.log_softmax(out / TEMP, dim=1), t_probs,
                  reduction="mean" if bug == "kl_mean_reduction" else "batchmean")
    a = 1 - ALPHA if bug == "alpha_swapped" else ALPHA
    t2 = 1.0 if bug == "no_t_squared" else TEMP * TEMP
    return a * t2 * kl + (1 - a) * F.cross_entropy(out, labels)


def build(load_teacher: bool = True):
    teacher = teacher_net()
    if load_teacher:
        teacher.load_state_dict(teacher_state())
    torch.manual_seed(SEED)
    student = student_net()
    return teacher, student, torch.optim.SGD(student.parameters(), lr=LR, momentum=MOMENTUM)


def cached_logits(teacher) -> torch.Tensor:
    teacher.eval()
    with torch.no_grad():
        return teacher(dataset().tensors[0])


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its sampler's batches, the student under DDP, the teacher's logits for the same samples."""
    r, w = rank(), world_size
    torch.manual_seed(SEED + 100 + r)  # the teacher's random init where it is not loaded
    teacher, student, opt = build(bug != "teacher_loaded_rank0_only" or r == 0)
    ddp = DDP(student)
    cached = variant == "cached" or bug == "cached_logits_local_index"
    table = cached_logits(teacher) if cached else None
    teacher.train(bug == "teacher_train_mode")
    ds = dataset()
    sampler = DistributedSampler(ds, num_replicas=w, rank=r, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=GB // w, sampler=sampler)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y, idx in loader:
            out = ddp(x)
            if cached:
                t_out = table[torch.arange(len(idx)) if bug == "cached_logits_local_index" else idx]
            else:
                with torch.no_grad():
                    t_out = teacher(x)
            loss = kd_loss(out, y, t_out, bug)
            opt.zero_grad()
            loss.backward()
            opt.step()


def reference(world_size: int) -> None:
    """One device: per iteration the ranks' batches in rank order, the teacher in eval mode."""
    w = world_size
    teacher, student, opt = build()
    teacher.eval()
    ds = dataset()
    samplers = [DistributedSampler(ds, num_replicas=w, rank=r, shuffle=True, seed=0) for r in range(w)]
    lb = GB // w
    for epoch in range(EPOCHS):
        order = []
        for s in samplers:
            s.set_epoch(epoch)
            order.append(list(s))
        for i in range(len(order[0]) // lb):
            x, y, _ = ds[[j for r in range(w) for j in order[r][i * lb:(i + 1) * lb]]]
            out = student(x)
            with torch.no_grad():
                t_out = teacher(x)
            loss = kd_loss(out, y, t_out)
            opt.zero_grad()
            loss.backward()
            opt.step()
