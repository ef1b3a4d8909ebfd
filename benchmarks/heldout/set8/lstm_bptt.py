"""An LSTM language model with truncated backpropagation through time under DDP, after pytorch/examples
``word_language_model/main.py``: the token stream cut into contiguous parts, one per rank, each
``batchify``-ed into ``BSZ`` columns (``data.view(bsz, -1).t()``), ``get_batch`` chunks of ``BPTT``
rows with the targets one token later, the hidden state initialised per epoch (``init_hidden``),
carried from chunk to chunk and detached (``repackage_hidden``), ``clip_grad_norm_`` over all the
parameters, SGD, encoder and decoder weights tied.

The one-device reference lays the ranks' columns side by side (W * BSZ columns, rank-major): the LSTM
treats columns independently and DDP averages the ranks' per-token means, so this is the same training.

Follows pytorch/examples ``word_language_model/main.py`` (``batchify``, ``get_batch``,
``repackage_hidden``, ``hidden = model.init_hidden(args.batch_size)`` at the start of ``train()``,
``torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)``) and ``word_language_model/model.py``
(``RNNModel``: ``encoder``, ``rnn``, ``decoder``, ``tie_weights``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

VOCAB, EMB, BSZ, BPTT, EPOCHS, SEED = 12, 16, 2, 5, 2, 9
PART = 48          # tokens per rank's part of the stream (at 2 ranks; the stream is 96 tokens long)
LR, CLIP = 1.0, 0.25
STEPS = 10         # EPOCHS * 5 chunks of BPTT rows (24 rows of a rank's columns, the last one a target only)
CORRECT = {"default": (2, 4)}
BUGS = {
    "hidden_reset_each_batch": "init_hidden() called for every chunk instead of once per epoch (no state carried across chunks)",
    "hidden_carried_across_epochs": "the hidden state is not re-initialised at the start of the second epoch",
    "same_part_all_ranks": "every rank takes the first part of the stream (the rank offset is left out)",
    "interleaved_split": "the stream is split over the ranks token by token (data[rank::W]) instead of in contiguous parts",
    "batchify_view_wrong": "batchify uses data.view(-1, bsz) (columns interleave tokens) instead of view(bsz, -1).t()",
    "targets_unshifted": "get_batch's targets are the input rows themselves, not one token later",
    "clip_per_param": "clip_grad_norm_ applied to each parameter separately instead of to their joint norm",
}


class RNNModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, EMB)
        self.rnn = nn.LSTM(EMB, EMB)
        self.decoder = nn.Linear(EMB, VOCAB)
        self.decoder.weight = self.encoder.weight

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out), hidden

    def init_hidden(self, bsz: int):
        return (torch.zeros(1, bsz, EMB), torch.zeros(1, bsz, EMB))


def stream(w: int) -> torch.Tensor:
    """A token stream with structure (a noisy counter modulo VOCAB), W parts of PART * 2 / W tokens."""
    g = gen(SEED)
    n = PART * 2
    steps = torch.where(torch.rand(n, generator=g) < 0.8, 1, torch.randint(0, VOCAB, (n,), generator=g))
    return torch.cumsum(steps, 0) % VOCAB


def batchify(data: torch.Tensor, bsz: int, bug=None) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    data = data[:nbatch * bsz]
    if bug == "batchify_view_wrong":
        return data.view(-1, bsz).contiguous()
    return data.view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bug=None):
    seq_len = min(BPTT, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = data if bug == "targets_unshifted" else source[i + 1:i + 1 + seq_len]
    return data, target.reshape(-1)


def repackage_hidden(h):
    return tuple(v.detach() for v in h)


def build():
    torch.manual_seed(SEED)
    model = RNNModel()
    return model, torch.optim.SGD(model.parameters(), lr=LR)


def clip(params, bug=None) -> None:
    params = list(params)
    if bug == "clip_per_param":
        for p in params:
            torch.nn.utils.clip_grad_norm_([p], CLIP)
    else:
        torch.nn.utils.clip_grad_norm_(params, CLIP)


def rank_part(data: torch.Tensor, r: int, w: int, bug=None) -> torch.Tensor:
    if bug == "interleaved_split":
        return data[r::w]
    return data.chunk(w)[0 if bug == "same_part_all_ranks" else r]


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its contiguous part of the stream in BSZ * 2 / W columns, TBPTT chunks, DDP."""
    r, w = rank(), world_size
    model, opt = build()
    ddp = DDP(model)
    bsz = BSZ * 2 // w
    source = batchify(rank_part(stream(w), r, w, bug), bsz, bug)
    hidden = model.init_hidden(bsz)
    for epoch in range(EPOCHS):
        if bug != "hidden_carried_across_epochs":
            hidden = model.init_hidden(bsz)
        for i in range(0, source.size(0) - 1, BPTT):
            data, targets = get_batch(source, i, bug)
            hidden = model.init_hidden(bsz) if bug == "hidden_reset_each_batch" else repackage_hidden(hidden)
            opt.zero_grad()
            out, hidden = ddp(data, hidden)
            F.cross_entropy(out.reshape(-1, VOCAB), targets).backward()
            clip(ddp.parameters(), bug)
            opt.step()


def reference(world_size: int) -> None:
    """One device: the ranks' columns side by side, the same chunks, the mean over all tokens."""
    w = world_size
    model, opt = build()
    source = torch.cat([batchify(p, BSZ * 2 // w) for p in stream(w).chunk(w)], 1)
    for epoch in range(EPOCHS):
        hidden = model.init_hidden(BSZ * 2)
        for i in range(0, source.size(0) - 1, BPTT):
            data, targets = get_batch(source, i)
            hidden = repackage_hidden(hidden)
            opt.zero_grad()
            out, hidden = model(data, hidden)
            F.cross_entropy(out.reshape(-1, VOCAB), targets).backward()
            clip(model.parameters())
            opt.step()
