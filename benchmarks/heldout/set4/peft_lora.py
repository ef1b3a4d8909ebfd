"""A LoRA adapter (peft) on a tiny BERT sequence classifier (built from a config) under DDP, with
gradient accumulation through ``no_sync``, a cosine schedule and a validation pass every few steps.

Follows the peft docs: "Quicktour" / "LoRA" (``LoraConfig(task_type=TaskType.SEQ_CLS, r=...,
lora_alpha=..., lora_dropout=..., target_modules=["query", "value"])``, ``model =
get_peft_model(model, config)``, ``model.print_trainable_parameters()``; the SEQ_CLS task type keeps
the classifier head trainable; ``merge_adapter`` / ``unmerge_adapter`` for inference), the transformers
"Create a custom architecture" page (``BertConfig(...)``, ``BertForSequenceClassification(config)``,
no download), ``get_cosine_schedule_with_warmup``, and the PyTorch DDP docs (``DDP(model)``,
``find_unused_parameters=True``, ``DistributedSampler`` with ``set_epoch``, ``with model.no_sync():`` for every micro-batch but the
last of an accumulation window). A step is one ``optimizer.step()``: five steps of two micro-batches,
across an epoch boundary, validation after every second.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .common import tokens

SEED, ROWS, LENGTH, VOCAB, LABELS, BATCH, LR, ACCUM = 23, 48, 8, 32, 3, 4, 2e-2, 2
STEPS = 5
VAL_EVERY = 2
CORRECT = {"default": (2, 4)}
BUGS = {
    "no_task_type": "LoraConfig without task_type: the classifier head stays frozen at its random init",
    "no_dist_sampler": "DataLoader(shuffle=True) without DistributedSampler: every rank reads the same rows",
    "no_sync_last": "model.no_sync() around the last micro-batch instead of the first: a local gradient added after the sync",
    "merged_after_eval": "validation calls merge_adapter() and never unmerge_adapter(): LoRA gets no gradient afterwards",
    "sched_per_micro": "scheduler.step() every micro-batch: the cosine schedule advances twice per optimizer step",
    "zero_grad_every_micro": "optimizer.zero_grad() before every backward: the first micro-batch of each step dropped",
}


def peft_bert(task_type: bool = True):
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, num_labels=LABELS)
    model = BertForSequenceClassification(config)
    lora = LoraConfig(task_type=TaskType.SEQ_CLS if task_type else None, r=4, lora_alpha=8, lora_dropout=0.0,
                      target_modules=["query", "value"])
    return get_peft_model(model, lora)


def data(seed: int, n: int) -> TensorDataset:
    ids = tokens(seed, n, LENGTH, VOCAB)
    return TensorDataset(ids, ids[:, :3].sum(1) % LABELS)


def cosine(optimizer):
    from transformers import get_cosine_schedule_with_warmup

    return get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=2 * STEPS)


def validate(model, loader) -> None:
    model.eval()
    with torch.no_grad():
        for ids, y in loader:
            nn.functional.cross_entropy(model(input_ids=ids).logits, y)
    model.train()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: get_peft_model, DDP, AdamW over the trainable parameters, accumulation with no_sync."""
    torch.manual_seed(SEED)
    # find_unused_parameters=True, as DDP's error message asks once some adapter gets no gradient
    model = DDP(peft_bert(task_type=bug != "no_task_type"), find_unused_parameters=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    scheduler = cosine(optimizer)
    ds, val = data(3, ROWS), data(4, 8)
    if bug == "no_dist_sampler":
        sampler, loader = None, DataLoader(ds, batch_size=BATCH, shuffle=True)
    else:
        sampler = DistributedSampler(ds, shuffle=True, seed=SEED)
        loader = DataLoader(ds, batch_size=BATCH, sampler=sampler)
    val_loader = DataLoader(val, batch_size=BATCH)
    steps, micro, epoch = 0, 0, 0
    model.train()
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        epoch += 1
        for ids, y in loader:
            micro += 1
            last = micro % ACCUM == 0
            skip_sync = last if bug == "no_sync_last" else not last
            if bug == "zero_grad_every_micro":
                optimizer.zero_grad()
            with model.no_sync() if skip_sync else contextlib.nullcontext():
                loss = nn.functional.cross_entropy(model(input_ids=ids).logits, y)
                (loss / ACCUM).backward()
            if bug == "sched_per_micro":
                scheduler.step()
            if not last:
                continue
            optimizer.step()
            if bug != "sched_per_micro":
                scheduler.step()
            optimizer.zero_grad()
            steps += 1
            if steps == STEPS:
                return
            if steps % VAL_EVERY == 0:
                if bug == "merged_after_eval":
                    model.module.merge_adapter()
                validate(model, val_loader)


def reference(world_size: int) -> None:
    """One device: the same adapter, the global micro-batch in the ranks' order, the same accumulation."""
    torch.manual_seed(SEED)
    model = peft_bert()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    scheduler = cosine(optimizer)
    ds = data(3, ROWS)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=SEED)
    loader = DataLoader(ds, batch_size=BATCH * world_size, sampler=sampler)
    steps, micro, epoch = 0, 0, 0
    while True:
        sampler.set_epoch(epoch)
        epoch += 1
        for ids, y in loader:
            micro += 1
            (nn.functional.cross_entropy(model(input_ids=ids).logits, y) / ACCUM).backward()
            if micro % ACCUM:
                continue
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            steps += 1
            if steps == STEPS:
                return
