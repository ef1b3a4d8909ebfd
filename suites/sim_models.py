"""Models and training steps for the simulated tier's suite (suites/test_simulate.py).

Each step builds its model on the meta device, shards it, and only then materializes this rank's
shards (``to_empty`` + ``reset_parameters``), so a rank of a 1,024-rank job holds one shard, never
the model; then it trains one step. The same functions run on real ranks (``dist.run``) and on a
simulated one (``pytest_mgpu.simulate``): that is the truth check.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from pytest_mgpu import rank_device


# Without biases, as LLaMA-style models are: FSDP2's set-up at 1,024 ranks costs ~2 x 1,024 tensor ops
# per parameter (it pads each parameter's chunk list to the world size), so half the parameters is
# half the set-up; the plans are the same.
class Attention(nn.Module):
    """Causal self-attention; under tensor parallelism q/k/v hold this rank's heads only."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.head_dim = d_model // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (proj(x).view(b, s, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model, bias=False), nn.LayerNorm(d_model, bias=False)
        self.attn = Attention(d_model, heads)
        self.up, self.down = nn.Linear(d_model, 4 * d_model, bias=False), nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 256, d_model: int = 64, heads: int = 8, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model, bias=False)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# Tensor parallelism of one block: q/k/v and the MLP's up projection column-wise (each rank its heads
# and its slice of the hidden layer), their output projections row-wise (a reduction across ranks).
def block_plan() -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    col, row = ColwiseParallel(), RowwiseParallel()
    return {"attn.q": col, "attn.k": col, "attn.v": col, "attn.o": row, "up": col, "down": row}


def materialize(model: nn.Module, device) -> None:
    """This rank's shards only: allocate them (``to_empty``) and initialize them in place."""
    model.to_empty(device=device)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()


def state_bytes(model: nn.Module, optimizer) -> Dict[str, int]:
    """This rank's parameters, gradients and optimizer state: the bytes of their (local) storages."""
    from torch.distributed.tensor import DTensor

    seen = set()

    def nbytes(t) -> int:  # each storage once: FSDP2's gradients are views of one reduce-scatter output
        t = t.to_local() if isinstance(t, DTensor) else t
        if not isinstance(t, torch.Tensor) or t.untyped_storage().data_ptr() in seen:
            return 0
        seen.add(t.untyped_storage().data_ptr())
        return t.untyped_storage().nbytes()

    params = list(model.parameters())
    return {"params": sum(nbytes(p) for p in params),
            "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(nbytes(v) for s in optimizer.state.values() for v in s.values())}


def placements(model: nn.Module) -> Dict[str, Tuple[str, ...]]:
    """How each parameter is laid out over each mesh dim: ``"shard"``, ``"replicate"`` or ``"partial"``
    (``()`` for a plain tensor)."""
    def kind(p) -> str:  # FSDP2 over tensor parallel shards dim 0 twice: a _StridedShard, a shard too
        return "replicate" if p.is_replicate() else "partial" if p.is_partial() else "shard"

    return {name: tuple(kind(p) for p in getattr(param, "placements", ())) for name, param in model.named_parameters()}


def train_step(model: nn.Module, device, vocab: int, batch: int = 2, seq: int = 16) -> Dict[str, Any]:
    """One AdamW step on a synthetic batch; the state bytes after the step (before zero_grad), and
    every parameter's placements."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1)).backward()
    optimizer.step()
    figures: Dict[str, Any] = dict(state_bytes(model, optimizer), placements=placements(model))
    optimizer.zero_grad()
    return figures


def fsdp_step(vocab: int = 256, d_model: int = 64, heads: int = 8, layers: int = 2) -> Dict[str, Any]:
    """FSDP2: ``fully_shard`` per block, then the root, on a 1-D mesh of every rank."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()
    mesh = init_device_mesh(device.type, (tdist.get_world_size(),))
    with torch.device("meta"):
        model = Transformer(vocab, d_model, heads, layers)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    materialize(model, device)
    return train_step(model, device, vocab)


def tp_fsdp_step(tp: int = 8, vocab: int = 256, d_model: int = 64, heads: int = 8, layers: int = 2) -> Dict[str, Any]:
    """2-D: tensor parallel across ``tp`` ranks inside each block, FSDP2 across the data-parallel dim."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    device = rank_device()
    mesh = init_device_mesh(device.type, (tdist.get_world_size() // tp, tp), mesh_dim_names=("dp", "tp"))
    with torch.device("meta"):
        model = Transformer(vocab, d_model, heads, layers)
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], block_plan())
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    materialize(model, device)
    return train_step(model, device, vocab)


def resnet50_fsdp_step(batch: int = 2, size: int = 32) -> Dict[str, int]:
    """The reference documents' ResNet50 under FSDP2: ``fully_shard`` per bottleneck, then the root."""
    import torch.distributed as tdist
    import torchvision
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = rank_device()
    mesh = init_device_mesh(device.type, (tdist.get_world_size(),))
    with torch.device("meta"):
        model = torchvision.models.resnet50(num_classes=10)
    for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
        for bottleneck in stage:
            fully_shard(bottleneck, mesh=mesh)
    fully_shard(model, mesh=mesh)
    materialize(model, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    return state_bytes(model, optimizer)


def counted(fn, *args, **kwargs):
    """Run ``fn`` on a real rank under PyTorch's own ``CommDebugMode``: its collective counts (public
    names), an independent count to hold the simulated tier's against; and its value, with the peak
    tensor memory and the bytes per op the simulated tier's tracker sees on this real rank (real process
    groups: their true sizes)."""
    from torch.distributed.tensor.debug import CommDebugMode

    from pytest_mgpu.simulate.instruments import Instruments
    from pytest_mgpu.simulate.wire import public_name

    from torch.distributed.tensor import _random as dtensor_random

    had_rng_tracker = dtensor_random._rng_tracker is not None
    with CommDebugMode() as mode, Instruments() as tracker:
        value = fn(*args, **kwargs)
    # DTensor's RNG tracker is made once per process, at the first random op on a DTensor of a mesh
    # whose device has an RNG state to sync (CUDA, never CPU); making it broadcasts rank 0's RNG state.
    # So a plan issues that broadcast only if the tracker was made during it: the first plan a
    # process runs, never a later one (torch's own rule, observed here rather than assumed).
    made = not had_rng_tracker and dtensor_random._rng_tracker is not None
    return ({public_name(str(op)): n for op, n in mode.get_comm_counts().items()},
            dict(value, peak=tracker.whole.peak, sent=dict(tracker.whole.sent_by_op),
                 rng_sync=int(made)))


def counted_plans(tp: int) -> Dict[str, Any]:
    """On a real rank: both plans' collective counts (``CommDebugMode``) and state bytes."""
    return {"fsdp": counted(fsdp_step), "tp_fsdp": counted(tp_fsdp_step, tp)}
