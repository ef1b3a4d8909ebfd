"""A manual fine-tuning loop on a tiny transformers ``BertForSequenceClassification`` built from a
``BertConfig`` (no hub), wrapped in DDP, with gradient accumulation over 2 micro-batches (``no_sync`` on
the first, the loss divided by the accumulation steps), AdamW with the usual decay / no-decay groups (the key biases frozen: their gradient is
zero up to roundoff)
(``bias`` and ``LayerNorm.weight`` without decay), ``get_cosine_schedule_with_warmup`` stepped once per
optimizer update after ``optimizer.step()``, ``clip_grad_norm_`` once per update, float32. The batch is a
right-padded batch of token ids (pad id 0, lengths drawn per row) with its attention mask from the
lengths; token id 0 is never produced for a real token... except in the ``mask_from_pad_id`` case, where
the data holds real tokens equal to the pad id (a vocabulary whose pad id collides with a real token) and
the mask built from ``input_ids != pad_token_id`` hides them. Every random draw (ids, lengths, labels) is
made for the global batch by a generator seeded per step; each rank keeps its rows, its first half being
the first micro-batch.

The one-device reference runs the global batch in one forward (the mean loss over all rows equals the
mean over the ranks' micro-batch means / accumulation steps), the same AdamW groups, clip and schedule.

Follows huggingface/transformers ``examples/pytorch/text-classification/run_glue_no_trainer.py``
(``no_decay = ["bias", "LayerNorm.weight"]``, ``loss = loss / args.gradient_accumulation_steps``,
``if step % args.gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1``: step, scheduler,
zero_grad), ``optimization.py`` (``get_cosine_schedule_with_warmup``), ``models/bert/modeling_bert.py``
(``BertForSequenceClassification.forward(input_ids, attention_mask, token_type_ids, ...)``, the pooler
on the first token) and the PyTorch DDP ``no_sync`` docs.
"""
from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

V, S, C, GB, ACC, SEED = 40, 8, 3, 16, 2, 1611
LR, WD, MAX_NORM, WARMUP = 3e-3, 0.1, 1.0, 2
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "sched_per_micro": "scheduler.step() is called after every micro-batch instead of every optimizer update: the cosine warm-up/decay runs twice as fast",
    "sched_before_opt_step": "scheduler.step() is called before optimizer.step(): every update uses the next step's learning rate (the warm-up's zero first step is skipped)",
    "mask_from_pad_id": "the attention mask is rebuilt as input_ids != pad_token_id while real tokens share the pad id 0: real tokens are masked out",
    "mask_and_token_types_swapped": "the model is called positionally as model(ids, token_type_ids, attention_mask): the mask goes in as token types and the all-zero token types as the mask",
    "left_padding_cls_pooling": "the batch is padded on the left (a decoder-style padding_side) while BERT pools the first position: the pooled token is padding for short rows",
    "head_reinit_after_ddp": "the classification head is re-initialised (rank-seeded) after the DDP wrap: DDP's initial broadcast is missed, every rank keeps its own head",
    "accum_step_off_by_one": "the update condition is step % ACC == 0 instead of (step + 1) % ACC == 0: the first update uses one micro-batch, later ones straddle two batches",
}


def make_model():
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                     max_position_embeddings=S, num_labels=C, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     pad_token_id=0, attn_implementation="eager")
    torch.manual_seed(SEED)
    model = BertForSequenceClassification(cfg)
    for layer in model.bert.encoder.layer:   # the key bias's gradient is 0 up to roundoff (softmax is shift-invariant)
        layer.attention.self.key.bias.requires_grad_(False)
    return model


def batch(step: int, bug=None):
    """Global batch: right-padded ids (pad 0), the mask from the lengths, labels; ids of real tokens are >= 1,
    except for mask_from_pad_id's data (real zeros present)."""
    g = gen(SEED + step)
    lens = torch.randint(3, S + 1, (GB,), generator=g)
    ids = torch.randint(1, V, (GB, S), generator=g)
    zeros = torch.rand(GB, S, generator=g) < 0.2
    y = torch.randint(0, C, (GB,), generator=g)
    mask = (torch.arange(S)[None] < lens[:, None]).long()
    if bug == "mask_from_pad_id":
        ids = ids.masked_fill(zeros & (torch.arange(S)[None] > 0), 0)
    ids = ids * mask
    if bug == "left_padding_cls_pooling":
        sh = S - lens
        idx = (torch.arange(S)[None] - sh[:, None]) % S
        ids, mask = ids.gather(1, idx), mask.gather(1, idx)
    return ids, mask, y


def groups(model):
    no_decay = ["bias", "LayerNorm.weight"]
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if not any(nd in n for nd in no_decay)], "weight_decay": WD},
            {"params": [p for n, p in named if any(nd in n for nd in no_decay)], "weight_decay": 0.0}]


def opt_sched(model):
    from transformers import get_cosine_schedule_with_warmup
    opt = torch.optim.AdamW(groups(model), lr=LR, eps=1e-4)
    return opt, get_cosine_schedule_with_warmup(opt, num_warmup_steps=WARMUP, num_training_steps=STEPS)


def fwd(model, ids, mask, y, bug=None):
    tt = torch.zeros_like(ids)
    if bug == "mask_from_pad_id":
        mask = (ids != 0).long()
    if bug == "mask_and_token_types_swapped":
        return model(ids, tt, mask, labels=y).loss
    return model(input_ids=ids, attention_mask=mask, token_type_ids=tt, labels=y).loss


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP, its rows of each global batch in 2 micro-batches, no_sync on the first."""
    r, w = rank(), world_size
    model = make_model()
    ddp = DDP(model)
    if bug == "head_reinit_after_ddp":
        torch.manual_seed(SEED + 100 + r)
        model.classifier.reset_parameters()
    opt, sched = opt_sched(model)
    lb, mb = GB // w, GB // w // ACC
    micro = []
    for step in range(STEPS):
        ids, mask, y = batch(step, bug)
        sl = slice(r * lb, (r + 1) * lb)
        micro += [(ids[sl][i * mb:(i + 1) * mb], mask[sl][i * mb:(i + 1) * mb], y[sl][i * mb:(i + 1) * mb])
                  for i in range(ACC)]
    for i, (ids, mask, y) in enumerate(micro):
        last = (i % ACC == 0) if bug == "accum_step_off_by_one" else ((i + 1) % ACC == 0)
        with contextlib.nullcontext() if last else ddp.no_sync():
            loss = fwd(ddp, ids, mask, y, bug) / ACC
            loss.backward()
        if bug == "sched_per_micro":
            sched.step()
        if last:
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), MAX_NORM)
            if bug == "sched_before_opt_step":
                sched.step()
            opt.step()
            if bug not in ("sched_per_micro", "sched_before_opt_step"):
                sched.step()
            opt.zero_grad()
        if bug == "accum_step_off_by_one" and i == len(micro) - 1 and not last:
            break


def reference(world_size: int) -> None:
    """One device: the global batch in one forward, one update per step."""
    model = make_model()
    opt, sched = opt_sched(model)
    for step in range(STEPS):
        ids, mask, y = batch(step)
        fwd(model, ids, mask, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        sched.step()
        opt.zero_grad()
