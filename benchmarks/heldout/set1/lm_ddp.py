"""A small causal LM under DDP: AdamW, linear warm-up then cosine ``LambdaLR``, ``clip_grad_norm_``.

Follows the shape of minGPT / nanoGPT's trainer (token + position embeddings, a causal
self-attention block through ``F.scaled_dot_product_attention(is_causal=True)``, AdamW with weight
decay, ``clip_grad_norm_`` between ``backward()`` and ``optimizer.step()``) and torchtitan's
``components/lr_scheduler.py`` (warm-up then cosine decay as a ``LambdaLR`` stepped once per
optimizer step), with the DDP tutorial's ``DistributedSampler`` epochs and ``set_epoch``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from .common import rank

VOCAB, DIM, CTX, HEADS = 32, 16, 8, 2
ROWS, GLOBAL_BATCH, EPOCHS, LR, CLIP = 32, 8, 2, 3e-3, 0.5
STEPS = 6  # 4 steps per epoch: the run crosses an epoch boundary
CORRECT = {"default": (2, 4)}
BUGS = {
    "lr_rank": "rank 1 builds its optimizer with twice the learning rate",
    "sched_twice": "the LambdaLR scheduler is stepped twice per optimizer step",
    "warmup_total": "total (and warm-up) steps computed from len(dataset) / local batch: schedule 2x long",
    "unwrapped_forward": "forward through ddp.module (the unwrapped model): no gradient all-reduce",
    "no_set_epoch": "sampler.set_epoch never called: epoch 1 repeats epoch 0's shuffle",
    "loss_times_world": "loss multiplied by the world size 'to undo DDP's averaging'",
    "clip_rank0_only": "clip_grad_norm_ called inside the rank-0 logging branch only",
    "no_zero_grad": "optimizer.zero_grad() called once before the loop, not every step",
}


class TinyLM(nn.Module):
    """Embeddings, one pre-norm causal attention + MLP block, an LM head."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(CTX, DIM)
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t))
        q, k, v = (z.view(b, t, HEADS, DIM // HEADS).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(DIM, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.proj(y)
        return self.head(x + self.mlp(self.ln2(x)))


def dataset() -> TensorDataset:
    """ROWS sequences of CTX+1 tokens: inputs and next-token targets."""
    g = torch.Generator().manual_seed(11)
    data = torch.randint(0, VOCAB, (ROWS, CTX + 1), generator=g)
    return TensorDataset(data[:, :-1], data[:, 1:])


def warmup_cosine(warmup: int, total: int):
    """torchtitan-style multiplier: linear warm-up to 1, then cosine down to 0.1."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return factor


def _epochs(forward, params, sampler, loader, opt, sched, bug=None):
    """The training loop both sides run; ``bug`` bends it where the distributed side errs."""
    if bug == "no_zero_grad":
        opt.zero_grad(set_to_none=True)
    for epoch in range(EPOCHS):
        if bug != "no_set_epoch":
            sampler.set_epoch(epoch)
        for x, y in loader:
            if bug != "no_zero_grad":
                opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(forward(x).reshape(-1, VOCAB), y.reshape(-1))
            if bug == "loss_times_world":
                loss = loss * torch.distributed.get_world_size()
            loss.backward()
            if bug != "clip_rank0_only" or rank() == 0:
                torch.nn.utils.clip_grad_norm_(params, CLIP)
            opt.step()
            sched.step()
            if bug == "sched_twice":
                sched.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP over TinyLM, DistributedSampler with shuffle, global batch GLOBAL_BATCH."""
    ddp = DDP(TinyLM())
    ds = dataset()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    local = GLOBAL_BATCH // world_size
    loader = DataLoader(ds, batch_size=local, sampler=sampler)
    lr = 2 * LR if bug == "lr_rank" and rank() == 1 else LR
    opt = torch.optim.AdamW(ddp.parameters(), lr=lr, weight_decay=0.1)
    total = EPOCHS * (len(ds) // local if bug == "warmup_total" else len(loader))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(total // 4, total))
    forward = ddp.module if bug == "unwrapped_forward" else ddp
    _epochs(forward, list(ddp.parameters()), sampler, loader, opt, sched, bug)


def reference(world_size: int) -> None:
    """One device: the same sampler with one replica, the global batch per step."""
    model = TinyLM()
    ds = dataset()
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=GLOBAL_BATCH, sampler=sampler)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    total = EPOCHS * len(loader)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(total // 4, total))
    _epochs(model, list(model.parameters()), sampler, loader, opt, sched)
