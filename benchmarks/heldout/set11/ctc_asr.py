"""CTC speech recognition fine-tuning under DDP: padded feature sequences with their lengths, a
SpecAugment-style time mask (one span per utterance, drawn for the global batch and sliced per rank), a
strided conv feature encoder and a linear head, output lengths from the conv arithmetic, labels padded
with -100 (the mask of labels >= 0 gives the target lengths and the flattened targets),
``log_softmax`` then ``(T, B, V)``, ``ctc_loss(blank=0, reduction="mean", zero_infinity=True)`` (each
utterance's loss divided by its target length, then the mean over the rank's utterances: DDP's average
is the global mean; one utterance is too long for its frames and counts zero), AdamW.

The one-device reference: the global batch with the same masks.

Follows huggingface/transformers ``src/transformers/models/wav2vec2/modeling_wav2vec2.py``
(``Wav2Vec2ForCTC.forward``: ``labels_mask = labels >= 0``, ``target_lengths``, ``flattened_targets``,
``log_softmax(...).transpose(0, 1)``, ``ctc_loss(..., blank=pad_token_id, reduction=ctc_loss_reduction,
zero_infinity=ctc_zero_infinity)``; ``_get_feat_extract_output_lengths``; ``_compute_mask_indices``),
its ``examples/pytorch/speech-recognition/run_speech_recognition_ctc.py`` (labels padded with -100,
``ctc_loss_reduction="mean"``), and torch ``nn.CTCLoss``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce, gen, rank

FEAT, L, V, SMAX, N, GB, SEED, SPAN = 6, 16, 6, 4, 32, 8, 47, 2
STEPS = 4   # N / GB
CORRECT = {"default": (2, 4)}
BUGS = {
    "lengths_offset": "every rank slices the input lengths at rank 0's offset (lengths[:local_batch]) instead of its own rows",
    "input_lengths_full": "the input lengths passed to the CTC loss are the padded frame count for every utterance",
    "no_log_softmax": "raw logits are passed to the CTC loss instead of log_softmax outputs",
    "reduction_sum": "ctc_loss reduction 'sum' instead of 'mean' (no division by target length nor by the number of utterances)",
    "blank_last": "the CTC blank index is the last vocabulary id instead of the pad/blank id 0 the labels were built with",
    "out_lengths_floor": "the conv output lengths are computed as length // 2 instead of (length - 1) // 2 + 1 (one frame short for odd lengths)",
    "token_mean_local": "the summed CTC loss is divided by this rank's number of target tokens (a per-rank token mean) instead of the per-utterance mean",
    "specaug_rank_seed": "each rank draws its own time masks (generator seeded with seed + rank) instead of its slice of the global draw",
}


class Acoustic(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(FEAT, 16, 3, stride=2, padding=1)
        self.lm_head = nn.Linear(16, V)

    def forward(self, feats):
        h = F.gelu(self.conv(feats.transpose(1, 2))).transpose(1, 2)
        return self.lm_head(h)


def out_lengths(lengths, bug=None):
    if bug == "out_lengths_floor":
        return lengths // 2
    return torch.div(lengths + 2 * 1 - 3, 2, rounding_mode="floor") + 1


def data():
    """Padded features, lengths and -100-padded labels (tokens 1..V-2); utterance 5 has too few frames."""
    g = gen(SEED)
    lengths = torch.randint(9, L + 1, (N,), generator=g)
    feats = torch.randn(N, L, FEAT, generator=g) * (torch.arange(L).view(1, L) < lengths.view(N, 1)).unsqueeze(-1)
    tlen = torch.randint(1, SMAX + 1, (N,), generator=g)
    labels = torch.randint(1, V - 1, (N, SMAX), generator=g)
    labels = torch.where(torch.arange(SMAX).view(1, -1) < tlen.view(-1, 1), labels, torch.full_like(labels, -100))
    lengths[5], labels[5] = 9, torch.tensor([2, 2, 3, 3])
    return feats, lengths, labels


def time_mask(feats, lengths, step, seed_shift=0):
    """One span of SPAN frames per utterance zeroed, its start drawn for the batch given."""
    g = gen(SEED + 500 + step + seed_shift)
    start = (torch.rand(feats.shape[0], generator=g) * (lengths - SPAN).float()).long()
    pos = torch.arange(L).view(1, L)
    keep = ~((pos >= start.view(-1, 1)) & (pos < start.view(-1, 1) + SPAN))
    return feats * keep.unsqueeze(-1)


def ctc(logits, in_lengths, labels, bug=None):
    log_probs = logits if bug == "no_log_softmax" else F.log_softmax(logits, dim=-1)
    mask = labels >= 0
    tgt_len, flat = mask.sum(-1), labels.masked_select(mask)
    blank = V - 1 if bug == "blank_last" else 0
    red = "sum" if bug in ("reduction_sum", "token_mean_local") else "mean"
    loss = F.ctc_loss(log_probs.transpose(0, 1), flat, in_lengths, tgt_len, blank=blank, reduction=red,
                      zero_infinity=True)
    return loss / tgt_len.sum() if bug == "token_mean_local" else loss


def build():
    torch.manual_seed(SEED)
    model = Acoustic()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of utterances (masks sliced from the global draw), the CTC mean."""
    r, lb = rank(), GB // world_size
    model, opt = build()
    ddp = DDP(model)
    feats, lengths, labels = data()
    for step in range(STEPS):
        g0 = step * GB
        sl = slice(g0 + r * lb, g0 + (r + 1) * lb)
        if bug == "specaug_rank_seed":
            x = time_mask(feats[sl], lengths[sl], step, seed_shift=31 * (r + 1))
        else:
            x = time_mask(feats[g0:g0 + GB], lengths[g0:g0 + GB], step)[r * lb:(r + 1) * lb]
        ln = lengths[g0:g0 + lb] if bug == "lengths_offset" else lengths[sl]
        logits = ddp(x)
        in_len = torch.full((lb,), logits.shape[1]) if bug == "input_lengths_full" else out_lengths(ln, bug)
        loss = ctc(logits, in_len, labels[sl], bug)
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global batch."""
    model, opt = build()
    feats, lengths, labels = data()
    for step in range(STEPS):
        sl = slice(step * GB, (step + 1) * GB)
        logits = model(time_mask(feats[sl], lengths[sl], step))
        loss = ctc(logits, out_lengths(lengths[sl]), labels[sl])
        opt.zero_grad()
        loss.backward()
        opt.step()
