"""CTC speech recognition under DDP: padded feature sequences of different lengths, a strided Conv1d
front end (the output length ``(len - 1) // 2 + 1``), a GRU and a linear layer to the vocabulary (blank
0), ``log_softmax`` over the vocabulary, time-major log-probabilities, and ``nn.CTCLoss(blank=0,
reduction="mean", zero_infinity=True)`` with the per-utterance output lengths and target lengths (the
mean over utterances of each loss divided by its target length; one utterance too long for its output
is zeroed). Each rank takes its block of the global batch (features, lengths, targets); the ranks have
equal numbers of utterances, so DDP's average is the global mean. SGD momentum, gradient clipping.
Variant ``concat``: the targets passed as one 1-D tensor, the utterances' labels concatenated (the labels
selected by ``labels > 0``, wav2vec2's ``masked_select``).

The one-device reference computes the same loss on the global batch.

Follows pytorch ``torch.nn.CTCLoss`` (docs: ``log_probs`` (T, N, C) log-softmaxed, ``input_lengths``,
``target_lengths``, padded or concatenated targets, ``reduction='mean'`` divides by the target lengths,
``zero_infinity``), pytorch/audio ``examples/asr/librispeech_conformer_rnnt``/``examples/hubert``
fine-tuning (``CTCLoss(blank=0, zero_infinity=True)``, lengths after the feature extractor's
downsampling) and huggingface/transformers ``models/wav2vec2/modeling_wav2vec2.py``
(``Wav2Vec2ForCTC.forward``: ``_get_feat_extract_output_lengths``, ``labels >= 0`` mask,
``flattened_targets = labels.masked_select(labels_mask)``, ``log_probs.transpose(0, 1)``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

F_IN, H, V, TMAX, SMAX, GB, SEED, LR = 5, 12, 6, 12, 3, 8, 47, 0.1
STEPS = 3
CORRECT = {"default": (2, 4), "concat": (2,)}
BUGS = {
    "input_lengths_padded": "every utterance's input length is the padded length: padding frames counted as speech",
    "lengths_wrong_offset": "each rank takes the first block's lengths (lengths[:B]) instead of its own block's",
    "concat_offset": "concatenated targets cut at multiples of the padded width instead of the cumulative target lengths",
    "mean_over_batch": "CTCLoss(reduction='none').mean(): the per-utterance losses are not divided by their target lengths",
    "no_log_softmax": "raw logits passed to CTCLoss instead of log_softmax outputs",
    "target_lengths_padded": "target_lengths taken as the padded target width: the padding (blank) labels counted as targets",
}


class Acoustic(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(F_IN, H, 3, stride=2, padding=1)
        self.rnn = nn.GRU(H, H, batch_first=True)
        self.out = nn.Linear(H, V)

    def forward(self, x):
        h = F.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        return self.out(self.rnn(h)[0])


def out_lengths(lengths):
    return (lengths - 1) // 2 + 1


def data():
    """Padded features, their lengths, padded targets (padded with the blank, 0) and target lengths."""
    g = gen(SEED)
    n = STEPS * GB
    x = torch.randn(n, TMAX, F_IN, generator=g)
    lengths = torch.randint(5, TMAX + 1, (n,), generator=g)
    lengths[0], lengths[5] = TMAX, 3
    for i in range(n):
        x[i, lengths[i]:] = 0.0
    tl = torch.minimum(torch.randint(1, SMAX + 1, (n,), generator=g), out_lengths(lengths))
    tl[5] = SMAX          # one utterance too long for its output (2 frames): an infinite loss, zeroed
    y = torch.zeros(n, SMAX, dtype=torch.long)
    for i in range(n):
        y[i, :tl[i]] = torch.randint(1, V, (int(tl[i]),), generator=g)
    return x, lengths, y, tl


def ctc(logits, lengths, y, tl, bug=None, concat=False):
    lp = logits if bug == "no_log_softmax" else logits.log_softmax(-1)
    lp = lp.transpose(0, 1)
    ol = out_lengths(lengths)
    if bug == "input_lengths_padded":
        ol = torch.full_like(ol, lp.shape[0])
    if bug == "target_lengths_padded":
        tl = torch.full_like(tl, SMAX)
    if concat or bug == "concat_offset":
        if bug == "concat_offset":
            y = y.reshape(-1)[:int(tl.sum())]
        else:
            y = y.masked_select(y > 0)
    if bug == "mean_over_batch":
        per = F.ctc_loss(lp, y, ol, tl, blank=0, reduction="none", zero_infinity=True)
        return per.mean()
    return nn.CTCLoss(blank=0, reduction="mean", zero_infinity=True)(lp, y, ol, tl)


def build():
    torch.manual_seed(SEED)
    model = Acoustic()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of utterances, their output lengths and targets; the CTC mean."""
    r, lb = rank(), GB // world_size
    model, opt = build()
    ddp = DDP(model)
    x, lengths, y, tl = data()
    for step in range(STEPS):
        rows = slice(step * GB + r * lb, step * GB + (r + 1) * lb)
        lrows = slice(step * GB, step * GB + lb) if bug == "lengths_wrong_offset" else rows
        logits = ddp(x[rows])
        loss = ctc(logits, lengths[lrows], y[rows], tl[lrows], bug, concat=variant == "concat")
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()


def reference(world_size: int) -> None:
    """One device: the CTC mean over the global batch."""
    model, opt = build()
    x, lengths, y, tl = data()
    for step in range(STEPS):
        rows = slice(step * GB, (step + 1) * GB)
        loss = ctc(model(x[rows]), lengths[rows], y[rows], tl[rows])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
