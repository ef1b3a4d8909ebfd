"""Expert parallel MoE: top-1 routing, tokens dispatched and combined with ``all_to_all_single``.

Follows torchtitan's expert-parallel token dispatch (``distributed/expert_parallel.py``: tokens
sorted by expert, per-expert counts exchanged first with ``all_to_all_single``, then the tokens with
``input_splits`` / ``output_splits`` from those counts, the experts' outputs sent back the same way
and unpermuted), using the autograd ``torch.distributed.nn.functional.all_to_all_single``; the
replicated (dense) parameters are averaged by hand as in the "Writing distributed applications"
tutorial's ``average_gradients``. Each rank holds only its experts, under their global index.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import block, classify_rows, rank, reseed_apart

DIM, EXPERTS, CLASSES, GLOBAL_BATCH, LR = 16, 4, 4, 16, 0.1
STEPS = 4
CORRECT = {"default": (2, 4)}
BUGS = {
    "gate_not_reduced": "the router (gate) is left out of the hand-written gradient all-reduce",
    "expert_grad_2x": "expert gradients are not divided by the world size",
    "expert_grad_allreduced": "expert gradients are all-reduced too, mixing different experts across ranks",
    "seed_apart": "seed + rank before building the model: replicated layers and experts start apart",
    "combine_order": "the experts' outputs are added back without undoing the sort by expert",
}


class MoE(nn.Module):
    """in_proj, a top-1 gated layer of experts (ModuleDict keyed by global index), head."""

    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(DIM, DIM)
        self.gate = nn.Linear(DIM, EXPERTS, bias=False)
        self.experts = nn.ModuleDict({str(e): nn.Linear(DIM, DIM) for e in range(EXPERTS)})
        self.head = nn.Linear(DIM, CLASSES)
        self.dispatch = None  # set on ranks: (tokens sorted by expert, counts) -> expert outputs, same order
        self.unsort = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.in_proj(x))
        probs = F.softmax(self.gate(h), dim=-1)
        idx = probs.argmax(dim=-1)
        order = torch.argsort(idx, stable=True)
        counts = torch.bincount(idx, minlength=EXPERTS)
        run = self.dispatch or self.local_experts
        out_sorted = run(h[order], counts)
        out = out_sorted[torch.argsort(order)] if self.unsort else out_sorted
        return self.head(h + probs.gather(1, idx[:, None]) * out)

    def local_experts(self, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Tokens grouped by expert (``counts`` per expert, in key order) through their experts."""
        chunks = tokens.split(counts.tolist())
        return torch.cat([self.experts[k](c) for k, c in zip(self.experts.keys(), chunks)])


def _ep_dispatch(model: MoE, w: int):
    """The all-to-all round trip for this rank's tokens; ``model.experts`` holds this rank's."""
    from torch.distributed.nn.functional import all_to_all_single

    per = EXPERTS // w

    def run(tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        recv_counts = torch.empty_like(counts)
        tdist.all_to_all_single(recv_counts, counts)  # [src rank][my local expert]
        send = counts.view(w, per).sum(1).tolist()
        recv = recv_counts.view(w, per).sum(1).tolist()
        got = all_to_all_single(tokens.new_empty(sum(recv), DIM), tokens, recv, send)
        local_id = torch.arange(per).repeat(w).repeat_interleave(recv_counts)
        order = torch.argsort(local_id, stable=True)
        done = model.local_experts(got[order], torch.bincount(local_id, minlength=per))[torch.argsort(order)]
        return all_to_all_single(tokens.new_empty(sum(send), DIM), done, send, recv)
    return run


def _sync_grads(model: MoE, w: int, bug: str | None) -> None:
    """Average the replicated parameters' gradients; scale the experts' by 1/w."""
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        expert = name.startswith("experts.")
        if (not expert and not (bug == "gate_not_reduced" and name.startswith("gate."))) or (
                expert and bug == "expert_grad_allreduced"):
            tdist.all_reduce(p.grad)
            p.grad.div_(w)
        elif expert and bug not in ("expert_grad_2x", "expert_grad_allreduced"):
            p.grad.div_(w)


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's global rows."""
    return classify_rows(7000 + step, GLOBAL_BATCH, DIM, CLASSES)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the whole model built, then only this rank's experts kept; SGD momentum."""
    if bug == "seed_apart":
        reseed_apart()
    model, r, per = MoE(), rank(), EXPERTS // world_size
    for e in range(EXPERTS):
        if not r * per <= e < (r + 1) * per:
            del model.experts[str(e)]
    model.dispatch, model.unsort = _ep_dispatch(model, world_size), bug != "combine_order"
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        x, y = (block(t, r, world_size) for t in global_batch(step))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        _sync_grads(model, world_size, bug)
        opt.step()


def reference(world_size: int) -> None:
    """One device: every expert local, the global batch."""
    model = MoE()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        x, y = global_batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
