"""BERT-style masked-LM pre-training under DDP: the masking of ``DataCollatorForLanguageModeling``
(15%-style selection with special tokens and padding excluded, labels -100 on the unselected tokens,
80% of the selected replaced by ``[MASK]``, half the rest by a random word, the rest kept), drawn by a
seeded generator for the GLOBAL batch and sliced per rank; a tiny token encoder with an LM head; the
loss summed over the rank's labelled tokens and divided by the labelled tokens of the global batch
(the count all-reduced), times the world size since DDP averages gradients; AdamW.

The one-device reference takes the global batch of each step, draws the same masks and divides the
summed loss by the same global count.

Follows huggingface/transformers ``src/transformers/data/data_collator.py``
(``DataCollatorForLanguageModeling.torch_mask_tokens``: ``probability_matrix.masked_fill_(
special_tokens_mask, 0.0)``, ``labels[~masked_indices] = -100``, ``indices_replaced``, ``indices_random
= bernoulli(0.5) & masked_indices & ~indices_replaced``), the collators copied in GabrielLaurent/electra
``electra/data/data_utils.py`` (``mask_tokens``), and ``trainer.py`` (loss divided by
``num_items_in_batch`` gathered over the processes, multiplied by the number of processes under DDP).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce, gen, rank

V, L, D, N, GB, SEED = 24, 12, 16, 32, 8, 29
PAD, CLS, SEP, MASK = 0, 1, 2, 3
PROB, LR = 0.3, 3e-3
STEPS = 4   # N / GB
CORRECT = {"default": (2, 4)}
BUGS = {
    "mask_local_draw": "every rank draws the masking for its own rows from the same seeded generator instead of slicing the global batch's draw",
    "random_overwrites_mask": "the random-word replacement is drawn without excluding the tokens already replaced by [MASK]",
    "labels_not_ignored": "labels of the unselected tokens are not set to -100: the loss is taken over every token",
    "labels_after_masking": "labels are cloned from the inputs after the masking: the targets are [MASK] and random ids",
    "special_not_excluded": "special tokens and padding are not excluded from the masking probability",
    "local_token_mean": "the loss is the mean over the rank's labelled tokens (reduction='mean'), not divided by the global count",
}


class TinyMLM(nn.Module):
    """Token + position embeddings, one mixing MLP with a mean-pooled context, an LM head."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(L, D)
        self.ctx = nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V)

    def forward(self, ids):
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        keep = (ids != PAD).unsqueeze(-1).float()
        h = h + self.ctx((h * keep).sum(1, keepdim=True) / keep.sum(1, keepdim=True))
        h = self.norm(h + self.mlp(h))
        return self.head(h)


def corpus() -> torch.Tensor:
    """N rows: [CLS] words [SEP] then padding, of lengths 6..L."""
    g = gen(SEED)
    ids = torch.full((N, L), PAD)
    lens = torch.randint(6, L + 1, (N,), generator=g)
    for i in range(N):
        n = int(lens[i])
        ids[i, 0], ids[i, n - 1] = CLS, SEP
        ids[i, 1:n - 1] = torch.randint(4, V, (n - 2,), generator=g)
    return ids


def draws(step: int, rows: int):
    """The masking's random draws for ``rows`` rows of step ``step``."""
    g = gen(SEED + 1000 + step)
    u_sel = torch.rand(rows, L, generator=g)
    u_rep = torch.rand(rows, L, generator=g)
    u_rand = torch.rand(rows, L, generator=g)
    words = torch.randint(4, V, (rows, L), generator=g)
    return u_sel, u_rep, u_rand, words


def mask_tokens(ids, d, bug=None):
    """torch_mask_tokens on ``ids`` with the draws ``d``: (inputs, labels)."""
    u_sel, u_rep, u_rand, words = d
    inputs = ids.clone()
    labels = ids.clone()
    prob = torch.full(ids.shape, PROB)
    if bug != "special_not_excluded":
        prob.masked_fill_(ids < 4, 0.0)
    masked = u_sel < prob
    if bug != "labels_not_ignored":
        labels[~masked] = -100
    replaced = (u_rep < 0.8) & masked
    inputs[replaced] = MASK
    rnd = (u_rand < 0.5) & masked
    if bug != "random_overwrites_mask":
        rnd &= ~replaced
    inputs[rnd] = words[rnd]
    if bug == "labels_after_masking":
        labels = inputs.clone()
        labels[~masked] = -100
    return inputs, labels


def build():
    torch.manual_seed(SEED)
    model = TinyMLM()
    return model, torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of each global batch, masked with the global draw's rows."""
    r, w = rank(), world_size
    model, opt = build()
    ddp = DDP(model)
    ids_all, lb = corpus(), GB // w
    for step in range(STEPS):
        rows = ids_all[step * GB:(step + 1) * GB][r * lb:(r + 1) * lb]
        if bug == "mask_local_draw":
            d = draws(step, lb)
        else:
            d = tuple(t[r * lb:(r + 1) * lb] for t in draws(step, GB))
        inputs, labels = mask_tokens(rows, d, bug)
        logits = ddp(inputs)
        if bug == "local_token_mean":
            loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
        else:
            count = all_reduce((labels != -100).sum().float())
            loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100,
                                   reduction="sum") / count * w
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global batch of each step, the global draw, the global count."""
    model, opt = build()
    ids_all = corpus()
    for step in range(STEPS):
        inputs, labels = mask_tokens(ids_all[step * GB:(step + 1) * GB], draws(step, GB))
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
