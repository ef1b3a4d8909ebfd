"""A tiny ``transformers`` ``T5ForConditionalGeneration`` built from a ``T5Config`` (one encoder and one
decoder layer, d_model 16, no dropout) under DDP: right-padded source ids with their attention mask,
targets padded with -100, decoder inputs made by the model's own ``_shift_right`` (``labels=`` passed to
the forward), AdamW with a no-decay group for the layer norms, ``get_linear_schedule_with_warmup`` (2
warm-up steps over ``STEPS``) stepped after every update. The token-level cross entropy is normalised by
the global number of target tokens: each rank sums its tokens' losses (``ignore_index=-100``), the count
of non-ignored targets is all-reduced, and the rank's loss is ``sum * world / global_count`` (DDP averages
the gradients), so the update is that of the one-device mean over all target tokens. Every random draw
(source and target ids and lengths) is made for the global batch by a generator seeded per step; each
rank keeps its rows. The reference uses ``model(..., labels=...).loss`` over the global batch.

Follows huggingface/transformers ``models/t5/modeling_t5.py`` (``T5ForConditionalGeneration.forward``:
``decoder_input_ids = self._shift_right(labels)``, ``CrossEntropyLoss(ignore_index=-100)``),
``examples/pytorch/summarization/run_summarization_no_trainer.py`` (labels' pad ids replaced by -100,
``DataCollatorForSeq2Seq(label_pad_token_id=-100)``, the ``no_decay`` parameter groups,
``get_scheduler("linear", num_warmup_steps, num_training_steps = max_train_steps)`` with
``max_train_steps`` from the per-process dataloader length), ``optimization.py``
(``get_linear_schedule_with_warmup``), and the token-count normalisation across processes of
``Trainer`` (``num_items_in_batch`` gathered over processes).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce_sum, gen, rank

GB, V, LS, LT, SEED = 8, 32, 7, 6, 1702
LR, WD = 2e-2, 0.1
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "loss_mean_per_rank": "each rank uses the model's own loss (the mean over its local target tokens): ranks with fewer target tokens weigh each token more than the global token mean",
    "labels_padded_with_pad_id": "the targets are padded with the pad id 0 instead of -100: the padding positions are trained on (and counted)",
    "decoder_inputs_not_shifted": "decoder_input_ids are the labels themselves (pads for -100) instead of the right-shifted labels: the decoder sees the token it must predict",
    "no_attention_mask": "the encoder's attention_mask is not passed: the source padding is attended to",
    "attention_mask_inverted": "the attention mask is built as input_ids == pad (1 on padding) instead of 1 on real tokens",
    "schedule_total_from_global_samples": "num_training_steps of the linear schedule is computed from the global number of samples per rank batch (world times too many steps): the lr decays too slowly",
    "decay_on_layer_norm": "the no-decay group is missing: weight decay is applied to the layer-norm weights too",
}


def make_model():
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(SEED)
    cfg = T5Config(vocab_size=V, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                   pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, tie_word_embeddings=True)
    return T5ForConditionalGeneration(cfg)


def batch(step: int, label_pad: int = -100):
    g = gen(SEED + step)
    src = torch.randint(2, V, (GB, LS), generator=g)
    tgt = torch.randint(2, V, (GB, LT), generator=g)
    ls = torch.randint(2, LS + 1, (GB,), generator=g)
    lt = torch.randint(1, LT + 1, (GB,), generator=g)
    amask = (torch.arange(LS)[None] < ls[:, None]).long()
    src = src * amask
    tmask = torch.arange(LT)[None] < lt[:, None]
    tgt = torch.where(tmask, tgt, torch.full_like(tgt, label_pad))
    return src, amask, tgt


def make_opt(model, bug=None):
    if bug == "decay_on_layer_norm":
        groups = [{"params": list(model.parameters()), "weight_decay": WD}]
    else:
        nd = [p for n, p in model.named_parameters() if "layer_norm" in n]
        dec = [p for n, p in model.named_parameters() if "layer_norm" not in n]
        groups = [{"params": dec, "weight_decay": WD}, {"params": nd, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, eps=1e-6)
    return opt


def make_sched(opt, total):
    from transformers import get_linear_schedule_with_warmup
    return get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=total)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    r, w = rank(), world_size
    model = make_model()
    ddp = DDP(model)
    opt = make_opt(model, bug)
    sched = make_sched(opt, STEPS * w if bug == "schedule_total_from_global_samples" else STEPS)
    lb = GB // w
    for step in range(STEPS):
        src, amask, tgt = (t[r * lb:(r + 1) * lb] for t in batch(step, 0 if bug == "labels_padded_with_pad_id" else -100))
        if bug == "attention_mask_inverted":
            amask = (src == 0).long()
        kw = {} if bug == "no_attention_mask" else {"attention_mask": amask}
        if bug == "decoder_inputs_not_shifted":
            kw["decoder_input_ids"] = tgt.clamp(min=0)
        out = ddp(input_ids=src, labels=tgt, **kw)
        if bug == "loss_mean_per_rank":
            loss = out.loss
        else:
            n = all_reduce_sum(torch.tensor(float((tgt != -100).sum())))
            s = F.cross_entropy(out.logits.reshape(-1, V), tgt.reshape(-1), ignore_index=-100, reduction="sum")
            loss = s * w / n
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def reference(world_size: int) -> None:
    model = make_model()
    opt = make_opt(model)
    sched = make_sched(opt, STEPS)
    for step in range(STEPS):
        src, amask, tgt = batch(step)
        loss = model(input_ids=src, attention_mask=amask, labels=tgt).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
