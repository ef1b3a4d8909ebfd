"""A tiny GPT-style LM with a Megatron vocab-parallel word embedding TIED to the output layer, and the
vocab-parallel cross entropy, by hand. The one-device model: ``emb = nn.Embedding(V, D)``, a
replicated ``fc`` block (tanh, residual), logits ``h @ emb.weight.T``, mean token cross entropy. On
W tensor-parallel ranks every rank reads the same tokens and holds the rows ``[r V/W, (r+1) V/W)`` of
``emb.weight`` (sliced from the full init, as Megatron's ``_initialize_affine_weight_cpu``):

- the embedding masks the token ids outside its range, looks up ``id - start`` (0 where masked),
  zeroes the masked rows and all-reduces (``VocabParallelEmbedding.forward``);
- the output layer copies ``h`` into the tensor-parallel region (identity forward, all-reduce
  backward) and multiplies by its shard: the rank's slice of the logits (``parallel_lm_logits``);
- the loss is ``_VocabParallelCrossEntropy``: the max all-reduced (MAX), the target's logit taken on
  the rank owning it and all-reduced, the sum of exps all-reduced; its backward is ``softmax - onehot``
  where the one-hot is only subtracted on the owning rank.

``fc`` is replicated; its gradient is the same on every rank because the LM head's input gradient
is all-reduced. SGD with momentum.

Follows NVIDIA/Megatron-LM ``megatron/core/tensor_parallel/layers.py`` (``VocabParallelEmbedding``),
``megatron/core/tensor_parallel/cross_entropy.py`` (``_VocabParallelCrossEntropy``,
``VocabParallelCrossEntropy.calculate_predicted_logits`` / ``calculate_gradients``),
``megatron/core/tensor_parallel/mappings.py`` and ``megatron/legacy/model/language_model.py``
(``parallel_lm_logits``); the forward of ``_VocabParallelCrossEntropy`` as copied in
facebookresearch/fairscale and microsoft DeepSpeed's ``domino`` (found with the code search).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import copy_to, gen, rank, reduce_from, world

V, D, B, T = 16, 8, 4, 6
LR, MOMENTUM, SEED = 0.5, 0.9, 11
STEPS = 4
CORRECT = {"default": (2, 4)}
BUGS = {
    "emb_no_mask": "the embedding rows of ids outside the rank's vocab range are not zeroed before the all-reduce",
    "emb_no_allreduce": "the vocab-parallel embedding's output is not all-reduced: each rank sees only its own vocab's rows",
    "ce_local_max": "the logits max is not all-reduced: each rank subtracts its own max before the sum of exps is summed",
    "ce_local_sumexp": "the sum of exps is not all-reduced: each rank's softmax normalises over its own vocab slice",
    "ce_onehot_every_rank": "the cross entropy's backward subtracts the one-hot on every rank (the target mask is ignored)",
    "head_no_copy": "the LM head's input is not copied into the tensor-parallel region: its gradient is not all-reduced",
    "shard_grads_averaged": "every gradient averaged over the tensor-parallel ranks, the vocab shards included (DP habit)",
    "shard_fresh_init": "each rank makes its own nn.Embedding(V // W, D) under the same seed instead of slicing the full init",
}


class VocabCE(torch.autograd.Function):
    """Megatron's vocab-parallel cross entropy over the default group; ``bug`` picks a mistake."""

    @staticmethod
    def forward(ctx, logits, target, start, bug):
        w = world()
        logits_max = logits.max(-1)[0]
        if w > 1 and bug != "ce_local_max":
            tdist.all_reduce(logits_max, op=tdist.ReduceOp.MAX)
        logits = logits - logits_max.unsqueeze(-1)
        end = start + logits.shape[-1]
        target_mask = (target < start) | (target >= end)
        masked_target = (target - start).masked_fill(target_mask, 0)
        predicted = logits.gather(-1, masked_target.unsqueeze(-1)).squeeze(-1).masked_fill(target_mask, 0.0)
        exp_logits = logits.exp()
        sum_exp = exp_logits.sum(-1)
        if w > 1:
            tdist.all_reduce(predicted)
            if bug != "ce_local_sumexp":
                tdist.all_reduce(sum_exp)
        ctx.save_for_backward(exp_logits / sum_exp.unsqueeze(-1), target_mask, masked_target)
        ctx.bug = bug
        return sum_exp.log() - predicted

    @staticmethod
    def backward(ctx, grad_out):
        softmax, target_mask, masked_target = ctx.saved_tensors
        grad = softmax.clone()
        onehot = F.one_hot(masked_target, grad.shape[-1]).to(grad.dtype)
        if ctx.bug != "ce_onehot_every_rank":
            onehot = onehot * (~target_mask).unsqueeze(-1).to(grad.dtype)
        grad = (grad - onehot) * grad_out.unsqueeze(-1)
        return grad, None, None, None


class LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.fc = nn.Linear(D, D)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = self.body(self.emb(ids))
        return F.cross_entropy((h @ self.emb.weight.t()).reshape(-1, V), target.reshape(-1))


class TPLM(LM):
    """The rank's part: its vocab rows of the tied embedding, the replicated ``fc``."""

    def __init__(self, bug: str | None) -> None:
        super().__init__()
        r, w = rank(), world()
        self.bug, self.start, self.per = bug, r * V // w, V // w
        full = self.emb.weight.detach()
        if bug == "shard_fresh_init":
            torch.manual_seed(SEED)
            self.emb = nn.Embedding(self.per, D)
        else:
            self.emb = nn.Embedding(self.per, D)
            self.emb.weight = nn.Parameter(full[self.start:self.start + self.per].clone())

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        mask = (ids < self.start) | (ids >= self.start + self.per)
        local = (ids - self.start).masked_fill(mask, 0)
        out = F.embedding(local, self.emb.weight)
        if self.bug != "emb_no_mask":
            out = out.masked_fill(mask.unsqueeze(-1), 0.0)
        if self.bug != "emb_no_allreduce":
            out = reduce_from(out)
        h = self.body(out)
        if self.bug != "head_no_copy":
            h = copy_to(h)
        logits = h @ self.emb.weight.t()
        return VocabCE.apply(logits, target, self.start, self.bug).mean()


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's tokens and next-token targets (every rank reads all of them)."""
    ids = torch.randint(0, V, (B, T + 1), generator=gen(100 + step))
    return ids[:, :-1], ids[:, 1:]


def fit(model: nn.Module, bug: str | None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        loss = model(*batch(step))
        opt.zero_grad()
        loss.backward()
        if bug == "shard_grads_averaged" and world() > 1:
            for p in model.parameters():
                tdist.all_reduce(p.grad)
                p.grad /= world()
        opt.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its vocab shard of the tied embedding, the same tokens."""
    torch.manual_seed(SEED)
    fit(TPLM(bug), bug)


def reference(world_size: int) -> None:
    """One device: the whole vocabulary."""
    torch.manual_seed(SEED)
    fit(LM(), None)
