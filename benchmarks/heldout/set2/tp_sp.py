"""Tensor parallel (``parallelize_module``) with sequence parallel norms and ``loss_parallel`` on a
one-block Llama-style model; every rank feeds the same batch.

Follows pytorch/torchtitan ``torchtitan/parallelisms/parallelize_llama.py`` (``apply_tp``:
``tok_embeddings`` ``RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))``, ``norm``
``SequenceParallel()``, ``output`` ``ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
use_local_output=False)`` for ``loss_parallel``; per block ``attention_norm`` / ``ffn_norm``
``SequenceParallel()``, ``PrepareModuleInput`` to ``Replicate()`` before attention and feed-forward,
``wq/wk/wv/w1`` colwise, ``wo/w2`` rowwise with ``output_layouts=Shard(1)``; the attention's view
``(bs, seqlen, -1, head_dim)`` so each rank holds its local heads) and pytorch/examples
``distributed/tensor_parallelism/sequence_parallel_example.py`` (AdamW, the same input on every
TP rank). Variants: the full plan above; a plain Megatron plan without sequence parallel (norms and
embeddings replicated as plain modules, the output gathered to ``Replicate()``, an ordinary loss).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..set1.common import rank, reseed_apart

VOCAB, DIM, HEADS, FFN, SEQ, BATCH = 16, 16, 4, 32, 8, 4
LR = 3e-3
STEPS = 5
CORRECT = {"default": (2, 4), "plain_tp": (2,)}
BUGS = {
    "heads_not_local": "attention reshapes with view(bs, seqlen, n_heads, -1): n_heads not divided by the TP degree, the local heads cut wrong",
    "rank_rows": "a data-parallel loader left in: each TP rank feeds its own rows",
    "norm_not_sp": "SequenceParallel left out of the plan for the norms: they run on each rank's sequence shard as plain modules",
    "lr_times_tp": "lr multiplied by the world size (the linear scaling rule applied to TP ranks as if they were data-parallel)",
    "loss_div_tp": "loss divided by the world size before backward, as if the TP ranks' losses were summed",
    "seed_no_scatter": "torch.manual_seed(seed + rank) for per-rank dropout, and parallelize_module(src_data_rank=None) to skip the startup scatter",
}


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_heads, self.head_dim = HEADS, DIM // HEADS
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.global_heads_view = False

    def forward(self, x):
        bs, seqlen, _ = x.shape
        if self.global_heads_view:
            shape = (bs, seqlen, self.n_heads, -1)
        else:
            shape = (bs, seqlen, -1, self.head_dim)
        q, k, v = (w(x).view(*shape).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous()
        return self.wo(out.view(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)))


class TransformerBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.LayerNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([TransformerBlock()])
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def batch(step: int, seed_offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(900 + step + 1000 * seed_offset)
    seq = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def apply_tp(model: Model, mesh, sequence_parallel: bool, norms_in_plan: bool = True, src_data_rank=0) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    if not sequence_parallel:
        parallelize_module(model, mesh, {"output": ColwiseParallel(output_layouts=Replicate())}, src_data_rank=src_data_rank)
        for layer in model.layers:
            parallelize_module(layer, mesh, {
                "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel()}, src_data_rank=src_data_rank)
        return
    top = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
           "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)}
    if norms_in_plan:
        top["norm"] = SequenceParallel()
    parallelize_module(model, mesh, top, src_data_rank=src_data_rank)
    for layer in model.layers:
        plan = {
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        }
        if norms_in_plan:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        parallelize_module(layer, mesh, plan, src_data_rank=src_data_rank)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: one TP mesh over all ranks, the same batch on each."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    if bug == "seed_no_scatter":
        reseed_apart()
    model = Model()
    if bug == "heads_not_local":
        for layer in model.layers:
            layer.attention.global_heads_view = True
    sp = variant != "plain_tp"
    apply_tp(model, mesh, sequence_parallel=sp, norms_in_plan=bug != "norm_not_sp",
             src_data_rank=None if bug == "seed_no_scatter" else 0)
    lr = LR * world_size if bug == "lr_times_tp" else LR
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step in range(STEPS):
        x, y = batch(step, rank() if bug == "rank_rows" else 0)
        opt.zero_grad()
        pred = model(x)
        if sp:
            with loss_parallel():
                loss = F.cross_entropy(pred.flatten(0, 1), y.flatten())
                if bug == "loss_div_tp":
                    loss = loss / world_size
                loss.backward()
        else:
            loss = F.cross_entropy(pred.flatten(0, 1), y.flatten())
            if bug == "loss_div_tp":
                loss = loss / world_size
            loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the same model and batch."""
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
