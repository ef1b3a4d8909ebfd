"""A nanoGPT-style language model under DDP with gradient accumulation.

Follows karpathy/nanoGPT ``train.py`` and ``model.py``: ``gradient_accumulation_steps`` given for the
whole run and divided by ``ddp_world_size``; per micro step
``model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)``, the loss
divided by ``gradient_accumulation_steps``; ``GPT.configure_optimizers`` (AdamW, decay for every
parameter of dim >= 2, none for biases and LayerNorm weights, betas (0.9, 0.95)); ``get_lr(iter_num)``
(linear warmup then cosine decay to ``min_lr``) written into every param group before the step;
``torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)``; ``wte`` tied to ``lm_head``.
Here the rows are not random draws with a per-rank seed offset but micro-batch ``k`` of a seeded
token table, rank ``r`` taking micro-batches ``r * A ... r * A + A - 1`` of each iteration (A the
per-rank accumulation); the one-device reference runs all ``A * W`` micro-batches, nanoGPT's
single-process setting of the same tokens per iteration.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..set1.common import rank

VOCAB, BLOCK, EMBD, HEADS, MICRO = 24, 8, 16, 2, 2
ACCUM_PER_RANK = 2
LR, MIN_LR, WARMUP, DECAY_ITERS, WD, CLIP = 3e-3, 3e-4, 2, 6, 0.1, 0.25
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "sync_first_micro": "require_backward_grad_sync = (micro_step == 0): only the first micro-batch's gradients are all-reduced",
    "loss_not_scaled": "loss not divided by gradient_accumulation_steps",
    "accum_not_split": "gradient_accumulation_steps not divided by the world size: every rank runs all A*W micro-batches of its own",
    "lr_first_group": "get_lr written into optimizer.param_groups[0] only: the no-decay group keeps the base lr",
    "decay_all": "AdamW over model.parameters() with weight_decay: biases and LayerNorm weights decayed too",
    "same_rows": "the per-rank data offset dropped: every rank reads micro-batches 0..A-1",
    "clip_each_micro": "clip_grad_norm_ called inside the micro-step loop, on the local unsynced partial gradients",
    "iter_per_micro": "iter_num incremented per micro step: get_lr runs A times too fast",
}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(EMBD)
        self.c_attn = nn.Linear(EMBD, 3 * EMBD)
        self.c_proj = nn.Linear(EMBD, EMBD)
        self.ln_2 = nn.LayerNorm(EMBD)
        self.c_fc = nn.Linear(EMBD, 4 * EMBD)
        self.mlp_proj = nn.Linear(4 * EMBD, EMBD)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(EMBD, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, EMBD)
        self.wpe = nn.Embedding(BLOCK, EMBD)
        self.h = nn.ModuleList([Block()])
        self.ln_f = nn.LayerNorm(EMBD)
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def configure_optimizers(net: nn.Module, bug: str | None = None) -> torch.optim.AdamW:
    """nanoGPT's configure_optimizers: decay for dim >= 2, none for the rest."""
    if bug == "decay_all":
        return torch.optim.AdamW(net.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=WD)
    params = [p for p in net.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95))


def get_lr(it: int) -> float:
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    if it > DECAY_ITERS:
        return MIN_LR
    ratio = (it - WARMUP) / (DECAY_ITERS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def get_batch(it: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch ``k`` of iteration ``it``: MICRO sequences of BLOCK tokens and their next tokens."""
    g = torch.Generator().manual_seed(10_000 + 100 * it + k)
    seq = torch.randint(0, VOCAB, (MICRO, BLOCK + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: nanoGPT's DDP loop."""
    gradient_accumulation_steps = ACCUM_PER_RANK * world_size
    if bug != "accum_not_split":
        gradient_accumulation_steps //= world_size
    net = GPT()
    model = DDP(net)
    opt = configure_optimizers(net, bug)
    iter_num = 0
    for it in range(STEPS):
        lr = get_lr(iter_num)
        groups = opt.param_groups[:1] if bug == "lr_first_group" else opt.param_groups
        for group in groups:
            group["lr"] = lr
        for micro_step in range(gradient_accumulation_steps):
            last = micro_step == gradient_accumulation_steps - 1
            model.require_backward_grad_sync = (micro_step == 0) if bug == "sync_first_micro" else last
            k = micro_step if bug == "same_rows" else rank() * gradient_accumulation_steps + micro_step
            x, y = get_batch(it, k)
            loss = model(x, y)
            if bug != "loss_not_scaled":
                loss = loss / gradient_accumulation_steps
            loss.backward()
            if bug == "clip_each_micro":
                torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            if bug == "iter_per_micro":
                iter_num += 1
        if bug != "clip_each_micro":
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if bug != "iter_per_micro":
            iter_num += 1


def reference(world_size: int) -> None:
    """One process: all A * W micro-batches of each iteration, the loss divided by A * W."""
    gradient_accumulation_steps = ACCUM_PER_RANK * world_size
    net = GPT()
    opt = configure_optimizers(net)
    for it in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = get_lr(it)
        for k in range(gradient_accumulation_steps):
            x, y = get_batch(it, k)
            (net(x, y) / gradient_accumulation_steps).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
