"""A causal-LM fine-tuning loop in the style of transformers' ``run_clm_no_trainer.py`` under DDP: a tiny
``GPT2LMHeadModel`` built from a ``GPT2Config`` (dropouts 0), right-padded sequences with an
``attention_mask`` and ``labels`` equal to the input ids with the padding set to -100 (the model shifts
the labels itself), AdamW (``eps=1e-5``: the key bias's gradient is zero up to roundoff, and with
``eps=1e-8`` Adam turned that roundoff into steps, 2e-4 off in the correct run) with the no-decay group
(biases and the ``ln_*`` weights), gradient accumulation
over 2 micro-batches with ``model.no_sync()`` on the first and ``loss / accum_steps``, ``clip_grad_norm_``,
and ``get_polynomial_decay_schedule_with_warmup(num_warmup_steps, num_training_steps, lr_end, power=2)``
with ``num_training_steps = ceil(len(train_dataloader) / accum_steps) * epochs`` computed from the
rank's (sharded) dataloader, stepped once per update. The rank's data come from a ``DistributedSampler``
(no shuffle). The lengths are set so that every rank's micro-batch holds the same number of label tokens,
so that the mean of the ranks' token means is the global token mean.

The one-device reference: each global micro-batch is the ranks' micro-batches concatenated in rank
order, the same accumulation, optimizer and schedule (its total the same number of updates).

Follows huggingface/transformers ``examples/pytorch/language-modeling/run_clm_no_trainer.py`` (the
``no_decay`` groups, ``num_update_steps_per_epoch = math.ceil(len(train_dataloader) /
args.gradient_accumulation_steps)`` recomputed after ``prepare``, ``lr_scheduler.step()`` after
``optimizer.step()``), ``src/transformers/optimization.py`` (``get_polynomial_decay_schedule_with_warmup``),
``models/gpt2/modeling_gpt2.py`` (``GPT2LMHeadModel``: ``shift_logits`` / ``shift_labels``, ignore index
-100), ``data/data_collator.py`` (``DataCollatorForLanguageModeling(mlm=False)``: padding labels -100) and
the PyTorch DDP docs (``no_sync``, ``DistributedSampler``).
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .common import gen, rank

V, S, B, ACC, SEED = 40, 12, 2, 2, 2006
LR, WD, WARM, LR_END, MAX_NORM = 3e-3, 0.01, 2, 1e-4, 1.0
UPDATES = 6
STEPS = UPDATES
CORRECT = {"default": (2, 4)}
BUGS = {
    "pad_labels_not_masked": "the labels are the raw input ids, padding included (pad positions not set to -100): the loss also trains the model to predict the pad token",
    "labels_shifted_twice": "the labels are shifted by hand (labels = input_ids[:, 1:]) before the model, which shifts them again: every position is trained to predict the token two ahead",
    "clip_every_micro": "clip_grad_norm_ is called after every micro-batch's backward: the first micro-batch's partial (and, under no_sync, local) gradient is clipped before the rest is accumulated onto it",
    "scheduler_stepped_per_micro": "lr_scheduler.step() is called after every micro-batch instead of once per optimizer update: warm-up and decay run accum_steps times too fast",
    "missing_distributed_sampler": "the dataloader has no DistributedSampler: every rank iterates the whole dataset from the start, so all ranks train on the same rows and the other half of each global batch is never seen",
    "total_steps_from_unsharded_loader": "num_training_steps is computed from the dataloader before it is sharded across ranks: the schedule's length is W times too long",
    "sync_on_first_micro": "the no_sync condition is inverted: the first micro-batch's backward all-reduces and the last micro-batch's gradients stay local, so the accumulated gradients are not averaged",
}


def make_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=V, n_positions=S, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    torch.manual_seed(SEED)
    return GPT2LMHeadModel(cfg)


def dataset(w: int) -> TensorDataset:
    """Rows in blocks of 2W: row c and row W + c of a block have lengths l and S + 3 - l, so each rank's
    micro-batch (two consecutive rows of its DistributedSampler shard) holds S + 1 label tokens."""
    n = UPDATES * ACC * B * w
    g = gen(SEED)
    ids = torch.zeros(n, S, dtype=torch.long)
    lengths = torch.zeros(n, dtype=torch.long)
    for blk in range(n // (2 * w)):
        for c in range(w):
            ln = int(torch.randint(3, S + 1, (1,), generator=g))
            lengths[blk * 2 * w + c], lengths[blk * 2 * w + w + c] = ln, S + 3 - ln
    for i in range(n):
        start = int(torch.randint(2, V, (1,), generator=g))
        step = int(torch.randint(1, 4, (1,), generator=g))
        row = (start + step * torch.arange(S)) % (V - 2) + 2
        ids[i, :lengths[i]] = row[:lengths[i]]
    mask = (torch.arange(S)[None] < lengths[:, None]).long()
    return TensorDataset(ids, mask)


def groups(model):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if n.endswith("bias") or ".ln_" in n or n.startswith("transformer.ln_f") else decay).append(p)
    return [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]


def make_opt(model, total):
    from transformers import get_polynomial_decay_schedule_with_warmup

    opt = torch.optim.AdamW(groups(model), lr=LR, eps=1e-5)
    sched = get_polynomial_decay_schedule_with_warmup(opt, num_warmup_steps=WARM, num_training_steps=total,
                                                      lr_end=LR_END, power=2.0)
    return opt, sched


def labels_of(ids, mask, bug=None):
    if bug == "pad_labels_not_masked":
        return ids.clone()
    labels = ids.masked_fill(mask == 0, -100)
    if bug == "labels_shifted_twice":
        labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)
    return labels


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP GPT-2, its DistributedSampler shard, accumulation with no_sync."""
    r, w = rank(), world_size
    net = make_model()
    model = DDP(net)
    ds = dataset(w)
    if bug == "missing_distributed_sampler":
        loader = DataLoader(ds, batch_size=B, shuffle=False)
    else:
        loader = DataLoader(ds, batch_size=B, sampler=DistributedSampler(ds, num_replicas=w, rank=r, shuffle=False))
    n_loader = len(DataLoader(ds, batch_size=B)) if bug == "total_steps_from_unsharded_loader" else len(loader)
    per_epoch = math.ceil(n_loader / ACC)
    opt, sched = make_opt(net, per_epoch * 1)
    model.train()
    completed = 0
    for micro, (ids, mask) in enumerate(loader):
        last = (micro + 1) % ACC == 0
        sync = (not last) if bug == "sync_on_first_micro" else last
        with (nullcontext() if sync else model.no_sync()):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels_of(ids, mask, bug)).loss / ACC
            loss.backward()
        if bug == "scheduler_stepped_per_micro":
            sched.step()
        if bug == "clip_every_micro" and not last:
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        if not last:
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        if bug != "scheduler_stepped_per_micro":
            sched.step()
        opt.zero_grad()
        completed += 1
        if completed == UPDATES:
            break


def reference(world_size: int) -> None:
    """One device: the ranks' micro-batches concatenated in rank order."""
    w = world_size
    model = make_model()
    ds = dataset(w)
    loaders = [DataLoader(ds, batch_size=B, sampler=DistributedSampler(ds, num_replicas=w, rank=r, shuffle=False))
               for r in range(w)]
    opt, sched = make_opt(model, math.ceil(len(loaders[0]) / ACC))
    model.train()
    for micro, parts in enumerate(zip(*loaders)):
        ids, mask = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        (model(input_ids=ids, attention_mask=mask, labels=labels_of(ids, mask)).loss / ACC).backward()
        if (micro + 1) % ACC:
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        sched.step()
        opt.zero_grad()
