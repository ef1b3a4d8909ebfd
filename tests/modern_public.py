"""Small equivalents of modern public PyTorch distributed trainers (pytorch/examples), written as their
authors write them, used by tests/test_modern_public.py:

- distributed/FSDP2 (example.py + model.py + checkpoint.py, DCP API): fully_shard per block + root,
  AdamW, clip_grad_norm_, get/set_model_state_dict + get/set_optimizer_state_dict + dcp.save/load;
- distributed/tensor_parallelism: tensor_parallel_example.py, sequence_parallel_example.py (both
  with the examples' own loop: `output.sum().backward(); optimizer.step()`, no zero_grad),
  fsdp_tp_example.py (2-D dp x tp llama-like with SequenceParallel RMSNorms);
- the DDP tutorial series' Trainer with gradient accumulation (no_sync) and StepLR;
- plain DDP on an uneven data set (22 rows, DistributedSampler drop_last=False);
- a model built, discarded and rebuilt in the same rank.

Every trainer: `xxx_train(world_size, <length>, bug=None)` runs in every rank with the process group
up; `xxx_reference(world_size, <length>)` trains the same global batch on one device. Synthetic data.
"""
import atexit
import contextlib
import math
import os
import shutil
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


# =========================== FSDP2 example: model.py (small) =========================================
@dataclass
class ModelArgs:
    n_layers: int = 2
    vocab_size: int = 8
    max_seq_len: int = 16
    dim: int = 16
    n_heads: int = 4
    dropout_p: float = 0.0


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        assert args.dim % args.n_heads == 0
        self.head_dim = args.dim // args.n_heads
        self.n_heads = args.n_heads
        self.dropout_p = args.dropout_p
        self.resid_dropout = nn.Dropout(args.dropout_p)
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x):
        bsz, seq_len, _ = x.size()
        queries, keys, values = self.wq(x), self.wk(x), self.wv(x)
        queries = queries.view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        keys = keys.view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        values = values.view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        output = F.scaled_dot_product_attention(queries, keys, values, None,
                                                self.dropout_p if self.training else 0, is_causal=True)
        output = output.transpose(1, 2).contiguous().view(bsz, seq_len, -1)
        return self.resid_dropout(self.wo(output))

    def reset_parameters(self):
        self.wq.reset_parameters()
        self.wk.reset_parameters()
        self.wv.reset_parameters()
        self.wo.reset_parameters()


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, dropout_p):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim)
        self.gelu = nn.GELU()
        self.w2 = nn.Linear(hidden_dim, dim)
        self.resid_dropout = nn.Dropout(dropout_p)

    def forward(self, x):
        return self.resid_dropout(self.w2(self.gelu(self.w1(x))))

    def reset_parameters(self):
        self.w1.reset_parameters()
        self.w2.reset_parameters()


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = nn.LayerNorm(args.dim)
        self.attention = Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim)
        self.feed_forward = FeedForward(args.dim, hidden_dim=4 * args.dim, dropout_p=args.dropout_p)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))

    def reset_parameters(self):
        self.attention_norm.reset_parameters()
        self.attention.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.feed_forward.reset_parameters()


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.model_args = args
        self.max_seq_len = args.max_seq_len
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.max_seq_len, args.dim)
        self.dropout = nn.Dropout(args.dropout_p)
        self.layers = nn.ModuleList()
        for _ in range(args.n_layers):
            self.layers.append(TransformerBlock(args))
        self.norm = nn.LayerNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens):
        _bsz, seq_len = tokens.size()
        h = self.tok_embeddings(tokens)
        pos = torch.arange(0, seq_len, device=tokens.device)
        h = self.dropout(h + self.pos_embeddings(pos))
        for layer in self.layers:
            h = layer(h)
        h = self.norm(h)
        return self.output(h).float()

    def reset_parameters(self):
        # as pytorch/examples' FSDP2 model.py writes it: the blocks are NOT reset here
        self.tok_embeddings.reset_parameters()
        self.pos_embeddings.reset_parameters()
        self.norm.reset_parameters()
        self.output.reset_parameters()


FSDP_BATCH, FSDP_SEQ = 4, 8


def lm_rows(step, world_size, rank, batch=FSDP_BATCH, seq=FSDP_SEQ, vocab=8):
    """This rank's rows of step `step`'s global batch (rank=None: all of them)."""
    g = torch.Generator().manual_seed(1000 + step)
    data = torch.randint(0, vocab, (batch * world_size, seq + 1), generator=g)
    if rank is not None:
        data = data[rank * batch:(rank + 1) * batch]
    return data[:, :-1], data[:, 1:]


def _fsdp_build(mesh, bug=None, lr=1e-2):
    from torch.distributed.fsdp import fully_shard

    if bug == "meta_partial_reset":
        with torch.device("meta"):
            model = Transformer(ModelArgs())
    else:
        model = Transformer(ModelArgs())
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if bug == "meta_partial_reset":  # example.py: model.to_empty(device=device); model.reset_parameters()
        model.to_empty(device="cpu")
        model.reset_parameters()  # skips the blocks: their weights are uninitialised memory
    lr = lr * mesh.size() if bug == "lr_times_world" else lr
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    return model, optim


def _fsdp_step(model, optim, step, world_size, rank, bug=None, max_norm=0.5):
    x, y = lm_rows(step, world_size, rank)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    if bug == "local_clip":  # norm of this rank's shards only
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in model.parameters()]
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef)
    elif bug == "local_clip_api":  # the public two-part API, the norm taken over the local shards
        params = [p for p in model.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad.to_local() for p in params])
        torch.nn.utils.clip_grads_with_norm_([p.grad.to_local() for p in params], max_norm, total)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    optim.step()
    if bug != "no_zero_grad":
        optim.zero_grad()
    return loss


def fsdp_train(world_size, steps=100, bug=None):
    """FSDP2 example.py: fully_shard per block + root, AdamW, clip_grad_norm_, each rank its rows."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    model, optim = _fsdp_build(mesh, bug)
    rank = dist.get_rank()
    for step in range(steps):
        _fsdp_step(model, optim, step, world_size, rank, bug)


def fsdp_reference(world_size, steps=100):
    model = Transformer(ModelArgs())
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        _fsdp_step(model, optim, step, world_size, None)


# ---- FSDP2 + DCP checkpointer (checkpoint.py's dcp_api path, sharded dcp.save/load) -------------------
def _tmpdir(prefix):
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)  # when the (warm) process ends
    return path


def _shared_tmpdir():
    if not dist.is_initialized():
        return _tmpdir("dcp_ref_")
    box = [_tmpdir("dcp_ranks_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _save(model, optim, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)}
    dcp.save(state, checkpoint_id=path)


def _load(model, optim, path, with_optim=True):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    state = {"model": get_model_state_dict(model)}
    if with_optim:
        state["optim"] = get_optimizer_state_dict(model, optim)  # _init_optim_state: a step with lr 0
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    if with_optim:
        set_optimizer_state_dict(model, optim, state["optim"])


def fsdp_ckpt_train(world_size, steps=100, save_at=3, bug=None):
    """Train save_at steps, dcp.save, build model + optimizer anew, dcp.load, go on.
    bug="no_optim_state": the optimizer state is not loaded; bug="data_restart": the data
    iterator starts from step 0 again after the load."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    rank = dist.get_rank()
    path = _shared_tmpdir()
    model, optim = _fsdp_build(mesh)
    for step in range(save_at):
        _fsdp_step(model, optim, step, world_size, rank)
    _save(model, optim, path)
    del model, optim
    model, optim = _fsdp_build(mesh)
    _load(model, optim, path, with_optim=bug != "no_optim_state")
    start = 0 if bug == "data_restart" else save_at
    for step in range(start, start + steps):
        _fsdp_step(model, optim, step, world_size, rank)


def fsdp_ckpt_reference(world_size, steps=100, save_at=3, checkpoint=False):
    """checkpoint=False: straight through; True: the same save / rebuild / load on one device."""
    model = Transformer(ModelArgs())
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(save_at):
        _fsdp_step(model, optim, step, world_size, None)
    if checkpoint:
        path = _shared_tmpdir()
        _save(model, optim, path)
        del model, optim
        model = Transformer(ModelArgs())
        optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _load(model, optim, path)
    for step in range(save_at, save_at + steps):
        _fsdp_step(model, optim, step, world_size, None)


# =========================== DDP tutorial Trainer + gradient accumulation + StepLR ===================
def regression(n=64, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    return TensorDataset(x, x[:, :1] * 2 - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=g))


def mlp():
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))


class AccumTrainer:
    def __init__(self, model, train_data, optimizer, scheduler, accum_steps=2, bug=None, distributed=True):
        self.model, self.train_data, self.optimizer, self.scheduler = model, train_data, optimizer, scheduler
        self.accum_steps, self.bug, self.distributed = accum_steps, bug, distributed

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for i, (source, targets) in enumerate(self.train_data):
            sync = (i + 1) % self.accum_steps == 0
            ctx = self.model.no_sync() if (self.distributed and not sync) else contextlib.nullcontext()
            with ctx:
                loss = F.mse_loss(self.model(source), targets)
                if self.bug != "no_divide":
                    loss = loss / self.accum_steps
                loss.backward()
            if self.bug == "sched_per_micro":
                self.scheduler.step()
            if sync:
                self.optimizer.step()
                self.optimizer.zero_grad()
                if self.bug != "sched_per_micro":
                    self.scheduler.step()

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)


def _accum_objs(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)


def accum_train(world_size, epochs=100, bug=None, batch_size=4):
    model = DDP(mlp())
    optimizer, scheduler = _accum_objs(model)
    ds = regression()
    loader = DataLoader(ds, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(ds, seed=0))
    AccumTrainer(model, loader, optimizer, scheduler, bug=bug).train(epochs)


def accum_reference(world_size, epochs=100, batch_size=4):
    model = mlp()
    optimizer, scheduler = _accum_objs(model)
    ds = regression()
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, seed=0)
    loader = DataLoader(ds, batch_size=batch_size * world_size, shuffle=False, sampler=sampler)
    AccumTrainer(model, loader, optimizer, scheduler, distributed=False).train(epochs)


# =========================== plain DDP, 22 rows, DistributedSampler(drop_last=False) =================
def uneven_train(world_size, epochs=100, bug=None, batch_size=4):
    model = DDP(mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = regression(22)
    sampler = DistributedSampler(ds, shuffle=True, seed=0, drop_last=False)
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()


def uneven_reference(world_size, epochs=100, batch_size=4):
    """The ranks' rows together: DistributedSampler pads the permutation to a multiple of the world
    size (repeating its head) and rank r takes positions r, r+W, ...; so batch k of all ranks is the
    contiguous block k*b*W.. of the padded permutation, equal sizes on every rank."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = regression(22)
    n = len(ds)
    total = math.ceil(n / world_size) * world_size
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(0 + epoch)
        idx = torch.randperm(n, generator=g).tolist()
        idx += idx[:total - n]
        for k in range(0, total, batch_size * world_size):
            x, y = ds[idx[k:k + batch_size * world_size]]
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()


def uneven_local_mean_train(world_size, epochs=100, batch_size=3):
    """B10: each rank its own slice rows[r::W] (22 rows: 6,6,5,5 at W=4, no padding), a local-mean
    loss averaged by DDP: the ranks with a smaller last batch weigh their rows more."""
    model = DDP(mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = regression(22)
    mine = torch.utils.data.Subset(ds, list(range(dist.get_rank(), len(ds), world_size)))
    for epoch in range(epochs):
        for x, y in DataLoader(mine, batch_size=batch_size):
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()


def uneven_global_mean_reference(world_size, epochs=100, batch_size=3):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = regression(22)
    n = len(ds)
    per_rank = [list(range(r, n, world_size)) for r in range(world_size)]
    steps = max(math.ceil(len(p) / batch_size) for p in per_rank)
    for epoch in range(epochs):
        for k in range(steps):
            rows = [i for p in per_rank for i in p[k * batch_size:(k + 1) * batch_size]]
            x, y = ds[rows]
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()  # the global mean over this step's rows
            optimizer.step()


# =========================== a model built, discarded, built again ==================================
def rebuild_train(world_size, epochs=100, batch_size=4):
    probe = DDP(mlp())
    with torch.no_grad():
        probe(torch.zeros(2, 10))  # a dry run (shape check / FLOP count)
    del probe
    model = DDP(mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ds = regression()
    sampler = DistributedSampler(ds, seed=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(ds, batch_size=batch_size, sampler=sampler):
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()


def rebuild_reference(world_size, epochs=100, batch_size=4):
    probe = mlp()
    with torch.no_grad():
        probe(torch.zeros(2, 10))
    del probe
    _one_device_mse(world_size, epochs, batch_size)


def _one_device_mse(world_size, epochs, batch_size):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ds = regression()
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, seed=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(ds, batch_size=batch_size * world_size, sampler=sampler):
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()


# =========================== tensor_parallel_example.py / sequence_parallel_example.py ===============
class ToyModel(nn.Module):
    """MLP based model"""

    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


def tp_train(world_size, num_iters=100, bug=None, lr=0.25):
    """tensor_parallel_example.py: every rank the same input (torch.manual_seed(i)).
    bug="rank_inputs": torch.manual_seed(i + rank); bug="rank_seed": torch.manual_seed(0 + rank) (not 0) before the
    model is built (parallelize_module then scatters from rank 0: src_data_rank=0);
    bug="rank_seed_local": the same with parallelize_module(..., src_data_rank=None) (each rank keeps its own)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    device_mesh = init_device_mesh(device_type="cpu", mesh_shape=(world_size,))
    _rank = device_mesh.get_rank()
    torch.manual_seed(0 + (_rank if bug in ("rank_seed", "rank_seed_local") else 0))
    tp_model = ToyModel()
    plan = {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()}
    tp_model = parallelize_module(module=tp_model, device_mesh=device_mesh, parallelize_plan=plan,
                                  src_data_rank=None if bug == "rank_seed_local" else 0)
    optimizer = torch.optim.AdamW(tp_model.parameters(), lr=lr, foreach=True)
    for i in range(num_iters):
        torch.manual_seed(i + (_rank if bug == "rank_inputs" else 0))
        inp = torch.rand(20, 10)
        output = tp_model(inp)
        output.sum().backward()
        optimizer.step()


def tp_reference(world_size, num_iters=100, lr=0.25):
    torch.manual_seed(0)
    model = ToyModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    for i in range(num_iters):
        torch.manual_seed(i)
        inp = torch.rand(20, 10)
        output = model(inp)
        output.sum().backward()
        optimizer.step()


def sp_rows(i, rank):
    return torch.rand(20, 10, generator=torch.Generator().manual_seed(7000 + 100 * i + rank))


def sp_train(world_size, num_iters=100, bug=None, lr=0.25):
    """sequence_parallel_example.py: each rank its own 20 rows (Shard(0) input and output)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    device_mesh = init_device_mesh(device_type="cpu", mesh_shape=(world_size,))
    _rank = device_mesh.get_rank()
    sp_model = parallelize_module(module=ToyModel(), device_mesh=device_mesh, parallelize_plan={
        "in_proj": ColwiseParallel(input_layouts=Shard(0)),
        "out_proj": RowwiseParallel(output_layouts=Shard(0))})
    optimizer = torch.optim.AdamW(sp_model.parameters(), lr=lr, foreach=True)
    for i in range(num_iters):
        inp = sp_rows(i, _rank)
        output = sp_model(inp)
        output.sum().backward()
        optimizer.step()


def sp_reference(world_size, num_iters=100, lr=0.25, loss_scale=1.0):
    """All ranks' rows, in rank order; the loss is the sum over all of them (the ranks' losses
    summed). loss_scale=1/W: the loss as the mean of the ranks' losses (same gradients x 1/W)."""
    model = ToyModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    for i in range(num_iters):
        inp = torch.cat([sp_rows(i, r) for r in range(world_size)])
        output = model(inp)
        (output.sum() * loss_scale).backward()
        optimizer.step()


# =========================== fsdp_tp_example.py: 2-D dp x tp llama-like ==============================
@dataclass
class LlamaArgs:
    dim: int = 16
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = 32
    hidden: int = 32
    norm_eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


class LlamaAttention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        # -1: the local number of heads under tensor parallel
        xq = xq.view(bsz, seqlen, -1, self.head_dim).transpose(1, 2)
        xk = xk.view(bsz, seqlen, -1, self.head_dim).transpose(1, 2)
        xv = xv.view(bsz, seqlen, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bsz, seqlen, -1))


class LlamaFeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.attention = LlamaAttention(args)
        self.feed_forward = LlamaFeedForward(args.dim, args.hidden)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList([LlamaBlock(args) for _ in range(args.n_layers)])
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()


LLAMA_BATCH, LLAMA_SEQ = 4, 8


def llama_rows(i, dp_rank):
    torch.manual_seed(i + dp_rank)  # fsdp_tp_example.py: torch.manual_seed(i + dp_rank)
    data = torch.randint(32, (LLAMA_BATCH, LLAMA_SEQ + 1))
    return data[:, :-1], data[:, 1:]


def fsdp_tp_train(world_size, num_iterations=100, bug=None, tp_size=2, lr=3e-3):
    """fsdp_tp_example.py, small: 2-D mesh (dp, tp), TP/SP plan per block, fully_shard over dp.
    bug="norm_not_sp": the block norms left out of the plan (plain replicated weights whose
    gradients come from this rank's sequence shard only, never reduced across tp)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    dp_size = world_size // tp_size
    device_mesh = init_device_mesh("cpu", (dp_size, tp_size), mesh_dim_names=("dp", "tp"))
    tp_mesh, dp_mesh = device_mesh["tp"], device_mesh["dp"]
    dp_rank = dp_mesh.get_local_rank()
    model = Llama(LlamaArgs())
    model = parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for transformer_block in model.layers:
        layer_tp_plan = {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                            use_local_output=True),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                               use_local_output=True),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        }
        if bug == "norm_not_sp":
            del layer_tp_plan["attention_norm"], layer_tp_plan["ffn_norm"]
        parallelize_module(module=transformer_block, device_mesh=tp_mesh, parallelize_plan=layer_tp_plan)
    sharded_model = fully_shard(model, mesh=dp_mesh)
    optimizer = torch.optim.AdamW(sharded_model.parameters(), lr=lr, foreach=True)
    for i in range(num_iterations):
        inp, tgt = llama_rows(i, dp_rank)
        output = sharded_model(inp)
        loss = F.cross_entropy(output.flatten(0, 1), tgt.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def fsdp_tp_reference(world_size, num_iterations=100, tp_size=2, lr=3e-3):
    dp_size = world_size // tp_size
    model = Llama(LlamaArgs())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    for i in range(num_iterations):
        rows = [llama_rows(i, r) for r in range(dp_size)]
        inp, tgt = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
        loss = F.cross_entropy(model(inp).flatten(0, 1), tgt.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


# =========================== device selection in an mp.spawn entry (spawn=True) ======================
def device_main(rank, world_size, epochs=100, mode="accelerator", batch_size=4):
    """mode="accelerator": torch.accelerator.current_accelerator() + set_device_index(rank), device_id=
    that device; "accelerator_checked": current_accelerator(check_available=True) or cpu;
    "device_id_cpu": init_process_group(..., device_id=torch.device("cpu"))."""
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    if mode == "accelerator":
        acc = torch.accelerator.current_accelerator()
        torch.accelerator.set_device_index(rank)
        device = torch.device(acc.type, rank)
    elif mode == "accelerator_checked":
        acc = torch.accelerator.current_accelerator(check_available=True)
        device = torch.device(acc.type, rank) if acc is not None else torch.device("cpu")
        if acc is not None:
            torch.accelerator.set_device_index(rank)
    else:
        device = torch.device("cpu")
    backend = dist.get_default_backend_for_device(device)
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size, device_id=device)
    model = DDP(mlp().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ds = regression()
    sampler = DistributedSampler(ds, seed=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(ds, batch_size=batch_size, sampler=sampler):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


def device_reference(world_size, epochs=100, batch_size=4):
    _one_device_mse(world_size, epochs, batch_size)
