"""Dense passage retrieval with in-batch and cross-rank negatives, trained with GradCache under DDP: a
query encoder and a passage encoder (DPR's bi-encoder; each an MLP with LayerNorm and dropout whose masks
are drawn for the global batch), every query with its positive and one hard negative passage (group size
2). Per update, on every rank: (1) a no-grad forward of each encoder over its chunks of the rank's rows,
the dropout state of every chunk kept (``RandContext``); (2) the loss on the representations alone
(detached leaves with ``requires_grad``): L2-normalised, the passages all-gathered with an autograd
all-gather (backward: the ranks' gradients for this rank's rows summed), the temperature-scaled InfoNCE of
the rank's queries against all gathered passages with labels ``(arange(nq) + rank * nq) * group_size``,
mean over the rank's queries; its backward leaves the gradient cache (the representations' gradients);
(3) a second forward of every chunk with grad, the same dropout masks replayed, and
``backward(cached_grad)`` through the chunk's representations (``torch.dot`` surrogate), under
``no_sync()`` for every chunk but each encoder's last, whose backward all-reduces the accumulated
gradients (DDP's averaging turns the rank means into the global mean). AdamW, linear warm-up then linear
decay (``get_linear_schedule_with_warmup``) per update. Every random draw is made for the global batch by
a generator seeded per update; each rank keeps its rows.

The one-device reference: both encoders on the global batch with grad, the global InfoNCE, one backward.

Follows luyug/GradCache ``src/grad_cache/grad_cache.py`` (``GradCache.cache_step``: ``forward_no_grad``
with ``RandContext``, ``build_cache``, ``forward_backward`` with ``no_sync_except_last`` and
``torch.dot(reps.flatten(), gradient.flatten())``), ``src/grad_cache/context_managers.py``
(``RandContext``), ``src/grad_cache/loss.py`` (``SimpleContrastiveLoss``: ``target = arange(0, n *
target_per_qry, target_per_qry)``), Tevatron ``modeling/encoder.py`` (cross-device negatives, the
temperature) and open_clip ``loss.py`` (``gather_with_grad``, ``local_loss``: labels offset by
``rank * num_logits``); DPR (Karpukhin et al. 2020: separate query / passage encoders, hard negatives).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import MaskDropout, all_gather_grad, all_gather_plain, gen, rank

DI, H, E, NQ, GROUP, TOPICS, SEED = 12, 32, 16, 16, 2, 10, 1902
LR, WD, WARMUP, TAU, P = 5e-3, 0.01, 2, 0.1, 0.1
QCHUNK, PCHUNK = 2, 4
STEPS = 7
CORRECT = {"default": (2, 4)}
BUGS = {
    "gather_without_grad": "the passage representations are all-gathered with a plain all_gather (no autograd; the rank's own slot put back): the cached gradient of the rank's passages misses the other ranks' queries' terms",
    "negatives_not_gathered": "the passages are not all-gathered: each query is scored only against the rank's own passages (in-batch negatives local to the rank)",
    "labels_not_offset_by_rank": "the InfoNCE labels are arange(nq) * group_size on every rank, not offset by rank * nq: on ranks > 0 the positives point at rank 0's passages",
    "label_stride_ignores_hard_negatives": "the labels are arange(nq) + rank * nq without the group-size stride: with a hard negative per query the target is a wrong passage (every other one a hard negative)",
    "no_sync_inverted": "the no_sync condition is inverted: the first chunk's backward all-reduces and the later chunks (the last included) accumulate locally, so the ranks' gradients are never fully averaged",
    "rand_context_missing": "the dropout state is not replayed in the second forward (no RandContext): each chunk's gradient pass draws new dropout masks, different from those of the cached representations",
    "temperature_multiplied": "the similarity scores are multiplied by the temperature (0.1) instead of divided by it: the InfoNCE softmax is nearly flat",
}


class Encoder(nn.Module):
    """One tower; its layers' names carry the tower's tag (``q_fc1``, ``p_fc1``, ...), so that the two
    towers' parameters keep distinct names when each tower is run (and DDP-wrapped) on its own."""

    def __init__(self, tag: str):
        super().__init__()
        self.tag = tag
        for name, mod in (("fc1", nn.Linear(DI, H)), ("norm", nn.LayerNorm(H)), ("drop", MaskDropout(P)),
                          ("fc2", nn.Linear(H, E))):
            setattr(self, f"{tag}_{name}", mod)

    @property
    def drop(self):
        return getattr(self, f"{self.tag}_drop")

    def forward(self, x):
        t = self.tag
        h = F.gelu(getattr(self, f"{t}_norm")(getattr(self, f"{t}_fc1")(x)))
        return getattr(self, f"{t}_fc2")(self.drop(h))


class BiEncoder(nn.Module):
    """Holds both towers (built from one seed on every rank and in the reference)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.query, self.passage = Encoder("q"), Encoder("p")


def batch(step: int):
    """NQ queries, NQ * GROUP passages (query i: its positive at i * GROUP, a hard negative after it),
    and the dropout masks of both towers' first and of a second (fresh) draw."""
    topics = torch.randn(TOPICS, DI, generator=gen(SEED - 1)) * 1.5
    g = gen(SEED + 10 * step)
    t = torch.randint(0, TOPICS, (NQ,), generator=g)
    t_neg = (t + torch.randint(1, TOPICS, (NQ,), generator=g)) % TOPICS
    q = topics[t] + torch.randn(NQ, DI, generator=g)
    pos = topics[t] + torch.randn(NQ, DI, generator=g)
    neg = 0.5 * topics[t] + 0.7 * topics[t_neg] + torch.randn(NQ, DI, generator=g)
    p = torch.stack([pos, neg], 1).reshape(NQ * GROUP, DI)
    masks = {k: (torch.rand(n, H, generator=g) > P).float() for k, n in (("q", NQ), ("p", NQ * GROUP), ("q2", NQ),
                                                                           ("p2", NQ * GROUP))}
    return q, p, masks


def contrastive(q_reps, p_reps, labels, bug=None):
    q, p = F.normalize(q_reps, dim=-1), F.normalize(p_reps, dim=-1)
    scores = q @ p.T
    scores = scores * TAU if bug == "temperature_multiplied" else scores / TAU
    return F.cross_entropy(scores, labels)


def make_opt(model):
    from transformers import get_linear_schedule_with_warmup
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}], lr=LR)
    return opt, get_linear_schedule_with_warmup(opt, num_warmup_steps=WARMUP, num_training_steps=STEPS + 1)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its rows, GradCache's three phases, DDP-wrapped towers."""
    r, w = rank(), world_size
    bi = BiEncoder()
    towers = {"q": DDP(bi.query), "p": DDP(bi.passage)}
    nets = {"q": bi.query, "p": bi.passage}
    opt, sched = make_opt(bi)
    nq, npas = NQ // w, NQ * GROUP // w
    for step in range(STEPS):
        q, p, masks = batch(step)
        rows = {"q": q[r * nq:(r + 1) * nq], "p": p[r * npas:(r + 1) * npas]}
        own = {"q": masks["q"][r * nq:(r + 1) * nq], "p": masks["p"][r * npas:(r + 1) * npas]}
        fresh = {"q": masks["q2"][r * nq:(r + 1) * nq], "p": masks["p2"][r * npas:(r + 1) * npas]}
        size = {"q": QCHUNK, "p": PCHUNK}
        chunks = {k: list(zip(rows[k].split(size[k]), own[k].split(size[k]), fresh[k].split(size[k]))) for k in rows}
        # (1) representations without grad, each chunk's dropout state kept
        reps = {}
        with torch.no_grad():
            for k in ("q", "p"):
                out = []
                for x, m, _ in chunks[k]:
                    nets[k].drop.mask = m
                    out.append(towers[k](x))
                reps[k] = torch.cat(out).detach().requires_grad_()
        # (2) the loss on the representations: the gradient cache
        if bug == "negatives_not_gathered":
            p_all = reps["p"]
        elif bug == "gather_without_grad":
            parts = list(all_gather_plain(reps["p"]).split(npas))
            parts[r] = reps["p"]
            p_all = torch.cat(parts)
        else:
            p_all = all_gather_grad(reps["p"])
        if bug == "labels_not_offset_by_rank" or bug == "negatives_not_gathered":
            labels = torch.arange(nq) * GROUP
        elif bug == "label_stride_ignores_hard_negatives":
            labels = torch.arange(nq) + r * nq
        else:
            labels = (torch.arange(nq) + r * nq) * GROUP
        loss = contrastive(reps["q"], p_all, labels, bug)
        loss.backward()
        cache = {k: reps[k].grad.split(size[k]) for k in reps}
        # (3) the second forward with grad, chunk by chunk, backward(cached gradient)
        for k in ("q", "p"):
            n = len(chunks[k])
            for i, ((x, m, m2), grad) in enumerate(zip(chunks[k], cache[k])):
                last = i == n - 1
                sync_off = last if bug == "no_sync_inverted" else not last
                nets[k].drop.mask = m2 if bug == "rand_context_missing" else m
                with towers[k].no_sync() if sync_off else contextlib.nullcontext():
                    y = towers[k](x)
                    torch.dot(y.flatten(), grad.flatten()).backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def reference(world_size: int) -> None:
    """One device: both towers on the global batch with grad, the global InfoNCE."""
    bi = BiEncoder()
    opt, sched = make_opt(bi)
    for step in range(STEPS):
        q, p, masks = batch(step)
        bi.query.drop.mask, bi.passage.drop.mask = masks["q"], masks["p"]
        loss = contrastive(bi.query(q), bi.passage(p), torch.arange(NQ) * GROUP)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
