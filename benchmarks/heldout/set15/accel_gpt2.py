"""accelerate + transformers: a tiny ``GPT2LMHeadModel`` built from a ``GPT2Config`` (no download,
dropout 0, the LM head tied to ``wte``), trained with ``Accelerator(gradient_accumulation_steps=2)``:
``with accelerator.accumulate(model)``, ``accelerator.backward(loss)``, ``accelerator.clip_grad_norm_``
only when ``accelerator.sync_gradients``, then ``optimizer.step()`` / ``lr_scheduler.step()`` /
``optimizer.zero_grad()`` every batch (no-ops until the update). AdamW (eps 1e-4: the key bias's gradient
is zero up to roundoff, which a smaller eps turns into full steps) with two groups (weight decay off for
biases and the LayerNorm weights, found by module type as the transformers Trainer does), and
``get_linear_schedule_with_warmup`` whose lengths come from ``len(train_dataloader)`` before ``prepare``
divided by the accumulation; the scheduler is prepared (the ``AcceleratedScheduler`` steps it
``num_processes`` times per update, so the lr at update u is the one-device run's). The prepared loader
gives each process every W-th batch: its rows of the global batch. The labels are the input ids (the
model shifts them).

The one-device reference: batches of BATCH x W rows, the same accumulation (loss / 2), the clip and the
schedule in updates.

Follows huggingface/transformers ``examples/pytorch/language-modeling/run_clm_no_trainer.py``
(``optimizer_grouped_parameters``, ``get_scheduler`` with ``num_warmup_steps``, ``accelerator.
accumulate``), ``trainer_pt_utils.get_parameter_names`` / ``Trainer.get_decay_parameter_names``
(LayerNorm weights by type), huggingface/accelerate ``examples/by_feature/gradient_accumulation.py``
and the accelerate docs "Gradient accumulation" (``clip_grad_norm_`` under ``sync_gradients``), and
``src/accelerate/scheduler.py`` (``AcceleratedScheduler.step``).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from .common import gen, torchrun_env

VOCAB, LENGTH, BATCH, ACC, UPDATES_PER_EPOCH_REF = 32, 8, 2, 2, 8
LR, WD, MAX_NORM, EPS, SEED = 0.05, 0.1, 0.5, 1e-4, 181
UPDATES = 6
STEPS = UPDATES
CORRECT = {"default": (2, 4)}
BUGS = {
    "clip_every_micro": "accelerator.clip_grad_norm_ is called after every micro-batch's backward (not only when sync_gradients): the first micro-batch's local gradient is clipped",
    "no_accumulate_ctx": "the loop forgets `with accelerator.accumulate(model)`: the optimizer and scheduler step after every micro-batch",
    "warmup_in_micro_steps": "the schedule's lengths are len(dataloader) without dividing by the accumulation steps: warm-up and decay counted in micro-batches",
    "zero_grad_before_backward": "optimizer.zero_grad() is called at the top of the accumulate block: on the syncing micro-batch it wipes the accumulated gradient",
    "split_batches_true": "DataLoaderConfiguration(split_batches=True) with the per-process batch size: each process gets half of a batch, the global batch shrinks by W",
    "no_decay_by_name": "the no-decay group is chosen by the names ['bias', 'layer_norm.weight']: GPT-2's ln_1/ln_2/ln_f weights get weight decay",
    "loader_not_prepared": "the DataLoader is not passed to prepare(): every process reads the same batches",
}


def make_model():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(SEED)
    return GPT2LMHeadModel(cfg)


def groups(model, bug=None):
    if bug == "no_decay_by_name":
        no_decay = ["bias", "layer_norm.weight"]
        decay = {n for n, _ in model.named_parameters() if not any(nd in n for nd in no_decay)}
    else:
        norms = {f"{m}.weight" for m, mod in model.named_modules() if isinstance(mod, nn.LayerNorm)}
        decay = {n for n, _ in model.named_parameters() if n not in norms and not n.endswith("bias")}
    ps = list(model.named_parameters())
    return [{"params": [p for n, p in ps if n in decay], "weight_decay": WD},
            {"params": [p for n, p in ps if n not in decay], "weight_decay": 0.0}]


def data(w: int) -> TensorDataset:
    rows = UPDATES_PER_EPOCH_REF * ACC * BATCH * w
    g = gen(SEED)
    start = torch.randint(0, VOCAB, (rows, 1), generator=g)
    step = torch.randint(1, 4, (rows, 1), generator=g)
    ids = (start + step * torch.arange(LENGTH)) % VOCAB   # learnable arithmetic sequences
    flip = torch.rand(rows, LENGTH, generator=g) < 0.1
    return TensorDataset(torch.where(flip, torch.randint(0, VOCAB, (rows, LENGTH), generator=g), ids))


def lengths(loader_len: int, bug=None) -> tuple[int, int]:
    total = loader_len if bug == "warmup_in_micro_steps" else loader_len // ACC
    return total // 4, total


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the accelerate loop."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from transformers import get_linear_schedule_with_warmup

    torchrun_env()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    from accelerate import DataLoaderConfiguration
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACC,
                              dataloader_config=DataLoaderConfiguration(split_batches=bug == "split_batches_true"))
    model = make_model()
    opt = torch.optim.AdamW(groups(model, bug), lr=LR, eps=EPS)
    loader = DataLoader(data(world_size), batch_size=BATCH, shuffle=False)
    warm, total = lengths(len(loader), bug)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=warm, num_training_steps=total)
    if bug == "loader_not_prepared":
        model, opt, sched = accelerator.prepare(model, opt, sched)
    else:
        model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    model.train()
    done = 0
    for ids, in loader:
        if done == UPDATES:
            break
        with (accelerator.accumulate(model) if bug != "no_accumulate_ctx" else torch.enable_grad()):
            if bug == "zero_grad_before_backward":
                opt.zero_grad()
            loss = model(input_ids=ids, labels=ids).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients or bug == "clip_every_micro":
                accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
            sched.step()
            opt.zero_grad()
            done += int(accelerator.sync_gradients)


def reference(world_size: int) -> None:
    """One device: batches of BATCH x W rows, the same accumulation, clip and schedule in updates."""
    from transformers import get_linear_schedule_with_warmup

    model = make_model()
    opt = torch.optim.AdamW(groups(model), lr=LR, eps=EPS)
    loader = DataLoader(data(world_size), batch_size=BATCH * world_size, shuffle=False)
    warm, total = lengths(len(loader))
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=warm, num_training_steps=total)
    model.train()
    for i, (ids,) in enumerate(loader):
        if i == UPDATES * ACC:
            break
        (model(input_ids=ids, labels=ids).loss / ACC).backward()
        if (i + 1) % ACC == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
            sched.step()
            opt.zero_grad()
