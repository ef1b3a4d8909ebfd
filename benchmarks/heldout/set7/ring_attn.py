"""Context parallel by hand: ring attention. The sequence is split into W contiguous blocks (rank r
holds positions ``[r L, (r+1) L)``, position embeddings from its global offset); every rank keeps its
queries and passes its keys and values around the ring (``batch_isend_irecv`` to the next rank, from the
previous one; an ``autograd.Function`` sends the K/V gradients back). Each block's scores are merged
into the running output with an online softmax (running max, rescaled running sum and accumulator);
causal: the own block with a lower-triangular mask, earlier ranks' blocks in full, later ranks' blocks
fully masked (K and V travel stacked as one tensor, and every block takes part in the graph, so the
ranks' backward passes send the same gradients round the ring in the same order). The token loss is summed over the rank's labelled tokens and divided by the GLOBAL count of
labelled tokens (all-reduced; ``-100`` labels ignored); the replicated weights' gradients are then
summed over the ranks (all-reduce, no division), as Megatron-LM does over its context-parallel group.

Follows zhuzilin/ring-flash-attention ``ring_flash_attn/ring_flash_attn.py``
(``ring_flash_attn_forward``: ``step <= comm.rank``, ``causal and step == 0``), ``ring_flash_attn/
utils.py`` (``update_out_and_lse``, ``RingComm.send_recv``: ``batch_isend_irecv`` to ``rank + 1``);
Megatron-LM ``megatron/core/utils.py`` (``get_batch_on_this_cp_rank``) and ``finalize_model_grads.py``
(gradients all-reduced over data- and context-parallel ranks). The one-device reference is plain
causal attention over the full sequence and the mean token loss over all labelled tokens.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .common import all_reduce, gen, rank, ring_pass

V, D, HEADS, T, B, MLP = 16, 16, 2, 8, 2, 32
LR, MOMENTUM, SEED = 0.5, 0.9, 71
STEPS = 4
CORRECT = {"default": (2, 4)}
BUGS = {
    "pos_local": "position ids start at 0 on every rank (local index), not at the rank's sequence offset",
    "causal_all_blocks": "later ranks' K/V blocks are not masked: queries attend to future blocks",
    "diag_mask_off": "the own (diagonal) block is attended without its causal mask",
    "no_rescale": "online softmax: the running accumulator is not rescaled by exp(m_old - m_new) when the max grows",
    "kv_detached": "K/V passed around the ring with plain send/recv: their gradients do not travel back",
    "loss_local_mean": "each rank's loss is the mean over its own labelled tokens, not divided by the global count",
    "grads_averaged": "replicated gradients all-reduced and divided by W (the loss was already divided by the global count)",
    "ln_not_reduced": "the LayerNorm weights are left out of the gradient all-reduce (a name filter)",
}


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], HEADS, D // HEADS).transpose(1, 2)

    def forward(self, x: torch.Tensor, ring: dict | None) -> torch.Tensor:
        q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
        if ring is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = ring_attention(q, k, v, ring)
        return self.o(out.transpose(1, 2).reshape(x.shape))


def ring_attention(q, k, v, ring: dict) -> torch.Tensor:
    """Online-softmax merge of the W key/value blocks seen as they come round the ring."""
    r, w, bug = ring["rank"], ring["world"], ring["bug"]
    scale = 1.0 / math.sqrt(q.shape[-1])
    n = q.shape[2]
    tril = torch.ones(n, n, dtype=torch.bool).tril()
    m = l = acc = None
    kv = torch.stack([k, v])
    for step in range(w):
        if step > 0:
            kv = ring_pass(kv, bug != "kv_detached")
        k, v = kv[0], kv[1]
        src = (r - step) % w
        s = (q @ k.transpose(-1, -2)) * scale
        if src > r and bug != "causal_all_blocks":
            # a later rank's block: fully masked (it still takes part, so every rank's backward
            # sends the same K/V gradients round the ring)
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool), float("-inf"))
        if step == 0 and bug != "diag_mask_off":
            s = s.masked_fill(~tril, float("-inf"))
        if m is None:
            m = s.amax(-1, keepdim=True)
            p = torch.exp(s - m)
            l, acc = p.sum(-1, keepdim=True), p @ v
            continue
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        alpha, p = torch.exp(m - m_new), torch.exp(s - m_new)
        l = l * alpha + p.sum(-1, keepdim=True)
        acc = (acc if bug == "no_rescale" else acc * alpha) + p @ v
        m = m_new
    return acc / l


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(D), Attention(), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, MLP), nn.GELU(), nn.Linear(MLP, D))
        self.lnf, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, tokens: torch.Tensor, start: int = 0, ring: dict | None = None) -> torch.Tensor:
        pos = torch.arange(start, start + tokens.shape[1])
        h = self.tok(tokens) + self.pos(pos)
        h = h + self.attn(self.ln1(h), ring)
        h = h + self.mlp(self.ln2(h))
        return self.head(self.lnf(h))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and next-token labels (a quarter of them ``-100``, unevenly over the sequence)."""
    g = gen(700 + step)
    seq = torch.randint(0, V, (B, T + 1), generator=g)
    labels = seq[:, 1:].clone()
    labels[torch.rand(B, T, generator=g) < 0.3] = -100
    return seq[:, :-1], labels


def build():
    torch.manual_seed(SEED)
    model = TinyLM()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its sequence block, ring attention, loss over the global token count, grads summed."""
    r, w = rank(), world_size
    model, opt = build()
    n = T // w
    for step in range(STEPS):
        tokens, labels = batch(step)
        tok, lab = tokens[:, r * n:(r + 1) * n], labels[:, r * n:(r + 1) * n]
        opt.zero_grad()
        logits = model(tok, 0 if bug == "pos_local" else r * n, {"rank": r, "world": w, "bug": bug})
        if bug == "loss_local_mean":
            loss = F.cross_entropy(logits.reshape(-1, V), lab.reshape(-1), ignore_index=-100)
        else:
            count = all_reduce((lab != -100).sum())
            loss = F.cross_entropy(logits.reshape(-1, V), lab.reshape(-1), ignore_index=-100,
                                   reduction="sum") / count
        loss.backward()
        for name, p in model.named_parameters():
            if bug == "ln_not_reduced" and ".ln" in "." + name:
                continue
            p.grad.copy_(all_reduce(p.grad) / (w if bug == "grads_averaged" else 1))
        opt.step()


def reference(world_size: int) -> None:
    """One device: the full sequence, plain causal attention, mean loss over the labelled tokens."""
    model, opt = build()
    for step in range(STEPS):
        tokens, labels = batch(step)
        opt.zero_grad()
        logits = model(tokens)
        F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100).backward()
        opt.step()
