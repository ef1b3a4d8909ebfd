"""A Llama decoder layer with Megatron-style tensor parallelism written by hand (world = TP degree, every
rank feeds the same batch): a vocab-parallel embedding (each rank holds ``V / W`` rows; ids outside the
rank's range are mapped to 0 and their outputs zeroed, then all-reduced), RMSNorms (replicated),
column-parallel ``q_proj`` / ``k_proj`` / ``v_proj`` (heads split, ``num_heads / W`` per rank, sharded
along dim 0) with rotary embeddings (``rotate_half``) and causal attention, a row-parallel ``o_proj``
(sharded along dim 1, output all-reduced), a SwiGLU MLP with column-parallel ``gate_proj`` / ``up_proj``
and a row-parallel ``down_proj`` (``down(silu(gate(x)) * up(x))``), a final RMSNorm and a replicated LM
head with next-token cross-entropy. The column-parallel inputs go through Megatron's ``f`` (identity
forward, all-reduce backward), the row-parallel outputs through ``g`` (all-reduce forward, identity
backward), so that the replicated parameters' gradients are the same on every rank. The gradient norm
for clipping sums the shards' squares over the TP group and counts the replicated parameters once;
SGD with momentum (Megatron's ``--optimizer sgd``). The shards are slices of the full model built from one seed; every batch is drawn by a generator
seeded per step.

The one-device reference: the same layer unsharded.

Follows NVIDIA/Megatron-LM ``core/tensor_parallel/layers.py`` (``VocabParallelEmbedding``: ``input_mask``,
``masked_input``, ``output_parallel[input_mask, :] = 0.0``, ``reduce_from_tensor_model_parallel_region``;
``ColumnParallelLinear``, ``RowParallelLinear``), ``core/tensor_parallel/mappings.py``
(``copy_to_tensor_model_parallel_region``, ``reduce_from_tensor_model_parallel_region``),
``core/transformer/attention.py`` (``num_attention_heads_per_partition``), ``core/optimizer/clip_grads.py``
(``get_grad_norm_fp32``: all-reduced squared norms), ``core/optimizer/__init__.py`` (SGD), huggingface/transformers
``models/llama/modeling_llama.py`` (``LlamaRMSNorm``, ``rotate_half``, ``apply_rotary_pos_emb``,
``LlamaMLP``) and meta-llama/llama ``llama/model.py`` (fairscale's ``ColumnParallelLinear`` /
``RowParallelLinear`` / ``VocabParallelEmbedding``).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import gen, rank

V, D, NH, FF, S, B, SEED = 32, 32, 4, 48, 8, 2, 2003
HD = D // NH
LR, MOM, MAX_NORM = 0.5, 0.9, 0.6
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "embedding_mask_missing": "the vocab-parallel embedding does not zero the outputs of ids outside the rank's vocabulary range: those ids read the shard's row 0, which is summed into every token by the all-reduce",
    "copy_region_missing": "the column-parallel layers' input skips copy_to_tensor_model_parallel_region (identity forward, all-reduce backward): the input gradient is only the rank's heads' / columns' part, so the norms' and embedding's gradients are partial and differ by rank",
    "heads_per_partition_not_divided": "the attention reshapes the rank's q/k/v shard into num_attention_heads heads instead of num_attention_heads / W: the heads' width (and the 1/sqrt(head_dim) scale and rotary pairs) is W times too small",
    "shard_init_per_rank_seed": "each rank builds the full model from its own seed (seed + rank) before slicing its shards: the shards do not belong to one model and the replicated norms / LM head differ between ranks",
    "clip_norm_not_allreduced": "the clipping norm sums only the rank's local shards' squares (no all-reduce over the TP group): the total norm is too small and clipping is too weak",
    "silu_on_up": "the SwiGLU activation is applied to up_proj's output instead of gate_proj's: silu(up(x)) * gate(x)",
    "row_parallel_not_reduced": "the row-parallel o_proj's partial outputs are not all-reduced before the residual add: each rank adds only its own heads' contribution",
}


class _Copy(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        tdist.all_reduce(g)
        return g


class _Reduce(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        tdist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope(q, k, hd):
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.outer(torch.arange(q.shape[2]).float(), inv)
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos(), emb.sin()
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class LlamaTP(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.attn_norm, self.mlp_norm, self.final_norm = RMSNorm(D), RMSNorm(D), RMSNorm(D)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(D, D, bias=False) for _ in range(3))
        self.o_proj = nn.Linear(D, D, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(D, FF, bias=False), nn.Linear(D, FF, bias=False)
        self.down_proj = nn.Linear(FF, D, bias=False)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.r, self.w = 0, 1
        with torch.no_grad():
            self.embed.weight.mul_(0.5)

    def shard(self, r, w):
        self.r, self.w = r, w
        dims = {"embed": 0, "q_proj": 0, "k_proj": 0, "v_proj": 0, "gate_proj": 0, "up_proj": 0, "o_proj": 1,
                "down_proj": 1}
        for name, dim in dims.items():
            mod = getattr(self, name)
            full = mod.weight.detach()
            n = full.shape[dim] // w
            mod.weight = nn.Parameter(full.narrow(dim, r * n, n).clone())
        return self

    def forward(self, ids, bug=None):
        w = self.w
        copy = (lambda t: t) if w == 1 or bug == "copy_region_missing" else _Copy.apply
        reduce = (lambda t: t) if w == 1 else _Reduce.apply
        nv = V // w
        start = self.r * nv
        mask = (ids < start) | (ids >= start + nv)
        local = (ids - start).masked_fill(mask, 0)
        e = F.embedding(local, self.embed.weight)
        if bug != "embedding_mask_missing":
            e = e.masked_fill(mask[..., None], 0.0)
        h = reduce(e)

        a = copy(self.attn_norm(h))
        nh = NH if bug == "heads_per_partition_not_divided" else NH // w
        hd = (D // w) // nh
        q, k, v = (p(a).view(B, S, nh, hd).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rope(q, k, hd)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(hd))
        o = self.o_proj(att.transpose(1, 2).reshape(B, S, nh * hd))
        h = h + (o if bug == "row_parallel_not_reduced" else reduce(o))

        m = copy(self.mlp_norm(h))
        if bug == "silu_on_up":
            act = F.silu(self.up_proj(m)) * self.gate_proj(m)
        else:
            act = F.silu(self.gate_proj(m)) * self.up_proj(m)
        h = h + reduce(self.down_proj(act))
        return self.lm_head(self.final_norm(h))


SHARDED = ("embed.", "q_proj.", "k_proj.", "v_proj.", "o_proj.", "gate_proj.", "up_proj.", "down_proj.")


def make_model(seed=SEED):
    torch.manual_seed(seed)
    return LlamaTP()


def batch(step: int):
    g = gen(SEED + 100 * step)
    base = torch.randint(0, V, (B, 1), generator=g)
    ids = (base + torch.arange(S) * torch.randint(1, 4, (B, 1), generator=g)) % V
    noise = torch.rand(B, S, generator=g) < 0.2
    return torch.where(noise, torch.randint(0, V, (B, S), generator=g), ids)


def lm_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))


def clip(model, w, bug=None):
    sq_shard = sum(p.grad.pow(2).sum() for n, p in model.named_parameters() if n.startswith(SHARDED))
    sq_repl = sum(p.grad.pow(2).sum() for n, p in model.named_parameters() if not n.startswith(SHARDED))
    if w > 1 and bug != "clip_norm_not_allreduced":
        sq_shard = sq_shard.clone()
        tdist.all_reduce(sq_shard)
    total = (sq_shard + sq_repl).sqrt()
    coef = (MAX_NORM / (total + 1e-6)).clamp(max=1.0)
    for p in model.parameters():
        p.grad.mul_(coef)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every TP rank: its shards, the same batch."""
    r, w = rank(), world_size
    model = make_model(SEED + r if bug == "shard_init_per_rank_seed" else SEED).shard(r, w)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM)
    for step in range(STEPS):
        ids = batch(step)
        loss = lm_loss(model(ids, bug), ids)
        opt.zero_grad()
        loss.backward()
        clip(model, w, bug)
        opt.step()


def reference(world_size: int) -> None:
    """One device: the unsharded layer."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM)
    for step in range(STEPS):
        ids = batch(step)
        loss = lm_loss(model(ids), ids)
        opt.zero_grad()
        loss.backward()
        clip(model, 1)
        opt.step()
