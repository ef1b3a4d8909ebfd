"""A held-out set of the bugs users write in their own distributed code, each behind a flag of an
otherwise correct loop or module (``bug=""`` is the correct variant): what the hints must name.

Training loops (for ``dist.assert_same_training``), a small MLP on synthetic data:
- ``hand_dp`` (hand-written data parallel: all_reduce of gradients): "sum_no_divide" (SUM without
  / world size), "no_allreduce" (gradients never synchronized), "rank_init" (seeded by rank, no
  broadcast);
- ``ddp_loop`` (DDP + DistributedSampler): "no_sampler" (every rank reads the same batches;
  "no_sampler_epoch": and the whole epoch, world size x the steps),
  "no_sync" (``no_sync()`` left on every step), "loss_times_world" (loss multiplied by the world
  size), "sum_loss" (reduction="sum");
Modules (for ``dist.assert_parity(parallel_fn, ...)``), a small two-stage CNN:
- ``TwoStage(split_size, bug)``: "detach" (the activation detached between stages), "reversed"
  (micro-batch outputs concatenated in reverse order); ``norm="batch"`` for BatchNorm over micro-batches.
"""
import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from pytest_mgpu import rank_context

BATCH = 8  # per rank


def mlp():
    return nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 5))


def data(world_size: int, steps: int):
    g = torch.Generator().manual_seed(7)
    n = BATCH * world_size * steps
    return TensorDataset(torch.randn(n, 20, generator=g), torch.randint(0, 5, (n,), generator=g))


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def one_device(log, world_size: int, bug: str = "", steps: int = 3, **distributed_only):
    """The reference: the global batch (BATCH x world size) per step, in DistributedSampler's order.
    (It receives the distributed loop's arguments too: those that only concern it are ignored.)"""
    dataset = data(world_size, steps)
    model = mlp()
    opt = _sgd(model)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)
    for x, y in DataLoader(dataset, batch_size=BATCH * world_size, sampler=sampler):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        log(model, loss)
        opt.step()


def hand_dp(log, world_size: int, bug: str = "", steps: int = 3):
    """Data parallel by hand, as tutorials write it: all_reduce the gradients, divide."""
    rank = tdist.get_rank()
    if bug == "rank_init":
        torch.manual_seed(rank)
    model = mlp()
    opt = _sgd(model)
    dataset = data(world_size, steps)
    for x, y in DataLoader(dataset, batch_size=BATCH, sampler=DistributedSampler(dataset, shuffle=False)):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if bug != "no_allreduce":
            for p in model.parameters():
                tdist.all_reduce(p.grad, op=tdist.ReduceOp.SUM)
                if bug != "sum_no_divide":
                    p.grad /= world_size
        log(model, loss)
        opt.step()


def ddp_loop(log, world_size: int, bug: str = "", steps: int = 3):
    """DDP with a DistributedSampler, as seed 001 trains."""
    import contextlib

    model = DDP(mlp())
    opt = _sgd(model)
    dataset = data(world_size, steps)
    sampler = None if bug.startswith("no_sampler") else DistributedSampler(dataset, shuffle=False)
    loss_fn = nn.CrossEntropyLoss(reduction="sum" if bug == "sum_loss" else "mean")
    for x, y in DataLoader(dataset, batch_size=BATCH, sampler=sampler, shuffle=False):
        if bug == "no_sampler" and len(log.side.steps) == steps:
            break  # every rank walks the whole dataset: stop after `steps` batches
        opt.zero_grad()
        with model.no_sync() if bug == "no_sync" else contextlib.nullcontext():
            loss = loss_fn(model(x), y)
            (loss * world_size if bug == "loss_times_world" else loss).backward()
        log(model, loss)
        opt.step()


# -- a hand-written two-stage pipeline, in the style of seed 004 ----------------------------------
def cnn(norm: str = "group") -> nn.Sequential:
    def norm_layer(c):
        return nn.BatchNorm2d(c) if norm == "batch" else nn.GroupNorm(4, c)

    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), norm_layer(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1, stride=2), norm_layer(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


class TwoStage(nn.Sequential):
    """``cnn()``'s layers (under its names, as seed 004's class keeps ResNet's), layers 0-2 as stage
    ``front`` on the first device and the rest as ``back`` on the last, fed micro-batches."""

    def __init__(self, split_size: int = 4, bug: str = "", norm: str = "group"):
        super().__init__(*cnn(norm))
        devices = list(rank_context().devices)  # cuda:i on GPUs; cpu once per device on emulated ranks
        self.dev0, self.dev1 = devices[0], devices[-1]
        layers = list(self)
        self.front = nn.Sequential(*layers[:3]).to(self.dev0)
        self.back = nn.Sequential(*layers[3:]).to(self.dev1)
        self.split_size, self.bug = split_size, bug

    def forward(self, x):
        outs = []
        for chunk in x.split(self.split_size, dim=0):
            h = self.front(chunk.to(self.dev0)).to(self.dev1)
            outs.append(self.back(h.detach() if self.bug == "detach" else h))
        return torch.cat(outs[::-1] if self.bug == "reversed" else outs)


def image_batch(step: int, batch: int = 8):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(batch, 3, 16, 16, generator=g), torch.randint(0, 10, (batch,), generator=g)


def fsdp_loop(log, world_size: int, version: int = 2, steps: int = 3):
    """The correct loop under FSDP (2: fully_shard, DTensor parameters; 1: FullyShardedDataParallel
    with use_orig_params): what log() must gather back to full, plainly named tensors."""
    model = mlp()
    if version == 2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (world_size,)))
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        model = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
    opt = _sgd(model)
    dataset = data(world_size, steps)
    for x, y in DataLoader(dataset, batch_size=BATCH, sampler=DistributedSampler(dataset, shuffle=False)):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        log(model, loss)
        opt.step()


def no_log(model, loss):
    """Stands in for log where record="optimizer" records the steps itself."""


def wrapped_names(log, world_size: int, steps: int = 1):
    """DDP around torch.compile around an activation-checkpoint wrapper: log() sees plain names."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    inner = mlp()
    inner[0] = checkpoint_wrapper(inner[0])
    model = DDP(torch.compile(inner))  # never called: compiling is lazy, naming is not
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for _ in range(steps):
        log(model, torch.tensor(0.0))
    return sorted(log.side.steps[0].params)
