"""Tiny trainers with graded bugs, for ``benchmarks/parity/parity_power.py``.

Four families, each a correct distributed loop (run in every rank, process group up, gloo CPU) and a
one-device reference that trains the same global batch, both self-seeded by ``seed`` (model init and
data), both taking ``steps`` optimizer steps:

- ``ddp``: a small causal LM (2 blocks, d=32, attention projections with biases as minGPT's; the
  environment variable ``POWER_ATTN_BIAS=0`` drops them) under DDP, DistributedSampler, AdamW (lr 3e-3, weight
  decay 0.01), a warm-up + cosine ``LambdaLR``, ``clip_grad_norm_(1.0)``; ``checkpoint=True`` makes it
  a trainer for ``dist.assert_resumes``: model, optimizer and scheduler saved every ``save_every``
  steps in ``pytest_mgpu.checkpoint_dir()``, resumed from there when a checkpoint exists;
- ``fsdp2``: the same LM, ``fully_shard`` per block and root on a 1-D CPU mesh, AdamW;
- ``tp``: the same LM, attention and MLP projections ``ColwiseParallel`` / ``RowwiseParallel``
  (``parallelize_module``), every rank fed the same batch, AdamW;
- ``accum``: DDP with k=4 micro-batches per step (``no_sync`` on the first k-1, loss / k), clipping at
  1.0, AdamW.

``bug`` (distributed side only; the reference never takes it) is ``None`` or ``(kind, eps, at)``:

- ``"lr"``: every rank's learning rate x (1 + eps) at steps >= ``at`` (0-based);
- ``"grad"``: the last rank's gradients x (1 + eps), after they are synchronised (and clipped),
  just before ``optimizer.step()``, at steps >= ``at``;
- ``"moment"``: Adam's first moment (``exp_avg``) zeroed for a fraction eps of its elements (at least
  one) just before the optimizer step ``at``, once;
- ``"weight_decay"``: every rank's weight decay x (1 + eps) at steps >= ``at``;
- ``"momentum"``: every rank's Adam beta1 (its momentum, the value ``OneCycleLR`` cycles as momentum)
  x (1 + eps) at steps >= ``at``;
- ``"betas"``: every rank's Adam beta2 x (1 + eps), held below 1 (0.999 x 1.001 would be 1), at steps >= ``at``;
- ``"resume_lr"`` (``ddp`` with ``checkpoint=True``): the learning rate x (1 + eps) at every step of
  a run that resumed from a checkpoint;
- ``"no_scheduler"`` (idem): the scheduler's state is not loaded on resume.
"""
from __future__ import annotations

import contextlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

VOCAB, SEQ, DIM, HEADS = 16, 8, 32, 4
GLOBAL = 8      # rows per micro-batch, all ranks together
ROWS = 128      # rows of the data set (epochs go on with set_epoch)
LR, WD, CLIP, ACCUM = 3e-3, 0.01, 1.0, 4


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        bias = os.environ.get("POWER_ATTN_BIAS", "1") != "0"  # minGPT's biases; the key's has no true gradient
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=bias) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        hd = DIM // HEADS  # heads taken from the local width: a tensor-parallel rank holds a share of them
        q, k, v = (f(x).view(b, t, -1, hd).transpose(1, 2) for f in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(DIM), Attention(), nn.LayerNorm(DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        h = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))


def dataset(seed):
    """ROWS token rows of a noisy counting language (next = token + stride, 20% random), seeded."""
    g = torch.Generator().manual_seed(10_000 + seed)
    start = torch.randint(0, VOCAB, (ROWS, 1), generator=g)
    stride = torch.randint(1, 4, (ROWS, 1), generator=g)
    rows = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    noise = torch.rand(rows.shape, generator=g) < 0.2
    rows = torch.where(noise, torch.randint(0, VOCAB, rows.shape, generator=g), rows)
    return TensorDataset(rows)


def batches(seed, replicas, rank, rows, skip=0):
    """Endless micro-batches (inputs, next tokens) of ``rows`` rows: a DistributedSampler over
    ``replicas`` (1: the reference, which takes the rows of all ranks), epochs with ``set_epoch``;
    the first ``skip`` micro-batches are passed over (a resume)."""
    data = dataset(seed)
    sampler = DistributedSampler(data, num_replicas=replicas, rank=rank, seed=seed)
    loader = DataLoader(data, batch_size=rows, sampler=sampler)
    per_epoch, epoch = len(loader), skip // len(loader)
    skip -= epoch * per_epoch
    while True:
        sampler.set_epoch(epoch)
        for i, (tokens,) in enumerate(loader):
            if i >= skip:
                yield tokens[:, :-1], tokens[:, 1:]
        epoch, skip = epoch + 1, 0


def schedule(steps):
    """Warm-up (a tenth of the run, at least 1 step), then cosine to 0 at ``steps``."""
    warm = max(1, steps // 10)

    def factor(it):
        if it < warm:
            return (it + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (it - warm) / max(1, steps - warm)))
    return factor


# ---- the bugs ---------------------------------------------------------------------------------------
def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def drop_moment(opt, eps, seed=1234):
    """Zero ``exp_avg`` for round(eps x its elements) (at least 1) chosen at random over all tensors
    (the local shards on sharded ranks; the same positions on every replica)."""
    moments = [_local(s["exp_avg"]) for s in opt.state.values() if "exp_avg" in s]
    sizes = [m.numel() for m in moments]
    total = sum(sizes)
    picked = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:max(1, round(eps * total))]
    mask = torch.zeros(total, dtype=torch.bool)
    mask[picked] = True
    with torch.no_grad():
        for m, part in zip(moments, mask.split(sizes)):
            m.view(-1)[part.view(-1)] = 0


def step_with_bug(opt, step, bug=None, resumed=False):
    """``opt.step()``, with ``bug`` applied where it is due (see the module docstring)."""
    kind, eps, at = bug or ("", 0.0, 0)
    due = resumed if kind == "resume_lr" else step >= at
    saved = [{k: g[k] for k in ("lr", "weight_decay", "betas") if k in g} for g in opt.param_groups]
    if due and kind in ("lr", "resume_lr", "weight_decay"):
        key = "weight_decay" if kind == "weight_decay" else "lr"
        for g in opt.param_groups:
            g[key] = g[key] * (1 + eps)
    elif due and kind in ("momentum", "betas"):
        for g in opt.param_groups:
            b1, b2 = g["betas"]
            g["betas"] = (b1 * (1 + eps), b2) if kind == "momentum" else (b1, min(b2 * (1 + eps), 1 - 1e-6))
    elif due and kind == "grad" and dist.get_rank() == dist.get_world_size() - 1:
        with torch.no_grad():
            for g in opt.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        _local(p.grad).mul_(1 + eps)
    elif kind == "moment" and step == at:
        drop_moment(opt, eps)
    opt.step()
    for g, options in zip(opt.param_groups, saved):
        g.update(options)


def train(model, opt, data, steps, bug=None, sched=None, clip=None, k=1, start=0, resumed=False, saver=None):
    """Optimizer steps ``start`` .. ``steps - 1``, each over ``k`` micro-batches of ``data`` (the loss
    divided by k, DDP's ``no_sync`` on all but the last), clipped, stepped with ``bug``; ``saver(n)``
    after the n-th step."""
    for step in range(start, steps):
        for j in range(k):
            x, y = next(data)
            quiet = model.no_sync() if j < k - 1 and hasattr(model, "no_sync") else contextlib.nullcontext()
            with quiet:
                (F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / k).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        step_with_bug(opt, step, bug, resumed)
        opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()
        if saver is not None:
            saver(step + 1)


def _adamw(model, **kw):
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, **kw)


def _lm(seed):
    torch.manual_seed(seed)
    return LM()


# ---- (a) DDP + AdamW + warm-up/cosine + clipping; the checkpointing trainer ----------------------------
def ddp(seed=0, steps=20, bug=None, checkpoint=False, save_every=4):
    """(a) in every rank; ``checkpoint=True``: saves every ``save_every`` steps, resumes from the latest."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    model = _lm(seed)
    opt = _adamw(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(steps))
    start, saver = 0, None
    if checkpoint:
        import pytest_mgpu

        path = os.path.join(str(pytest_mgpu.checkpoint_dir()), "ckpt.pt")
        start = _load(path, model, opt, sched, restore_scheduler=(bug or ("",))[0] != "no_scheduler")
        saver = _saver(path, model, opt, sched, save_every)
    data = batches(seed, world, rank, GLOBAL // world, skip=start)
    train(DDP(model), opt, data, steps, bug, sched, CLIP, start=start, resumed=start > 0, saver=saver)


def _load(path, model, opt, sched, restore_scheduler=True):
    """The step count of the checkpoint at ``path`` after loading it (0 where there is none)."""
    if not os.path.exists(path):
        return 0
    ckpt = torch.load(path, weights_only=False)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    if restore_scheduler:
        sched.load_state_dict(ckpt["scheduler"])
    return ckpt["step"]


def _saver(path, model, opt, sched, every):
    def save(n):
        if n % every == 0:
            if dist.get_rank() == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "scheduler": sched.state_dict(), "step": n}, path)
            dist.barrier()
    return save


def ddp_reference(seed=0, steps=20):
    model = _lm(seed)
    opt = _adamw(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(steps))
    train(model, opt, batches(seed, 1, 0, GLOBAL), steps, None, sched, CLIP)


# ---- (b) FSDP2 --------------------------------------------------------------------------------------
def fsdp2(seed=0, steps=20, bug=None):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    model = _lm(seed)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    train(model, _adamw(model), batches(seed, world, rank, GLOBAL // world), steps, bug)


def plain_reference(seed=0, steps=20):
    """(b) and (c)'s one-device loop: the LM, AdamW, the global batch."""
    model = _lm(seed)
    train(model, _adamw(model), batches(seed, 1, 0, GLOBAL), steps)


# ---- (c) tensor parallel ----------------------------------------------------------------------------
def tp(seed=0, steps=20, bug=None):
    """Every rank the same (global) batch; q/k/v and fc1 column-wise, o and fc2 row-wise."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _lm(seed)
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    for block in model.blocks:
        parallelize_module(block, mesh, plan)
    train(model, _adamw(model, foreach=False), batches(seed, 1, 0, GLOBAL), steps, bug)


# ---- (d) gradient accumulation ----------------------------------------------------------------------
def accum(seed=0, steps=20, bug=None):
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    model = _lm(seed)
    opt = _adamw(model)
    train(DDP(model), opt, batches(seed, world, rank, GLOBAL // world), steps, bug, clip=CLIP, k=ACCUM)


def accum_reference(seed=0, steps=20):
    model = _lm(seed)
    train(model, _adamw(model), batches(seed, 1, 0, GLOBAL), steps, clip=CLIP, k=ACCUM)


# family -> (distributed fn, one-device reference)
FAMILIES = {"ddp": (ddp, ddp_reference), "fsdp2": (fsdp2, plain_reference), "tp": (tp, plain_reference),
            "accum": (accum, accum_reference)}
