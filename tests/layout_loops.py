"""Training loops whose ranks hold their model in another layout than the one-device loop: a
wrapper from a library (Lightning Fabric), and tensor parallelism written by hand as Megatron-LM
writes it (plain parameters holding each rank's slice; custom autograd functions: copy to the
parallel region = identity forward, all_reduce backward; reduce from it = the reverse). Each
``train`` runs in every rank, each ``reference`` on one device; ``bug=`` breaks one shard."""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn as nn
import torch.nn.functional as F

D, HIDDEN, HEADS, HEAD_DIM = 8, 16, 4, 4
E = HEADS * HEAD_DIM


def batch(step, rows=8):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(rows, D, generator=g), torch.randn(rows, D, generator=g)


def tokens(step):
    g = torch.Generator().manual_seed(7 + step)
    return torch.randn(4, 6, E, generator=g), torch.randn(4, 6, E, generator=g)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def _sgd_steps(model, steps):
    """Yields (model, x, y) per step for the caller's backward, then steps SGD."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(step)
        yield model, x, y
        opt.step()
        opt.zero_grad()


def fabric_train(steps=3):
    """Lightning Fabric's DDP on the plugin's process group (``fabric.launch()`` starts nothing)."""
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=tdist.get_world_size())
    fabric.launch()
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fabric.setup(model, opt)
    r, w = tdist.get_rank(), tdist.get_world_size()
    for step in range(steps):
        x, y = batch(step)
        n = x.shape[0] // w
        fabric.backward(F.mse_loss(model(x[r * n:(r + 1) * n]), y[r * n:(r + 1) * n]))
        opt.step()
        opt.zero_grad()


def mlp_reference(steps=3, bug=None):
    torch.manual_seed(0)
    model = MLP()
    for m, x, y in _sgd_steps(model, steps):
        F.mse_loss(m(x), y).backward()


class Copy(torch.autograd.Function):
    """Megatron's copy_to_tensor_model_parallel_region: identity forward, all_reduce backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        tdist.all_reduce(grad)
        return grad


class Reduce(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region: all_reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        tdist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceTwice(Reduce):
    """A reduce-from-region function that all_reduces in its backward too (a bug)."""

    backward = staticmethod(Copy.backward)


def _piece(t, dim, rank, world):
    n = t.shape[dim] // world
    return nn.Parameter(t.detach().narrow(dim, rank * n, n).clone())


class ParallelMLP(nn.Module):
    """fc1 column-parallel (rows of its weight), fc2 row-parallel (columns), fc2's bias whole."""

    def __init__(self, full: MLP, bug=None):
        super().__init__()
        r, w = tdist.get_rank(), tdist.get_world_size()
        self.fc1, self.fc2 = nn.Module(), nn.Module()
        s = 0 if bug == "wrong_slice" else r
        self.fc1.weight, self.fc1.bias = _piece(full.fc1.weight, 0, s, w), _piece(full.fc1.bias, 0, s, w)
        if bug == "strided_slice":  # every w-th row from the rank's index: not its block
            self.fc1.weight = nn.Parameter(full.fc1.weight.detach()[r::w].clone())
            self.fc1.bias = nn.Parameter(full.fc1.bias.detach()[r::w].clone())
        self.fc2.weight, self.fc2.bias = _piece(full.fc2.weight, 1, r, w), nn.Parameter(full.fc2.bias.detach().clone())
        self.bug = bug

    def forward(self, x):
        x = x if self.bug == "no_backward_allreduce" else Copy.apply(x)
        h = F.gelu(F.linear(x, self.fc1.weight, self.fc1.bias))
        reduce = ReduceTwice if self.bug == "reduce_twice" else Reduce
        return reduce.apply(F.linear(h, self.fc2.weight)) + self.fc2.bias


def _with_embed(block):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(D, D), block)


def tp_mlp_train(steps=3, bug=None):
    torch.manual_seed(0)
    model = _with_embed(ParallelMLP(MLP(), bug))
    for m, x, y in _sgd_steps(model, steps):
        F.mse_loss(m(x), y).backward()
        if bug == "whole_summed":  # tensors each rank holds whole, summed though each has the whole gradient
            for p in (model[0].weight, model[0].bias, model[1].fc2.bias):
                tdist.all_reduce(p.grad)


def tp_mlp_reference(steps=3, bug=None):
    torch.manual_seed(0)
    model = _with_embed(MLP())
    for m, x, y in _sgd_steps(model, steps):
        F.mse_loss(m(x), y).backward()


class Attention(nn.Module):
    def __init__(self, fused=False):
        super().__init__()
        self.fused = fused
        if fused:
            self.qkv = nn.Linear(E, 3 * E)
        else:
            self.q, self.k, self.v = nn.Linear(E, E), nn.Linear(E, E), nn.Linear(E, E)
        self.proj = nn.Linear(E, E)

    def project(self, x):
        if self.fused:
            return self.qkv(x).chunk(3, dim=-1)
        return self.q(x), self.k(x), self.v(x)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, -1, HEAD_DIM).transpose(1, 2) for z in self.project(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        return self.proj(y)


class ParallelAttention(nn.Module):
    """Heads split across ranks; a fused qkv weight holds each rank's [q_r; k_r; v_r] rows."""

    def __init__(self, full: Attention):
        super().__init__()
        r, w = tdist.get_rank(), tdist.get_world_size()
        self.fused = full.fused
        if self.fused:
            parts = [_piece(p, 0, r, w) for p in full.qkv.weight.split(E)]
            biases = [_piece(p, 0, r, w) for p in full.qkv.bias.split(E)]
            self.qkv = nn.Module()
            self.qkv.weight = nn.Parameter(torch.cat([p.detach() for p in parts]))
            self.qkv.bias = nn.Parameter(torch.cat([p.detach() for p in biases]))
        for name in ("q", "k", "v") if not self.fused else ():
            lin, m = getattr(full, name), nn.Module()
            m.weight, m.bias = _piece(lin.weight, 0, r, w), _piece(lin.bias, 0, r, w)
            setattr(self, name, m)
        self.proj = nn.Module()
        self.proj.weight, self.proj.bias = _piece(full.proj.weight, 1, r, w), nn.Parameter(full.proj.bias.detach().clone())

    def forward(self, x):
        b, t, _ = x.shape
        x = Copy.apply(x)
        if self.fused:
            qkv = F.linear(x, self.qkv.weight, self.qkv.bias).chunk(3, dim=-1)
        else:
            qkv = [F.linear(x, getattr(self, n).weight, getattr(self, n).bias) for n in ("q", "k", "v")]
        q, k, v = (z.view(b, t, -1, HEAD_DIM).transpose(1, 2) for z in qkv)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        return Reduce.apply(F.linear(y, self.proj.weight)) + self.proj.bias


def _adam_steps(model, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        x, y = tokens(step)
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def tp_attention_train(steps=3, fused=False):
    torch.manual_seed(0)
    _adam_steps(ParallelAttention(Attention(fused)), steps)


def tp_attention_reference(steps=3, fused=False):
    torch.manual_seed(0)
    _adam_steps(Attention(fused), steps)


def unfuse_qkv(pieces):
    """``shards=`` for the fused qkv weight: each rank's [q_r; k_r; v_r] into [q; k; v]."""
    qs, ks, vs = zip(*(p.chunk(3) for p in pieces))
    return torch.cat([torch.cat(qs), torch.cat(ks), torch.cat(vs)])


def closure_train(steps=3, freeze_fc2=False):
    """DDP stepped as Lightning's Trainer steps it: forward and backward inside
    ``optimizer.step(closure)``; ``freeze_fc2``: the ranks' optimizer leaves fc2 out."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(MLP())
    params = model.module.fc1.parameters() if freeze_fc2 else model.parameters()
    opt = torch.optim.SGD(params, lr=0.1)
    r, w = tdist.get_rank(), tdist.get_world_size()
    for step in range(steps):
        x, y = batch(step)
        n = x.shape[0] // w

        def closure():
            opt.zero_grad()
            loss = F.mse_loss(model(x[r * n:(r + 1) * n]), y[r * n:(r + 1) * n])
            loss.backward()
            return loss

        opt.step(closure=closure)
