"""A Hugging Face ``Trainer``-like loop written as plain PyTorch: padded token batches, gradient
accumulation with DDP ``no_sync``, the loss normalised by the number of label tokens of the whole
optimizer step across accumulation steps and ranks, ``max_grad_norm`` clipping, a linear warm-up
schedule, weight decay off for biases and LayerNorm weights.

Follows huggingface/transformers ``src/transformers/trainer.py`` (``_inner_training_loop``:
``batch_samples, num_items_in_batch = self.get_batch_samples(epoch_iterator, num_batches)`` where
``num_items_in_batch = sum((batch["labels"].ne(-100)).sum() for batch in batch_samples)`` gathered
over processes, ``self.accelerator.no_sync`` for every micro-batch but the last, ``loss *=
self.accelerator.num_processes`` when ``average_tokens_across_devices``, clipping with
``args.max_grad_norm`` after the last micro-batch, ``optimizer.step(); lr_scheduler.step();
model.zero_grad()``; ``get_decay_parameter_names``: no decay for ``bias`` and LayerNorm weights),
``src/transformers/loss/loss_utils.py`` (``ForCausalLMLoss``: ``F.cross_entropy(...,
ignore_index=-100, reduction="sum") / num_items_in_batch``) and ``src/transformers/optimization.py``
(``get_linear_schedule_with_warmup`` as a ``LambdaLR``). ``optim="sgd"`` (SGD with momentum) so that
a gradient's scale shows in the update; a per-token MLP language model with a LayerNorm stands for a
transformer.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import block, gen, rank

VOCAB, EMB, SEQ, MICRO_ROWS, ACCUM = 17, 16, 6, 8, 2  # MICRO_ROWS: global rows per micro-batch
LR, MOMENTUM, WD, WARMUP, MAX_GRAD_NORM = 0.5, 0.9, 0.1, 2, 1.0
STEPS = 5
CORRECT = {"default": (2, 4)}
BUGS = {
    "mean_per_micro": "each micro-batch's loss a token mean divided by gradient_accumulation_steps (pre-fix Trainer)",
    "num_items_local": "num_items_in_batch counted on the local rank only and the loss not multiplied by num_processes",
    "no_world_mult": "num_items_in_batch gathered over ranks but the loss not multiplied by num_processes",
    "sched_per_micro": "lr_scheduler.step() after every micro-batch instead of after every optimizer step",
    "zero_grad_per_micro": "model.zero_grad() at the top of every micro-batch: only the last micro-batch's gradient kept",
    "clip_each_micro": "clip_grad_norm_ after every micro-batch's backward (local, unsynced gradients under no_sync)",
    "no_sync_always": "the last micro-batch also under no_sync (off-by-one): gradients never all-reduced",
}


class TokenLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, EMB)
        self.fc = nn.Linear(2 * EMB, EMB)
        self.LayerNorm = nn.LayerNorm(EMB)
        self.lm_head = nn.Linear(EMB, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.wte(ids)
        prev = torch.cat([torch.zeros_like(e[:, :1]), e[:, :-1]], dim=1)
        return self.lm_head(self.LayerNorm(torch.tanh(self.fc(torch.cat([e, prev], dim=-1)))))


def micro_batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global rows of one micro-batch: token ids, labels with -100 on the right padding (lengths vary)."""
    g = gen(1000 * step + micro)
    ids = torch.randint(0, VOCAB, (MICRO_ROWS, SEQ), generator=g)
    lengths = torch.randint(1, SEQ + 1, (MICRO_ROWS,), generator=g)
    labels = ids.roll(-1, dims=1)
    labels[torch.arange(SEQ)[None, :] >= lengths[:, None] - 1] = -100
    labels[0, :SEQ - 1] = ids[0, 1:]  # at least one full row
    return ids, labels


def decay_groups(model: nn.Module) -> list[dict]:
    named = list(model.named_parameters())
    no_decay = lambda n: "bias" in n or "LayerNorm" in n  # noqa: E731
    return [{"params": [p for n, p in named if not no_decay(n)], "weight_decay": WD},
            {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}]


def linear_warmup(total: int):
    return lambda s: (s + 1) / WARMUP if s < WARMUP else max(0.0, (total - s) / max(1, total - WARMUP))


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its rows of each micro-batch, no_sync but on the last, the Trainer's normalisation."""
    model = DDP(TokenLM())
    opt = torch.optim.SGD(decay_groups(model), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup(STEPS))
    r = rank()
    for step in range(STEPS):
        batches = [tuple(block(t, r, world_size) for t in micro_batch(step, m)) for m in range(ACCUM)]
        num_items = torch.tensor(float(sum(int(lab.ne(-100).sum()) for _, lab in batches)))
        if bug != "num_items_local":
            tdist.all_reduce(num_items)
        for m, (ids, labels) in enumerate(batches):
            if bug == "zero_grad_per_micro":
                model.zero_grad()
            last = m == ACCUM - 1
            ctx = model.no_sync() if (not last or bug == "no_sync_always") else contextlib.nullcontext()
            with ctx:
                logits = model(ids)
                if bug == "mean_per_micro":
                    loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100) / ACCUM
                else:
                    loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100,
                                           reduction="sum") / num_items
                    if bug not in ("num_items_local", "no_world_mult"):
                        loss = loss * world_size
                loss.backward()
            if bug == "clip_each_micro":
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            if bug == "sched_per_micro" and not last:
                sched.step()
        if bug != "clip_each_micro":
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        sched.step()
        model.zero_grad()


def reference(world_size: int) -> None:
    """One device: all rows of a step's micro-batches in one batch, the token mean over them."""
    model = TokenLM()
    opt = torch.optim.SGD(decay_groups(model), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup(STEPS))
    for step in range(STEPS):
        parts = [micro_batch(step, m) for m in range(ACCUM)]
        ids = torch.cat([p[0] for p in parts])
        labels = torch.cat([p[1] for p in parts])
        loss = F.cross_entropy(model(ids).reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        sched.step()
        model.zero_grad()
