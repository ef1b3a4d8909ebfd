"""Packed variable-length sequences for a tiny causal LM under DDP with gradient accumulation: documents of
random lengths are concatenated into fixed-length rows; the position ids restart at 0 at every document,
attention is causal and block-diagonal (a token sees the earlier tokens of its own document only, the
blocks from the row's ``cu_seqlens``), and the label of a document's last token is -100 (no prediction
across a document boundary). The loss is the sum of the token cross-entropies divided by the number of
target tokens of the whole global batch (every rank, every micro-batch: the count all-reduced), times the
world size (DDP averages). Two micro-batches per optimizer step, the first under ``no_sync()``. AdamW with
a per-optimizer-step linear warm-up then cosine schedule (``LambdaLR``). Each rank keeps its block of rows.

The one-device reference: one pass over the global batch per step, the sum of the token losses over the
same count, the same schedule.

Follows huggingface/transformers ``data/data_collator.py`` ``DataCollatorWithFlattening`` (``position_ids``
from 0 per example, ``-100`` as the first label of every example, ``return_seq_idx``/``cu_seq_lens``),
``modeling_flash_attention_utils.py`` (``prepare_fa_kwargs_from_position_ids``: ``cu_seqlens`` where the
position ids restart) and ``trainer.py`` (``num_items_in_batch``: the target tokens of all the
accumulated micro-batches, gathered over the processes; ``get_cosine_schedule_with_warmup`` in
``optimization.py``), and the trl docs on packing (``padding_free``, position ids reset per sequence).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce, gen, rank

V, D, L, ROWS, MICRO, SEED, WARM = 16, 16, 12, 8, 2, 145, 2
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "position_ids_not_reset": "the position ids run 0..L-1 over the whole packed row instead of restarting at every document",
    "mask_crosses_docs": "a plain causal mask over the packed row: tokens attend to the earlier documents of the row",
    "labels_cross_docs": "the labels are the row shifted by one: a document's last token is trained to predict the next document's first token",
    "loss_local_tokens": "the loss is divided by the rank's own target-token count instead of the global count (all ranks, all micro-batches)",
    "loss_mean_per_microbatch": "each micro-batch's loss is its token mean divided by the accumulation steps instead of the sum over the global token count",
    "warmup_in_micro_steps": "scheduler.step() runs after every micro-batch: warm-up and cosine advance in micro-steps",
}


def pack_row(g: torch.Generator):
    """One packed row: tokens and the document index of every position."""
    tokens, docs, d = [], [], 0
    while len(tokens) < L:
        n = int(torch.randint(2, 6, (1,), generator=g))
        start, stride = int(torch.randint(0, V, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        tokens += [(start + stride * i) % V for i in range(n)]
        docs += [d] * n
        d += 1
    return torch.tensor(tokens[:L]), torch.tensor(docs[:L])


def batch(step: int, bug=None):
    """The global batch: tokens, position ids, labels and the attention mask of every row."""
    g = gen(SEED + step)
    tokens, docs = (torch.stack(t) for t in zip(*(pack_row(g) for _ in range(ROWS))))
    idx = torch.arange(L).expand(ROWS, L)
    starts = torch.cat([torch.ones(ROWS, 1, dtype=torch.bool), docs[:, 1:] != docs[:, :-1]], 1)
    first = torch.cummax(torch.where(starts, idx, torch.zeros_like(idx)), 1).values
    pos = idx.clone() if bug == "position_ids_not_reset" else idx - first
    labels = torch.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    if bug != "labels_cross_docs":
        labels[:, :-1][docs[:, 1:] != docs[:, :-1]] = -100
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool))
    mask = causal.expand(ROWS, L, L) if bug == "mask_crosses_docs" else causal & (docs[:, :, None] == docs[:, None, :])
    return tokens, pos, labels, mask


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(L, D)
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.proj = nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.head = nn.Linear(D, V)

    def forward(self, tokens, pos, mask):
        x = self.tok(tokens) + self.pos(pos)
        q, k, v = self.qkv(F.layer_norm(x, (D,))).chunk(3, -1)
        att = (q @ k.mT / math.sqrt(D)).masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj(att @ v)
        x = x + self.mlp(F.layer_norm(x, (D,)))
        return self.head(F.layer_norm(x, (D,)))


def schedule(opt):
    def lam(s):
        return (s + 1) / WARM if s < WARM else 0.5 * (1 + math.cos(math.pi * (s - WARM) / (STEPS - WARM)))
    return torch.optim.lr_scheduler.LambdaLR(opt, lam)


def token_loss(logits, labels):
    return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100, reduction="sum")


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of rows in MICRO micro-batches, the first under no_sync()."""
    r, lb = rank(), ROWS // world_size
    model = TinyLM()
    ddp = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = schedule(opt)
    mb = lb // MICRO
    for step in range(STEPS):
        t, p, y, m = (x[r * lb:(r + 1) * lb] for x in batch(step, bug))
        local_n = (y != -100).sum().float()
        n = local_n if bug == "loss_local_tokens" else all_reduce(local_n)
        opt.zero_grad()
        for i in range(MICRO):
            part = slice(i * mb, (i + 1) * mb)
            ctx = ddp.no_sync() if i < MICRO - 1 else torch.enable_grad()
            with ctx:
                s = token_loss(ddp(t[part], p[part], m[part]), y[part])
                if bug == "loss_mean_per_microbatch":
                    loss = s / (y[part] != -100).sum() / MICRO
                else:
                    loss = s / n * (1 if bug == "loss_local_tokens" else world_size)
                loss.backward()
            if bug == "warmup_in_micro_steps" and i < MICRO - 1:
                sched.step()
        opt.step()
        sched.step()


def reference(world_size: int) -> None:
    """One device: the global batch in one pass, the token losses summed over the global count."""
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = schedule(opt)
    for step in range(STEPS):
        t, p, y, m = batch(step)
        loss = token_loss(model(t, p, m), y) / (y != -100).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
