"""Mixed precision by hand on CPU under DDP: a tiny pre-norm transformer block (self-attention, then an
MLP with dropout) run under ``torch.autocast("cpu", dtype=torch.bfloat16)``, its body wrapped in
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` (activation checkpointing; the dropout
mask is redrawn in the recompute from the restored RNG state), ``torch.amp.GradScaler("cpu")``, gradient
accumulation over ``ACC`` micro-batches (``ddp.no_sync()`` on all but the last, each loss divided by
``ACC``), then ``scaler.unscale_(opt)``, ``clip_grad_norm_``, ``scaler.step(opt)``, ``scaler.update()``,
``opt.zero_grad()``. The dropout draws its mask from the global RNG (seeded the same on every rank) for
the global micro-batch and keeps the rank's rows, so every rank's mask is the one-device mask's block.
Cross entropy over a mean-pooled sequence, mean over the rank's rows.

The one-device reference runs the same on the global micro-batches.

Follows the PyTorch AMP examples (``docs/source/notes/amp_examples.rst``: "Working with Unscaled
Gradients: gradient clipping" (``scaler.unscale_(optimizer)`` then ``clip_grad_norm_`` then
``scaler.step``), "Gradient accumulation" (``loss = loss / iters_to_accumulate``, step every
``iters_to_accumulate``)), ``torch/utils/checkpoint.py`` (``preserve_rng_state``), and
huggingface/transformers ``modeling_utils.py`` / ``models/gpt2/modeling_gpt2.py`` (``gradient_checkpointing``
with ``use_reentrant=False`` around each block, dropout inside it).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from .common import gen, rank

D, T, C, MB, SEED = 8, 4, 3, 4, 59
ACC, UPDATES, LR, MAX_NORM, P_DROP = 2, 4, 0.1, 1.0, 0.2
STEPS = UPDATES
CORRECT = {"default": (2, 4)}
BUGS = {
    "clip_before_unscale": "clip_grad_norm_ is applied to the still-scaled gradients (before scaler.unscale_), then scaler.step unscales",
    "manual_unscale": "the gradients are divided by scaler.get_scale() by hand and scaler.step unscales them again",
    "step_per_micro": "scaler.step / scaler.update / zero_grad run on every micro-batch instead of every ACC micro-batches",
    "sync_wrong_micro": "no_sync is on the last micro-batch instead of the first: the gradients all-reduced are the first micro-batch's only",
    "loss_not_divided": "the micro-batch loss is not divided by ACC: the accumulated gradient is the sum, not the mean",
    "ckpt_rng_not_preserved": "checkpoint(..., preserve_rng_state=False): the recompute draws a different dropout mask than the forward",
    "zero_grad_per_micro": "opt.zero_grad() is called before every micro-batch: only the last micro-batch's gradient is kept",
}


class RowDropout(nn.Module):
    """Dropout whose mask is drawn (global RNG) for the whole micro-batch; ``rows`` picks this process's block."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p, self.rows = p, slice(None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        keep = (torch.rand((MB,) + tuple(x.shape[1:])) >= self.p)[self.rows]
        return x * keep.to(x.dtype) / (1 - self.p)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.drop = RowDropout(P_DROP)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.fc2(self.drop(F.gelu(self.fc1(self.ln2(x)))))


class Net(nn.Module):
    def __init__(self, preserve: bool = True) -> None:
        super().__init__()
        self.inp, self.block, self.head = nn.Linear(2, D), Block(), nn.Linear(D, C)
        self.preserve = preserve

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.block, self.inp(x), use_reentrant=False, preserve_rng_state=self.preserve)
        return self.head(h.mean(1))


def build(bug=None):
    torch.manual_seed(SEED)
    model = Net(preserve=bug != "ckpt_rng_not_preserved")
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def micro(k: int):
    g = gen(SEED + k)
    x = torch.randn(MB, T, 2, generator=g)
    y = (x.sum(1) @ torch.tensor([[1.0, -1.0, 0.3], [0.5, 0.5, -1.0]]) + 0.3 * torch.randn(MB, C, generator=g)).argmax(1)
    return x, y


def run(model, fwd, opt, rows, sync, bug=None) -> None:
    """The loop; ``rows`` keeps this process's block of a micro-batch, ``sync(last)`` the backward's context."""
    scaler = torch.amp.GradScaler("cpu")
    torch.manual_seed(SEED + 1)   # the dropout masks' stream, the same on every process
    for k in range(UPDATES * ACC):
        last = (k + 1) % ACC == 0
        x, y = micro(k)
        if bug == "zero_grad_per_micro":
            opt.zero_grad()
        with sync(last if bug != "sync_wrong_micro" else k % ACC == 0):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(fwd(rows(x)), rows(y))
            scaler.scale(loss if bug == "loss_not_divided" else loss / ACC).backward()
        if last or bug == "step_per_micro":
            if bug == "clip_before_unscale":
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            elif bug == "manual_unscale":
                for p in model.parameters():
                    p.grad.div_(scaler.get_scale())
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            else:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the model under DDP, its block of each global micro-batch, no_sync but on the last."""
    r, lb = rank(), MB // world_size
    model, opt = build(bug)
    ddp = DDP(model)
    model.block.drop.rows = slice(r * lb, (r + 1) * lb)
    run(model, ddp, opt, lambda t: t[r * lb:(r + 1) * lb],
        lambda last: contextlib.nullcontext() if last else ddp.no_sync(), bug)


def reference(world_size: int) -> None:
    """One device: the same loop on the global micro-batches."""
    model, opt = build()
    run(model, model, opt, lambda t: t, lambda last: contextlib.nullcontext())
