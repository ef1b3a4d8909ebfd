"""Seq2seq fine-tuning of a tiny T5 (``T5ForConditionalGeneration`` from a ``T5Config``, no download,
dropout 0) under DDP: sources right-padded with an attention mask, labels ending in EOS and padded with
-100 (``DataCollatorForSeq2Seq``'s ``label_pad_token_id``), ``decoder_input_ids`` made by shifting the
labels right (decoder start = pad id 0, -100 replaced by pad), the token cross entropy summed over the
labelled tokens and divided by the global number of labelled tokens (all-reduced) times the world size,
so that DDP's average is the global token mean; AdamW. Ranks hold different numbers of label tokens.
Variant ``model_labels``: ``labels=`` given to the model (its own ``_shift_right`` and mean loss),
rescaled by the rank's token count / the global count x world size.

The one-device reference: the global batch, the global token mean.

Follows huggingface/transformers ``src/transformers/models/t5/modeling_t5.py`` (``_shift_right``,
``T5ForConditionalGeneration.forward``: ``CrossEntropyLoss(ignore_index=-100)``),
``src/transformers/models/bart/modeling_bart.py`` (``shift_tokens_right``),
``src/transformers/data/data_collator.py`` (``DataCollatorForSeq2Seq``: labels padded with -100,
``prepare_decoder_input_ids_from_labels``) and ``src/transformers/trainer.py`` (the loss over
``num_items_in_batch`` gathered across processes).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import T5Config, T5ForConditionalGeneration

from .common import all_reduce, gen, rank

VOCAB, SRC, TGT, N, GB, SEED, PAD, EOS = 24, 8, 6, 32, 8, 59, 0, 1
STEPS = 4   # N / GB
CORRECT = {"default": (2, 4), "model_labels": (2,)}
BUGS = {
    "no_shift": "decoder_input_ids are the labels themselves (not shifted right), so the decoder sees the token it predicts",
    "pad_not_masked": "labels are padded with the pad id 0 instead of -100, so padding positions are trained on and counted",
    "start_token_eos": "the decoder start token is EOS (id 1) instead of T5's pad id 0 when shifting the labels",
    "count_local": "the summed loss is divided by this rank's number of label tokens (a per-rank token mean) instead of the global count",
    "count_includes_pad": "the token count divides by every label position (labels.numel()) instead of the labels != -100",
    "enc_mask_missing": "the encoder attention_mask is not passed, so source padding is attended to",
    "double_shift": "the loss shifts once more (logits[:, :-1] against labels[:, 1:]) on top of the decoder-input shift",
}


def build():
    torch.manual_seed(SEED)
    cfg = T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                   relative_attention_num_buckets=8, dropout_rate=0.0, pad_token_id=PAD, eos_token_id=EOS,
                   decoder_start_token_id=PAD, tie_word_embeddings=True)
    model = T5ForConditionalGeneration(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def data():
    """Source ids padded with 0 and their mask; labels (ending in EOS) padded with -100."""
    g = gen(SEED)
    slen = torch.randint(3, SRC + 1, (N,), generator=g)
    src = torch.randint(2, VOCAB, (N, SRC), generator=g)
    mask = (torch.arange(SRC).view(1, -1) < slen.view(-1, 1)).long()
    src = src * mask
    tlen = torch.randint(1, TGT, (N,), generator=g)
    labels = (src[:, :TGT].flip(1) + 3) % (VOCAB - 2) + 2
    pos = torch.arange(TGT).view(1, -1)
    labels = torch.where(pos < tlen.view(-1, 1), labels, torch.full_like(labels, -100))
    labels = torch.where(pos == tlen.view(-1, 1), torch.full_like(labels, EOS), labels)
    return src, mask, labels


def shift_right(labels, start=PAD):
    out = labels.new_zeros(labels.shape)
    out[:, 1:] = labels[:, :-1].clone()
    out[:, 0] = start
    return out.masked_fill(out == -100, PAD)


def forward_loss(model, src, mask, labels, bug=None):
    """(summed token CE, number of label tokens) of the rows given."""
    if bug == "pad_not_masked":
        labels = labels.masked_fill(labels == -100, PAD)
    if bug == "no_shift":
        dec_in = labels.masked_fill(labels == -100, PAD)
    else:
        dec_in = shift_right(labels, EOS if bug == "start_token_eos" else PAD)
    logits = model(input_ids=src, attention_mask=None if bug == "enc_mask_missing" else mask,
                   decoder_input_ids=dec_in).logits
    if bug == "double_shift":
        logits, labels = logits[:, :-1], labels[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100, reduction="sum")
    count = torch.tensor(float(labels.numel())) if bug == "count_includes_pad" else (labels != -100).sum().float()
    return loss, count


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of pairs, the summed loss over the global token count x world size."""
    r, w = rank(), world_size
    lb = GB // w
    model, opt = build()
    ddp = DDP(model)
    src, mask, labels = data()
    for step in range(STEPS):
        sl = slice(step * GB + r * lb, step * GB + (r + 1) * lb)
        if variant == "model_labels":
            out = ddp(input_ids=src[sl], attention_mask=mask[sl], labels=labels[sl])
            n_local = (labels[sl] != -100).sum().float()
            loss = out.loss * n_local * w / all_reduce(n_local)
        else:
            loss_sum, count = forward_loss(ddp, src[sl], mask[sl], labels[sl], bug)
            total = count if bug == "count_local" else all_reduce(count) / w
            loss = loss_sum / total
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global batch, the global token mean."""
    model, opt = build()
    src, mask, labels = data()
    for step in range(STEPS):
        sl = slice(step * GB, (step + 1) * GB)
        loss_sum, count = forward_loss(model, src[sl], mask[sl], labels[sl])
        loss = loss_sum / count
        opt.zero_grad()
        loss.backward()
        opt.step()
