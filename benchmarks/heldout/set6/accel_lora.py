"""accelerate + peft: LoRA adapters (``q_proj``, ``v_proj``) on a tiny Llama built from a config (no
download), trained with ``Accelerator(gradient_accumulation_steps=2)`` and a linear warm-up schedule.
As accelerate's examples do, the schedule's lengths are computed from ``len(train_dataloader)``
BEFORE ``prepare`` (the whole loader, in batches of the per-process batch size) and divided by the
accumulation, and the scheduler is passed to ``prepare``: the ``AcceleratedScheduler`` then steps it
``num_processes`` times per update (``split_batches=False``), so the lr at update u is the one-device
run's at update u. Each process takes every W-th batch of the prepared loader (its rows of the global
batch); ``with accelerator.accumulate(model)``, ``accelerator.backward(loss)`` (the loss divided by the
accumulation), ``optimizer.step()`` / ``scheduler.step()`` / ``optimizer.zero_grad()`` every batch (no-ops
until the update). The optimizer is built over the PEFT model's trainable parameters. SGD with momentum.
The labels are the input ids: the model shifts them.

Follows huggingface/accelerate ``examples/nlp_example.py`` and ``examples/by_feature/
gradient_accumulation.py`` (``get_linear_schedule_with_warmup(..., num_training_steps=(len(
train_dataloader) * num_epochs) // gradient_accumulation_steps)`` before ``prepare``),
``src/accelerate/scheduler.py`` (``AcceleratedScheduler.step``: ``num_processes`` steps unless
``split_batches``), the accelerate docs "Comparing performance across distributed setups"; huggingface/
peft ``examples/causal_language_modeling/peft_lora_clm_accelerate_ds_zero3_offload.py`` (``get_peft_model``
then the optimizer over ``model.parameters()``, the scheduler prepared) and transformers
``modeling_llama.py`` / ``loss_utils.py`` (``ForCausalLMLoss`` shifts the labels).
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from .common import gen, torchrun_env

VOCAB, LENGTH, BATCH, ACC, UPDATES_PER_EPOCH_REF = 32, 8, 2, 2, 8
LR, MOMENTUM, SEED = 0.5, 0.9, 61
STEPS = 5  # optimizer steps that train: the loop takes UPDATES, the first at the warm-up's lr 0
UPDATES = STEPS + 1
CORRECT = {"default": (2, 4)}
BUGS = {
    "sched_len_after_prepare": "the schedule's lengths computed from len(dataloader) AFTER prepare (per process): W x too short",
    "sched_not_prepared": "the scheduler kept out of prepare() and stepped once per update (under sync_gradients)",
    "loader_not_prepared": "the DataLoader not passed to prepare(): every process reads the same batches",
    "backward_not_accelerator": "loss.backward() instead of accelerator.backward(loss): the loss is not divided by the accumulation",
    "optimizer_before_peft": "the optimizer built over the base model's parameters before get_peft_model (frozen; no adapters)",
    "labels_shifted_twice": "inputs ids[:, :-1] and labels ids[:, 1:] given to a model that shifts the labels again",
}


def model_and_base():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    base = LlamaForCausalLM(cfg)
    lora = LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    return base, lambda: get_peft_model(base, lora)


def data(w: int) -> TensorDataset:
    rows = UPDATES_PER_EPOCH_REF * ACC * BATCH * w
    return TensorDataset(torch.randint(0, VOCAB, (rows, LENGTH), generator=gen(1300)))


def lengths(loader_len: int) -> tuple[int, int]:
    """(warm-up, total) in updates from a loader's length in batches, as the examples compute them."""
    total = loader_len // ACC
    return total // 4, total


def loss_of(model, ids: torch.Tensor, bug: str | None) -> torch.Tensor:
    if bug == "labels_shifted_twice":
        return model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss
    return model(input_ids=ids, labels=ids).loss


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the accelerate loop."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import set_seed
    from transformers import get_linear_schedule_with_warmup

    torchrun_env()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACC)
    set_seed(SEED)
    base, peft = model_and_base()
    if bug == "optimizer_before_peft":
        opt = torch.optim.SGD(base.parameters(), lr=LR, momentum=MOMENTUM)
        model = peft()
    else:
        model = peft()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)
    loader = DataLoader(data(world_size), batch_size=BATCH, shuffle=False)
    if bug != "sched_len_after_prepare":
        warm, total = lengths(len(loader))
    if bug == "loader_not_prepared":
        model, opt = accelerator.prepare(model, opt)
    else:
        model, opt, loader = accelerator.prepare(model, opt, loader)
    if bug == "sched_len_after_prepare":
        warm, total = lengths(len(loader))
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=warm, num_training_steps=total)
    if bug != "sched_not_prepared":
        sched = accelerator.prepare(sched)
    model.train()
    for i, (ids,) in enumerate(loader):
        if i == UPDATES * ACC:
            break
        with accelerator.accumulate(model):
            loss = loss_of(model, ids, bug)
            if bug == "backward_not_accelerator":
                loss.backward()
            else:
                accelerator.backward(loss)
            opt.step()
            if bug != "sched_not_prepared":
                sched.step()
            elif accelerator.sync_gradients:
                sched.step()
            opt.zero_grad()


def reference(world_size: int) -> None:
    """One device: batches of BATCH x W rows, the same accumulation, the schedule in updates."""
    from accelerate.utils import set_seed
    from transformers import get_linear_schedule_with_warmup

    set_seed(SEED)
    _, peft = model_and_base()
    model = peft()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)
    loader = DataLoader(data(world_size), batch_size=BATCH * world_size, shuffle=False)
    warm, total = lengths(len(loader))
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=warm, num_training_steps=total)
    model.train()
    for i, (ids,) in enumerate(loader):
        if i == UPDATES * ACC:
            break
        (loss_of(model, ids, None) / ACC).backward()
        if (i + 1) % ACC == 0:
            opt.step()
            sched.step()
            opt.zero_grad()
