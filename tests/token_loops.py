"""A tiny next-token model trained by hand-written data parallel loops whose loss is built from the
outputs as language-model and RL trainers build it (a shift, a completion mask, per-row weights), for
the outputs evidence (``tests/test_loss_outputs.py``). ``train(world_size, bug)`` runs on the ranks,
``reference(world_size)`` on one device with the global batch; module level, so they travel by name."""
from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn

V, D, T, ROWS, STEPS = 11, 12, 8, 8, 3


class Mix(nn.Module):
    """A layer mixing its input: the identity, or (``reduce``) summed over the ranks, a collective inside
    a layer that the reference never runs."""

    def __init__(self, reduce: bool = False) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(D))
        self.reduce = reduce

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.reduce and tdist.is_initialized():
            h = h.clone()
            tdist.all_reduce(h)
        return h * self.scale


class Tiny(nn.Module):
    def __init__(self, detach_pos: bool = False, token_drop: bool = False, reduce: bool = False) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        self.mix = Mix(reduce)
        self.head = nn.Linear(D, V)
        self.detach_pos, self.token_drop = detach_pos, token_drop

    def forward(self, ids: torch.Tensor, keep: torch.Tensor | None = None,
                scale: torch.Tensor | None = None) -> torch.Tensor:
        pos = self.pos(torch.arange(ids.shape[1]))
        h = self.tok(ids) + (pos.detach() if self.detach_pos else pos)
        if keep is not None:  # an attention-style mask the loop passes beside the tokens
            h = h * keep[..., None]
        if scale is not None:  # a per-token scale beside it
            h = h * scale[..., None]
        if self.token_drop:  # tokens dropped by a draw over the rows at hand: the rank's, not the batch's
            keep = torch.rand(ids.shape, generator=torch.Generator().manual_seed(7)) > 0.25
            h = h * keep[..., None]
        return self.head(torch.tanh(self.mix(h)))


class WithLoss(nn.Module):
    """The model and its loss in one forward (research code's ``model(x, y) -> loss``): no outputs to probe."""

    def __init__(self, net: Tiny) -> None:
        super().__init__()
        self.net = net

    def forward(self, ids, fed, length, weight) -> torch.Tensor:
        return loss_of(self.net(fed), ids, length, weight)


def batch(step: int):
    """Token rows, how many tokens of each row count (2..T), and a weight per row (an advantage)."""
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, V, (ROWS, T), generator=g)
    length = torch.randint(2, T + 1, (ROWS,), generator=g)
    weight = torch.randn(ROWS, generator=g)
    return ids, length, weight


def attention(length: torch.Tensor, off: int = 0) -> torch.Tensor:
    """1 at the positions of each row's tokens, 0 after them."""
    return (torch.arange(T)[None, :] < length[:, None] + off).to(torch.float32)


def masked(ids: torch.Tensor, step: int) -> torch.Tensor:
    """15% of the tokens replaced by token 0 (an input mask), drawn over the rows given."""
    drop = torch.rand(ids.shape, generator=torch.Generator().manual_seed(50 + step)) < 0.15
    return ids.masked_fill(drop, 0)


def loss_of(logits, ids, length, weight, bug: str = "") -> torch.Tensor:
    """Per-row mean of the weighted next-token log-likelihood over the counted positions, then the mean
    over rows: ``bug`` changes one part as a user's slip would."""
    if bug == "unshifted":
        logp = torch.log_softmax(logits[:, 1:], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    else:
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    pos = torch.arange(1, T)[None, :]
    mask = (pos < length[:, None] - (1 if bug == "mask_last" else 0)).to(logp.dtype)
    per_row = (logp * mask).sum(1) / mask.sum(1).clamp(min=1)
    return -(per_row * weight).mean()


def _model(detach_pos: bool = False, token_drop: bool = False, reduce: bool = False) -> Tiny:
    torch.manual_seed(0)
    return Tiny(detach_pos, token_drop, reduce)


def train(world_size: int, bug: str = "") -> None:
    rank = tdist.get_rank()
    model = _model(detach_pos=bug == "detached_pos", token_drop=bug.endswith("token_drop"), reduce=bug == "mix_reduced")
    inside = WithLoss(model) if bug.startswith("inside") else None  # the loss computed in the model's forward
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    n = ROWS // world_size
    for step in range(STEPS):
        ids, length, weight = batch(step)
        if bug == "weights_local":  # each rank standardises the weights of its own rows
            mine = weight[rank * n:(rank + 1) * n]
            weight = torch.cat([weight[:rank * n], (mine - mine.mean()) / (mine.std() + 1e-4), weight[(rank + 1) * n:]])
        else:
            weight = (weight - weight.mean()) / (weight.std() + 1e-4)
        start = rank * n // (2 if bug == "keywords_overlap" else 1)  # overlapping: some rows shared with rank 0
        sl = slice(start, start + n)
        fed = masked(ids[sl], step) if bug == "mask_local" else masked(ids, step)[sl]  # drawn for the rank's rows
        keep = {"keep": attention(length[sl], off=-2)} if bug == "keep_off" else {}  # a mask built off by one
        if inside is not None:
            loss = inside(ids[sl], fed, length[sl], weight[sl])
        elif bug == "scale_by_position":  # by position, the scale built off by three (the reference: by keyword)
            loss = loss_of(model(fed, attention(length[sl]), 1 + attention(length[sl], off=-3)), ids[sl], length[sl],
                           weight[sl])
        else:
            out = model(ids=fed, **keep) if bug.startswith("keywords") else model(fed, **keep)  # model(**batch)
            loss = loss_of(out, ids[sl], length[sl], weight[sl], bug)
        opt.zero_grad()
        (loss * 2.0 ** 16 if bug == "scale_kept" else loss).backward()  # a loss scale by hand, never divided out
        for p in model.parameters():
            if p.grad is not None:
                tdist.all_reduce(p.grad)
                p.grad /= world_size
        opt.step()


def reference(world_size: int, bug: str = "") -> None:
    model = _model(token_drop=bug.endswith("token_drop"))  # the same model, its draw over the whole batch
    inside = WithLoss(model) if bug.startswith("inside") else None
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        ids, length, weight = batch(step)
        weight = (weight - weight.mean()) / (weight.std() + 1e-4)
        keep = {"keep": attention(length)} if bug == "keep_off" else {}
        if bug == "scale_by_position":  # keywords in another order than the forward's parameters
            keep = {"scale": 1 + attention(length), "keep": attention(length)}
        loss = inside(ids, masked(ids, step), length, weight) if inside is not None else \
            loss_of(model(masked(ids, step), **keep), ids, length, weight)
        opt.zero_grad()
        loss.backward()
        opt.step()

