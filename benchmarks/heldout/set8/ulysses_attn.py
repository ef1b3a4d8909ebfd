"""DeepSpeed-Ulysses sequence parallelism by hand: every rank holds a contiguous block of S / W positions
of every sequence; q, k, v are projected locally, an ``all_to_all`` scatters the heads and gathers the
sequence (each rank then attends over the FULL sequence for H / W heads), a second ``all_to_all``
returns to sequence blocks of all heads before the output projection. Position embeddings are taken at
the block's global offset; the next-token labels are shifted on the whole sequence BEFORE it is split;
each rank's loss is its tokens' summed cross-entropy over the GLOBAL count of labelled tokens, and the
replicated parameters' gradients are summed over the sequence-parallel group (here the whole world).

Follows microsoft/DeepSpeed ``deepspeed/sequence/layer.py`` (``_SeqAllToAll``: ``tensor_split`` along
``scatter_idx``, ``all_to_all``, ``cat`` along ``gather_idx``; ``DistributedAttention.forward``: q, k, v
with ``scatter_idx`` heads / ``gather_idx`` sequence, the local attention, then the exchange back),
Megatron-DeepSpeed's ``get_batch`` for sequence parallelism (labels shifted, then the sequence
sliced per rank) and ``finalize_model_grads.py`` (replicated gradients all-reduced).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .common import all_reduce, all_reduce_grads, all_to_all, gen, rank, world

VOCAB, DM, H, S, B, SEED = 16, 16, 4, 8, 2, 13
HD = DM // H
LR, MOMENTUM = 0.2, 0.9
STEPS = 5
IGNORE = -100
CORRECT = {"default": (2, 4)}
BUGS = {
    "no_all_to_all": "attention without the all_to_all: each rank attends only within its own sequence block",
    "positions_from_zero": "position ids 0..S/W-1 on every rank instead of the block's global offset",
    "heads_order_swapped": "the return all_to_all regroups heads in the wrong order (head index taken as local-major)",
    "labels_shifted_per_block": "next-token labels shifted inside each rank's block (the block's last token loses its label)",
    "no_grad_allreduce": "the replicated parameters' gradients are not all-reduced over the sequence-parallel group",
    "loss_local_mean": "each rank's loss is the mean over its own tokens while the gradients are summed over the ranks",
    "grad_average": "the gradients are averaged (divided by W) over the sequence-parallel group instead of summed",
}


def seq_to_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, S/W, H, D] (all heads of my block) -> [B, S, H/W, D] (my heads over the whole sequence)."""
    w = world()
    b, s, h, d = x.shape
    y = all_to_all(x.permute(2, 0, 1, 3).contiguous())            # [H, B, S/W, D]; chunk i of heads -> rank i
    y = y.reshape(w, h // w, b, s, d)                               # [source rank = seq block, my heads, ...]
    return y.permute(2, 0, 3, 1, 4).reshape(b, w * s, h // w, d)


def heads_to_seq(x: torch.Tensor, bug=None) -> torch.Tensor:
    """[B, S, H/W, D] -> [B, S/W, H * D] (my block, all heads, head-major)."""
    w = world()
    b, s, hl, d = x.shape
    y = all_to_all(x.reshape(b, w, s // w, hl, d).permute(1, 0, 2, 3, 4).contiguous())  # [src = head group, B, S/W, H/W, D]
    if bug == "heads_order_swapped":
        return y.permute(1, 2, 3, 0, 4).reshape(b, s // w, w * hl * d)
    return y.permute(1, 2, 0, 3, 4).reshape(b, s // w, w * hl * d)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DM)
        self.pos = nn.Embedding(S, DM)
        self.qkv = nn.Linear(DM, 3 * DM)
        self.proj = nn.Linear(DM, DM)
        self.head = nn.Linear(DM, VOCAB)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, bug=None) -> torch.Tensor:
        x = self.tok(ids) + self.pos(pos)
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, H, HD).unbind(2)
        parallel = world() > 1 and bug != "no_all_to_all"
        if parallel:
            q, k, v = seq_to_heads(q), seq_to_heads(k), seq_to_heads(v)
        att = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HD)
        n = q.shape[1]
        att = att.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf")).softmax(-1)
        o = torch.einsum("bhqk,bkhd->bqhd", att, v)
        o = heads_to_seq(o, bug) if parallel else o.reshape(b, n, DM)
        return self.head(x + self.proj(o))


def batch(step: int):
    g = gen(SEED + step)
    base = torch.randint(0, VOCAB, (B, 1), generator=g)
    ids = (base + torch.arange(S) * torch.randint(1, 3, (B, 1), generator=g)) % VOCAB
    labels = torch.cat([ids[:, 1:], torch.full((B, 1), IGNORE)], 1)
    return ids, labels


def build():
    torch.manual_seed(SEED)
    model = TinyLM()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its sequence block of each batch, Ulysses attention, the loss over the global count."""
    r, w = rank(), world_size
    model, opt = build()
    sl = S // w
    for step in range(STEPS):
        ids, labels = batch(step)
        ids = ids[:, r * sl:(r + 1) * sl]
        if bug == "labels_shifted_per_block":
            labels = torch.cat([ids[:, 1:], torch.full((B, 1), IGNORE)], 1)
        else:
            labels = labels[:, r * sl:(r + 1) * sl]
        pos = torch.arange(sl) + (0 if bug == "positions_from_zero" else r * sl)
        logits = model(ids, pos.expand(B, sl), bug)
        tok = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE, reduction="sum")
        count = (labels != IGNORE).sum().float()
        loss = tok / (count if bug == "loss_local_mean" else all_reduce(count))
        opt.zero_grad()
        loss.backward()
        if bug != "no_grad_allreduce":
            all_reduce_grads(model.parameters(), divide=w if bug == "grad_average" else 1)
        opt.step()


def reference(world_size: int) -> None:
    """One device: whole sequences, the mean over all labelled tokens."""
    model, opt = build()
    for step in range(STEPS):
        ids, labels = batch(step)
        logits = model(ids, torch.arange(S).expand(B, S))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE)
        opt.zero_grad()
        loss.backward()
        opt.step()
