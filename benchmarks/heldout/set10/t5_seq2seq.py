"""Seq2seq fine-tuning of a tiny T5 (``T5ForConditionalGeneration`` from a ``T5Config``, no download,
dropout off) under DDP: source sequences right-padded with an attention mask, labels padded with -100
(``DataCollatorForSeq2Seq``'s ``label_pad_token_id``), ``decoder_input_ids`` made by shifting the labels
right (``_shift_right``: the decoder start token, which is T5's pad token 0, first; -100 replaced by the
pad token), the logits from the model's forward and a token-level cross entropy summed over the labelled
tokens (``ignore_index=-100``) and divided by the global number of labelled tokens (all-reduced), times
the world size so that DDP's average gives the global token mean. AdamW.

The one-device reference runs the same model on the global batch, the loss summed over its labelled
tokens over their number.

Follows huggingface/transformers ``models/t5/modeling_t5.py`` (``T5PreTrainedModel._shift_right``:
``shifted_input_ids[..., 1:] = input_ids[..., :-1].clone(); shifted_input_ids[..., 0] =
decoder_start_token_id; masked_fill_(shifted_input_ids == -100, pad_token_id)``;
``T5ForConditionalGeneration.forward``: ``CrossEntropyLoss(ignore_index=-100)``),
``data/data_collator.py`` (``DataCollatorForSeq2Seq``: labels padded with -100, ``decoder_input_ids``
from ``prepare_decoder_input_ids_from_labels``), ``models/bart/modeling_bart.py`` (``shift_tokens_right``,
BART's decoder start is ``</s>``) and ``trainer.py`` (``num_items_in_batch`` gathered over processes).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce, gen, rank

VOCAB, SRC, TGT, GB, SEED, LR = 24, 7, 6, 4, 59, 3e-3
PAD, EOS = 0, 1
STEPS = 3
CORRECT = {"default": (2, 4)}
BUGS = {
    "labels_pad_not_ignored": "the labels are padded with the pad token (0) instead of -100: padding positions are trained on",
    "decoder_inputs_unshifted": "decoder_input_ids are the labels themselves (pad for -100), not shifted right: the decoder sees the token it predicts",
    "shift_left": "decoder_input_ids shifted the wrong way (labels[:, 1:] then pad): an off-by-two label offset",
    "decoder_start_eos": "decoder_input_ids start with </s> (BART's convention) instead of T5's decoder start (pad, 0)",
    "token_count_local": "the loss is divided by the rank's own number of labelled tokens (the model's default mean), not the global count",
    "count_includes_padding": "the token normaliser is labels.numel() (all positions, -100 padding included), all-reduced",
    "no_attention_mask": "the encoder's attention_mask is not passed: the encoder and cross-attention attend to padding",
}


def build():
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(SEED)
    cfg = T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1,
                   num_heads=2, dropout_rate=0.0, relative_attention_num_buckets=8, pad_token_id=PAD,
                   eos_token_id=EOS, decoder_start_token_id=PAD)
    model = T5ForConditionalGeneration(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


def data():
    """Source ids with their attention mask, and labels padded with -100; lengths differ per row."""
    g = gen(SEED)
    n = STEPS * GB
    src = torch.randint(2, VOCAB, (n, SRC), generator=g)
    src_len = torch.randint(3, SRC + 1, (n,), generator=g)
    tgt_len = torch.randint(2, TGT + 1, (n,), generator=g)
    mask = (torch.arange(SRC) < src_len[:, None]).long()
    src = src * mask + PAD * (1 - mask)
    labels = torch.full((n, TGT), -100, dtype=torch.long)
    for i in range(n):
        k = int(tgt_len[i])
        body = (src[i, :k - 1] + 3) % (VOCAB - 2) + 2   # a learnable mapping of the source
        labels[i, :k] = torch.cat([body, torch.tensor([EOS])])
    return src, mask, labels


def shift_right(labels, start=PAD):
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = start
    return shifted.masked_fill(shifted == -100, PAD)


def decoder_inputs(labels, bug=None):
    if bug == "decoder_inputs_unshifted":
        return labels.masked_fill(labels == -100, PAD)
    if bug == "shift_left":
        out = labels.new_full(labels.shape, PAD)
        out[:, :-1] = labels[:, 1:]
        return out.masked_fill(out == -100, PAD)
    return shift_right(labels, EOS if bug == "decoder_start_eos" else PAD)


def token_ce(logits, labels):
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100, reduction="sum")


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its rows; the summed token loss over the global labelled-token count, times W."""
    r, lb = rank(), GB // world_size
    model, opt = build()
    ddp = DDP(model)
    src, mask, labels = data()
    if bug == "labels_pad_not_ignored":
        labels = labels.masked_fill(labels == -100, PAD)
    for step in range(STEPS):
        rows = slice(step * GB + r * lb, step * GB + (r + 1) * lb)
        y = labels[rows]
        kw = {} if bug == "no_attention_mask" else {"attention_mask": mask[rows]}
        logits = ddp(input_ids=src[rows], decoder_input_ids=decoder_inputs(y, bug), **kw).logits
        count = torch.tensor(float(y.numel() if bug == "count_includes_padding" else (y != -100).sum()))
        if bug == "token_count_local":
            loss = token_ce(logits, y) / count
        else:
            loss = token_ce(logits, y) / all_reduce(count) * world_size
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global batch, the token mean over its labelled tokens."""
    model, opt = build()
    src, mask, labels = data()
    for step in range(STEPS):
        rows = slice(step * GB, (step + 1) * GB)
        y = labels[rows]
        logits = model(input_ids=src[rows], attention_mask=mask[rows], decoder_input_ids=shift_right(y)).logits
        loss = token_ce(logits, y) / (y != -100).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
