"""FSDP2 (``fully_shard``) on a small pre-norm Transformer with a ``MixedPrecisionPolicy`` and
gradient accumulation through ``set_requires_gradient_sync``.

Follows pytorch/examples ``distributed/FSDP2/example.py`` (``fully_shard`` on every
``TransformerBlock`` then on the root, ``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)``
passed to both, the optimizer built after sharding, ``torch.nn.utils.clip_grad_norm_`` over the
DTensor parameters) and pytorch/torchtitan ``torchtitan/train.py`` (``gradient_accumulation_steps``
micro-batches, each loss divided by their number, a ``LambdaLR`` linear warmup stepped once per
optimizer step) with the FSDP2 docs' ``model.set_requires_gradient_sync(is_last_microbatch)``. The
policy is float32 for both dtypes here (bfloat16 would move the run off the float32 reference by its
own rounding). Variants: the default ``reshard_after_forward=True``; ``reshard_after_forward=False``
(ZeRO-2-like); synchronizing on every micro-batch (no ``set_requires_gradient_sync``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..set1.common import block, rank, reseed_apart

VOCAB, DIM, HEADS, SEQ, BATCH = 32, 16, 2, 8, 4
ACCUM, LR, WARMUP, CLIP = 2, 5e-3, 3, 0.1
STEPS = 5
CORRECT = {"default": (2, 4), "no_reshard": (2,), "sync_every_micro": (2,)}
BUGS = {
    "sync_flag_first": "set_requires_gradient_sync(micro == 0): the reduce-scatter runs on the first micro-batch, not the last",
    "optimizer_before_shard": "AdamW built on model.parameters() before fully_shard replaced them with DTensor parameters",
    "seed_apart": "torch.manual_seed(seed + rank) before building: fully_shard shards each rank's own initialization",
    "loss_not_divided": "the micro-batch loss not divided by gradient_accumulation_steps",
    "clip_local_norm": "hand-written clipping: total norm from p.grad.to_local(), each rank's shard only",
    "first_micro_repeated": "the data iterator re-created inside the accumulation loop: every micro-batch of a step is its first",
    "sched_per_micro": "the warmup LambdaLR stepped after every micro-batch",
}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.wqkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.ffn_norm = nn.LayerNorm(DIM)
        self.w1 = nn.Linear(DIM, 2 * DIM)
        self.w2 = nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).split(DIM, dim=-1)
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in (q, k, v))
        h = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.wo(h)
        return x + self.w2(F.silu(self.w1(self.ffn_norm(x))))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def global_micro(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded table of 64 sequences per micro-batch; the first BATCH * W of them are its global rows."""
    g = torch.Generator().manual_seed(5000 + 10 * step + micro)
    seq = torch.randint(0, VOCAB, (64, SEQ + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def rows(step: int, micro: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = global_micro(step, micro)
    return x[:BATCH * w], y[:BATCH * w]


def warmup(step: int) -> float:
    return min(1.0, (step + 1) / (WARMUP + 1))


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def _clip_local(params, max_norm: float) -> None:
    grads = [p.grad for p in params if p.grad is not None]
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    total = torch.norm(torch.stack([torch.norm(g) for g in local]))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in local:
        g.mul_(coef)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: fully_shard per block and on the root, AdamW, accumulation of ACCUM micro-batches."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if bug == "seed_apart":
        reseed_apart()
    model = Transformer()
    if bug == "optimizer_before_shard":
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    reshard = variant != "no_reshard"
    for layer in model.layers:
        fully_shard(layer, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)
    if bug != "optimizer_before_shard":
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    for step in range(STEPS):
        for micro in range(ACCUM):
            if variant != "sync_every_micro":
                model.set_requires_gradient_sync((micro == 0) if bug == "sync_flag_first" else micro == ACCUM - 1)
            x, y = (block(t, rank(), world_size) for t in rows(step, 0 if bug == "first_micro_repeated" else micro, world_size))
            loss = loss_of(model, x, y)
            if bug != "loss_not_divided":
                loss = loss / ACCUM
            loss.backward()
            if bug == "sched_per_micro" and micro < ACCUM - 1:
                sched.step()
        if bug == "clip_local_norm":
            _clip_local(model.parameters(), CLIP)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        opt.zero_grad()


def reference(world_size: int) -> None:
    """One device: each micro-batch's global rows, the loss divided by ACCUM."""
    model = Transformer()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    for step in range(STEPS):
        for micro in range(ACCUM):
            x, y = rows(step, micro, world_size)
            (loss_of(model, x, y) / ACCUM).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        opt.zero_grad()
