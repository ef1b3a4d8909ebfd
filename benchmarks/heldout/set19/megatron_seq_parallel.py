"""Megatron-LM tensor parallelism with sequence parallelism, written by hand: one pre-LayerNorm GPT block
(causal attention, GELU MLP) in Megatron's ``[s, b, h]`` layout, then a final LayerNorm and a token
classifier head. The block's input is scattered along the sequence (each rank keeps ``S / W`` tokens,
``scatter_to_sequence_parallel_region``); the LayerNorms run on the rank's tokens; before each
column-parallel linear (``q``, ``k``, ``v``: the rank's heads' rows, no bias as with
``add_qkv_bias=False``; ``fc1``: its rows and bias) the
sequence-sharded activations are all-gathered (backward: reduce-scatter); after each row-parallel linear
(``o``, ``fc2``: the rank's columns) the partial sums are reduce-scattered back to the sequence shards
(backward: all-gather) and the replicated bias is added after it (``skip_bias_add``); gloo has no
reduce-scatter, so it is an all-reduce of which each rank keeps its sequence chunk. The final LayerNorm's
output is all-gathered for the replicated head (``gather_from_sequence_parallel_region(...,
tensor_parallel_output_grad=False)``: every rank computes the same loss, so the backward only splits).
The LayerNorm weights and biases and the row-parallel biases are replicated over the TP ranks but see
only the rank's tokens: their gradients are all-reduced over the TP group before the step
(``finalize_model_grads`` -> ``_allreduce_layernorm_grads`` for the parameters marked
``sequence_parallel``). The gradient norm for clipping sums the squares of the parameters that are not
tensor-parallel duplicates (sharded ones on every rank, replicated ones on TP rank 0 only), all-reduced
over the group (``clip_grad_norm_fp32``). AdamW with weight decay off for biases and 1-D parameters
(Megatron's ``no_weight_decay_cond``), linear warm-up then cosine decay to 10 % per update. Pure tensor
parallelism (world = TP degree): every rank feeds the same batch. The shards are cut from master weights
built on one device from one seed (``_initialize_affine_weight_cpu``), so the reference is the unsharded
block.

Follows NVIDIA/Megatron-LM ``megatron/core/tensor_parallel/mappings.py`` (``_ScatterToSequenceParallelRegion``,
``_GatherFromSequenceParallelRegion`` with ``tensor_parallel_output_grad``,
``_ReduceScatterToSequenceParallelRegion``), ``tensor_parallel/layers.py`` (``ColumnParallelLinear`` /
``RowParallelLinear`` with ``sequence_parallel``; ``setattr(self.bias, 'sequence_parallel', ...)``),
``distributed/finalize_model_grads.py`` (``_allreduce_layernorm_grads``: grads of parameters with
``sequence_parallel`` summed over the TP group), ``optimizer/clip_grads.py`` (``clip_grad_norm_fp32``,
``param_is_not_tensor_parallel_duplicate``), ``optimizer/__init__.py`` (``_get_param_groups``: no weight
decay for biases and 1-D parameters) and ``optimizer_param_scheduler.py`` (linear warm-up, cosine decay to
``min_lr``); Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
Fig. 5: ``g`` / ``g-bar`` as all-gather / reduce-scatter).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import gen, rank

S, B, D, NH, FF, C, SEED = 8, 2, 16, 4, 32, 6, 1901
LR, WD, MAX_NORM, WARMUP, MIN_RATIO = 0.02, 0.1, 1.8, 2, 0.1
STEPS = 7
CORRECT = {"default": (2, 4)}
BUGS = {
    "sp_grads_not_allreduced": "finalize_model_grads skips the all-reduce of the sequence-parallel parameters' gradients: each TP rank updates its replicated LayerNorm weights and row-parallel biases with the gradient of its own tokens only",
    "row_bias_not_marked_sp": "the row-parallel linears' biases are not marked sequence_parallel: their gradients (from the rank's tokens only) are left out of the TP all-reduce, while the LayerNorms' are reduced",
    "allgather_bwd_split": "the all-gather before the column-parallel linears uses tensor_parallel_output_grad=False: its backward splits the gradient instead of reduce-scattering it, so the LayerNorm and residual stream get only this rank's heads' / columns' contribution",
    "bias_before_reduce_scatter": "the row-parallel linears add their replicated bias before the reduce-scatter: the bias is summed W times",
    "grad_norm_counts_duplicates": "the clipping norm counts the replicated (TP-duplicate) parameters on every TP rank before the all-reduce: the norm is too large and the gradients are clipped too hard",
    "norms_and_biases_decayed": "one AdamW group with weight decay for every parameter: the LayerNorm weights and the biases are decayed too",
    "warmup_from_zero": "the warm-up factor is step / warmup_steps instead of (step + 1) / warmup_steps: the first update runs at lr 0 and the whole schedule lags one update",
}


def _all_gather0(t):
    parts = [torch.empty_like(t) for _ in range(tdist.get_world_size())]
    tdist.all_gather(parts, t.contiguous())
    return torch.cat(parts, 0)


def _reduce_scatter0(t):
    t = t.clone()
    tdist.all_reduce(t)
    return t.chunk(tdist.get_world_size(), 0)[tdist.get_rank()].contiguous()


def _split0(t):
    return t.chunk(tdist.get_world_size(), 0)[tdist.get_rank()].contiguous()


class _ScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _split0(x)

    @staticmethod
    def backward(ctx, g):
        return _all_gather0(g)


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tensor_parallel_output_grad):
        ctx.tp_grad = tensor_parallel_output_grad
        return _all_gather0(x)

    @staticmethod
    def backward(ctx, g):
        return (_reduce_scatter0(g) if ctx.tp_grad else _split0(g)), None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter0(x)

    @staticmethod
    def backward(ctx, g):
        return _all_gather0(g)


def master():
    """The full weights, from one seed (as the one-device model's)."""
    g = gen(SEED)
    w = lambda o, i: torch.randn(o, i, generator=g) / math.sqrt(i)
    b = lambda o: torch.randn(o, generator=g) * 0.1
    ln = lambda: (1 + 0.1 * torch.randn(D, generator=g), 0.1 * torch.randn(D, generator=g))
    return {"q": (w(D, D), b(D)), "k": (w(D, D), b(D)), "v": (w(D, D), b(D)), "o": (w(D, D), b(D)),
            "fc1": (w(FF, D), b(FF)), "fc2": (w(D, FF), b(D)), "head": (w(C, D), b(C)),
            "ln1": ln(), "ln2": ln(), "lnf": ln()}


class GPTBlock(nn.Module):
    """tp ranks; this rank's shards (tp=1: the full block, no communication)."""

    def __init__(self, tp: int = 1, r: int = 0, bug=None):
        super().__init__()
        self.tp, self.bug = tp, bug
        m = master()
        for name in ("ln1", "ln2", "lnf"):
            ln = nn.LayerNorm(D)
            with torch.no_grad():
                ln.weight.copy_(m[name][0])
                ln.bias.copy_(m[name][1])
            setattr(self, name, ln)
        for name in ("q", "k", "v", "fc1", "o", "fc2", "head"):
            wt, bs = m[name]
            if name in ("q", "k", "v", "fc1"):
                wt, bs = wt.chunk(tp, 0)[r], bs.chunk(tp, 0)[r]
            elif name in ("o", "fc2"):
                wt = wt.chunk(tp, 1)[r]
            lin = nn.Linear(wt.shape[1], wt.shape[0], bias=name not in ("q", "k", "v"))
            with torch.no_grad():
                lin.weight.copy_(wt)
                if lin.bias is not None:
                    lin.bias.copy_(bs)
            setattr(self, name, lin)
        for name in ("q", "k", "v", "fc1"):
            for p in getattr(self, name).parameters():
                p.tensor_model_parallel = True
        for name in ("o", "fc2"):
            getattr(self, name).weight.tensor_model_parallel = True
            if bug != "row_bias_not_marked_sp":
                getattr(self, name).bias.sequence_parallel = True
        for name in ("ln1", "ln2", "lnf"):
            getattr(self, name).weight.sequence_parallel = True
            getattr(self, name).bias.sequence_parallel = True

    def gather(self, x):
        """All-gather of the sequence shards before a column-parallel linear."""
        if self.tp == 1:
            return x
        return _GatherFromSP.apply(x, self.bug != "allgather_bwd_split")

    def row(self, lin, h):
        """Row-parallel linear: partial matmul, reduce-scatter to the sequence shards, then the bias."""
        if self.tp == 1:
            return lin(h)
        if self.bug == "bias_before_reduce_scatter":
            return _ReduceScatterToSP.apply(F.linear(h, lin.weight, lin.bias))
        return _ReduceScatterToSP.apply(F.linear(h, lin.weight)) + lin.bias

    def forward(self, x):
        h = _ScatterToSP.apply(x) if self.tp > 1 else x           # (S / tp, B, D)
        a = self.gather(self.ln1(h))                                # (S, B, D)
        heads = NH // self.tp
        q, k, v = (t.view(S, B, heads, -1).permute(1, 2, 0, 3) for t in (self.q(a), self.k(a), self.v(a)))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # (B, heads, S, hd)
        att = att.permute(2, 0, 1, 3).reshape(S, B, -1)
        h = h + self.row(self.o, att)
        m = F.gelu(self.fc1(self.gather(self.ln2(h))))
        h = h + self.row(self.fc2, m)
        h = self.lnf(h)
        if self.tp > 1:
            h = _GatherFromSP.apply(h, False)
        return self.head(h)


def batch(step: int):
    g = gen(SEED + 1 + step)
    y = torch.randint(0, C, (S, B), generator=g)
    x = torch.randn(S, B, D, generator=g) + 0.8 * F.one_hot(y, D).float()
    return x, y


def make_opt(model, bug=None):
    named = list(model.named_parameters())
    if bug == "norms_and_biases_decayed":
        groups = [{"params": [p for _, p in named], "weight_decay": WD}]
    else:
        no_wd = lambda n, p: n.endswith(".bias") or p.dim() == 1
        groups = [{"params": [p for n, p in named if not no_wd(n, p)], "weight_decay": WD},
                  {"params": [p for n, p in named if no_wd(n, p)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95))
    decay_steps = STEPS - WARMUP

    def factor(step):
        if step < WARMUP:
            return (step if bug == "warmup_from_zero" else step + 1) / WARMUP
        t = min(step - WARMUP, decay_steps) / decay_steps
        return MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + math.cos(math.pi * t))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def finalize_grads(model, bug=None):
    """Sum the sequence-parallel parameters' gradients over the TP group (Megatron's
    ``_allreduce_layernorm_grads``)."""
    if bug == "sp_grads_not_allreduced":
        return
    grads = [p.grad for p in model.parameters() if getattr(p, "sequence_parallel", False)]
    flat = torch.cat([g.reshape(-1) for g in grads])
    tdist.all_reduce(flat)
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


def clip_grad_norm_tp(model, bug=None):
    """``clip_grad_norm_fp32``: the squared norms of the non-duplicate parameters, all-reduced over TP."""
    r = tdist.get_rank()
    ps = [p for p in model.parameters() if p.grad is not None]
    dup_ok = r == 0 or bug == "grad_norm_counts_duplicates"
    keep = [p for p in ps if getattr(p, "tensor_model_parallel", False) or dup_ok]
    sq = torch.stack([p.grad.detach().pow(2).sum() for p in keep]).sum() if keep else torch.zeros(())
    tdist.all_reduce(sq)
    total = sq.sqrt()
    coeff = MAX_NORM / (total + 1e-6)
    if coeff < 1.0:
        for p in ps:
            p.grad.mul_(coeff)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its shards of the block, the same batch, sequence-parallel activations."""
    model = GPTBlock(world_size, rank(), bug)
    opt, sched = make_opt(model, bug)
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.cross_entropy(model(x).reshape(-1, C), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        finalize_grads(model, bug)
        clip_grad_norm_tp(model, bug)
        opt.step()
        sched.step()


def reference(world_size: int) -> None:
    """One device: the unsharded block on the whole sequence."""
    model = GPTBlock()
    opt, sched = make_opt(model)
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.cross_entropy(model(x).reshape(-1, C), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        sched.step()
