"""A tiny GPT-2 (built from a config) fine-tuned with the transformers ``Trainer`` under DDP on CPU,
with gradient accumulation and a linear warm-up schedule.

Follows the transformers docs: "Trainer" (``TrainingArguments(output_dir, per_device_train_batch_size,
gradient_accumulation_steps, learning_rate, lr_scheduler_type="linear", warmup_steps, max_steps,
weight_decay, optim, seed, ...)``, ``Trainer(model=model, args=args, train_dataset=...)``,
``trainer.train()``; subclassing ``Trainer.compute_loss``; ``TrainerCallback`` with
``state.is_world_process_zero``), "Causal language modeling" (``labels`` = the input ids; the model
shifts them; the first position, never a target, is -100 so that the Trainer's count of label tokens
is the count the loss averages over) and "Distributed training" (``torchrun``: the Trainer puts each process on its own shard
of every batch and the loss is averaged across processes); the model is built from a config as the
"Create a custom architecture" page does (``GPT2Config(...)``, ``GPT2LMHeadModel(config)``; no
download). The group is already up, so the Trainer finds the torchrun variables and joins it.
``optim="sgd"`` and no gradient clipping keep a gradient-scale error visible (AdamW normalises it).
A step is one ``optimizer.step()``: five steps of two micro-batches, the first with lr 0 (the warm-up
starts at 0), which the plugin does not count: ``STEPS = 4``.
"""
from __future__ import annotations

import tempfile

import torch

from .common import rank, tokens, torchrun_env

SEED, ROWS, LENGTH, VOCAB, BATCH, LR, WD = 7, 48, 8, 32, 2, 0.5, 0.01
STEPS = 4  # steps that train: the warm-up's first step has lr 0 and the plugin does not count it
TOTAL = STEPS + 1  # optimizer steps taken (max_steps)
WARMUP = 2
CORRECT = {"default": (2, 4), "noaccum": (2,)}
BUGS = {
    "seed_per_rank": "TrainingArguments(seed=SEED + rank): each process shuffles the data with its own seed",
    "lr_scaled_world": "learning_rate multiplied by the world size (linear scaling on top of the same global batch)",
    "per_device_global": "per_device_train_batch_size given the global batch: each step trains W x the rows",
    "custom_loss_ignores_num_items": "a compute_loss override returning the model's mean loss, ignoring num_items_in_batch",
    "callback_lr_rank0": "a TrainerCallback decaying the lr at each step end only under state.is_world_process_zero",
}


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def examples() -> list[dict]:
    ids = tokens(11, ROWS, LENGTH, VOCAB)
    labels = ids.clone()
    labels[:, 0] = -100  # never a target (the model shifts the labels): the Trainer's token count is the loss's
    return [{"input_ids": row, "labels": lab} for row, lab in zip(ids, labels)]


def accum(variant: str | None) -> int:
    return 1 if variant == "noaccum" else 2


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: Trainer(model, TrainingArguments(...), train_dataset).train()."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class MeanLossTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    class DecayOnMain(TrainerCallback):
        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            if state.is_world_process_zero:
                for group in optimizer.param_groups:
                    group["lr"] *= 0.5

    torchrun_env()
    torch.manual_seed(SEED)
    model = gpt2()
    k = accum(variant)
    batch = BATCH * 2 // k * (world_size if bug == "per_device_global" else 1)
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="ho4_hf_"), per_device_train_batch_size=batch,
        gradient_accumulation_steps=k, learning_rate=LR * world_size if bug == "lr_scaled_world" else LR,
        lr_scheduler_type="linear", warmup_steps=WARMUP, max_steps=TOTAL, weight_decay=WD, optim="sgd",
        max_grad_norm=0.0, seed=SEED + rank() if bug == "seed_per_rank" else SEED, use_cpu=True,
        ddp_backend="gloo", report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0)
    cls = MeanLossTrainer if bug == "custom_loss_ignores_num_items" else Trainer
    callbacks = [DecayOnMain()] if bug == "callback_lr_rank0" else []
    cls(model=model, args=args, train_dataset=examples(), callbacks=callbacks).train()


def reference(world_size: int) -> None:
    """One device: the Trainer's optimizer (SGD, weight decay off for biases and LayerNorms), its linear
    warm-up schedule and its shuffle (a RandomSampler seeded with seed + epoch), the global batch,
    the same accumulation, in a plain loop."""
    from transformers import Trainer, get_scheduler

    torch.manual_seed(SEED)
    model = gpt2()
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": WD},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    optimizer = torch.optim.SGD(groups, lr=LR)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    data = examples()
    steps, epoch = 0, 0
    model.train()
    while steps < TOTAL:
        order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()
        epoch += 1
        for i in range(0, ROWS // (BATCH * world_size)):
            rows = order[i * BATCH * world_size:(i + 1) * BATCH * world_size]
            ids = torch.stack([data[j]["input_ids"] for j in rows])
            labels = torch.stack([data[j]["labels"] for j in rows])
            (model(input_ids=ids, labels=labels).loss / 2).backward()
            if i % 2 == 1:
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                steps += 1
                if steps == TOTAL:
                    return
