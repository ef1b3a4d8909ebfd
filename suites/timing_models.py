"""Models, scales and timed steps shared by the timing suites.

Each ``*_step`` function runs inside a rank: it builds the model, optimizer and a synthetic batch
once, and returns the step that ``dist.benchmark`` times (zero_grad, forward, loss, backward,
optimizer step). torchvision is imported inside them, so the pytest process does not pay for it.

Sizes follow the reference experiments on GPUs and shrink on CPU, where 2 shared cores must run
every suite in a few minutes (the CPU figures say whether the machinery works and catch gross
regressions; they are not GPU numbers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn

from pytest_mgpu import rank_context, rank_device


def cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0  # NVML: no CUDA context


@dataclass(frozen=True)
class Scale:
    """Sizes of one suite on this machine."""

    name: str  # "gpu" or "cpu"
    image: int
    batches: Tuple[int, ...]
    world_sizes: Tuple[int, ...]  # the multi-device sizes (DDP, DP)
    min_run_time: float  # seconds of timed iterations per measurement (repeat is calibrated, >= 5)
    warmup: Optional[int] = None  # None: calibrated (GPUs: cudnn autotuning, allocator growth)

    def bench_kwargs(self) -> dict:
        return {"min_run_time": self.min_run_time, "warmup": self.warmup}


def _multi(sizes=(2, 4, 8)) -> Tuple[int, ...]:
    """The multi-device world sizes this machine's GPUs can hold; (2,) on CPU, and on a 1-GPU
    machine (where those tests skip rather than emulate GPU-size cases on the CPU)."""
    n = cuda_count()
    return tuple(s for s in sizes if s <= n) or (2,)


ON_GPU = cuda_count() > 0
# seed 000: a small and a large model. On CPU the large one is ResNet18: ResNet50's DDP step there is
# dominated by gloo's all-reduce of 100 MB of gradients (323 of 423 ms at batch 16 on 2 ranks), which
# measures the loopback, not the model, and cost the suites 13 s of their 114 s.
ARCHS = ("mobilenet_v2", "resnet50") if ON_GPU else ("mobilenet_v2", "resnet18")
# seed 000: batch sizes up to 256 on 4 GPUs; on CPU two small batches at 32 px, one warmup iteration
DP_DDP = (Scale("gpu", 224, (32, 64, 128, 256), _multi(), 2.0) if ON_GPU
          else Scale("cpu", 32, (8, 16), (2,), 0.4, warmup=1))
# seed 004: ResNet50, batch 120 at 128 px, split sizes 1..60; on CPU ResNet18 (the same cut after
# layer2), batch 8 at 36 px (the smallest input for which a one-sample micro-batch keeps 2x2 pixels in
# layer4, as BatchNorm needs in train mode): split sizes 1, 3, 5, 8 (8 = one micro-batch). On CPU both
# halves share the cores, so the curve shows the cost of micro-batching, not its gain; with ResNet50 at
# batch 12 its 8 rows took 32 s of the suites' 114 s (split size 1: 1.36 s a step, past the call limit
# under load 8), with ResNet18 at batch 12 19 s, at batch 8 about 12 s.
SPLIT_SIZES = (1, 3, 5, 8, 10, 12, 20, 40, 60)
PIPELINE_ARCH = "resnet50" if ON_GPU else "resnet18"
PIPELINE = Scale("gpu", 128, (120,), (2,), 2.0) if ON_GPU else Scale("cpu", 36, (8,), (2,), 0.4, warmup=1)
# FSDP vs DDP with Adam (optimizer state is what sharding saves most of): ResNet50 on GPUs, ResNet18
# on CPU (DDP's gloo all-reduce of ResNet50's 100 MB of gradients takes ~1.5 s a step on 2 cores)
FSDP = Scale("gpu", 224, (64,), _multi(), 2.0) if ON_GPU else Scale("cpu", 32, (8,), (2,), 0.4, warmup=1)
FSDP_ARCH = "resnet50" if ON_GPU else "resnet18"


def scale_skip_reason(scale: Scale, emulated: bool) -> Optional[str]:
    """GPU-size cases do not run on emulated CPU ranks (a GPU machine with too few GPUs)."""
    if scale.name == "gpu" and emulated:
        return (f"GPU-size timing case would be emulated on CPU ranks (this machine has {cuda_count()} "
                "GPU(s)); it runs at full size on enough GPUs")
    return None


# -- models -----------------------------------------------------------------------------------------
def classifier(arch: str, num_classes: int = 10) -> nn.Module:
    import torchvision

    return getattr(torchvision.models, arch)(num_classes=num_classes)


def synthetic_batch(batch: int, image: int, num_classes: int, device, one_hot: bool = False):
    x = torch.randn(batch, 3, image, image, device=device)
    y = torch.randint(0, num_classes, (batch,), device=device)
    if one_hot:  # seed 004 trains with MSELoss against one-hot labels
        y = torch.zeros(batch, num_classes, device=device).scatter_(1, y.view(-1, 1), 1.0)
    return x, y


def _optimizer(name: str, params):
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def _train_step(model, opt, x, y, loss_fn=nn.functional.cross_entropy):
    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return step


# -- single device, DataParallel, DDP, FSDP ------------------------------------------------------------
def single_step(arch: str, batch: int, image: int, optimizer: str = "sgd"):
    dev = rank_device()
    model = classifier(arch).to(dev)
    x, y = synthetic_batch(batch, image, 10, dev)
    return _train_step(model, _optimizer(optimizer, model.parameters()), x, y)


def dp_step(arch: str, batch: int, image: int):
    """nn.DataParallel in one process over all the test's GPUs (scatter, replicate, gather)."""
    ctx = rank_context()
    if ctx.device_type != "cuda" or len(ctx.devices) < 2:
        raise RuntimeError("dp_step needs 2+ GPUs: without them nn.DataParallel just calls the module")
    dev = ctx.devices[0]
    model = nn.DataParallel(classifier(arch).to(dev), device_ids=list(ctx.devices))
    x, y = synthetic_batch(batch, image, 10, dev)
    return _train_step(model, _optimizer("sgd", model.parameters()), x, y)


def _local_batch(batch: int, world: int) -> int:
    if batch % world:
        raise ValueError(f"global batch {batch} does not split evenly over {world} ranks")
    return batch // world


def ddp_step(arch: str, batch: int, image: int, optimizer: str = "sgd"):
    """DDP; ``batch`` is the global batch, split over the ranks (as DataParallel splits it)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ctx = rank_context()
    dev = rank_device()
    model = classifier(arch).to(dev)
    model = DDP(model, device_ids=[ctx.device_index] if ctx.device_type == "cuda" else None)
    x, y = synthetic_batch(_local_batch(batch, ctx.world_size), image, 10, dev)
    return _train_step(model, _optimizer(optimizer, model.parameters()), x, y)


def fsdp_step(arch: str, batch: int, image: int, optimizer: str = "adam"):
    """FSDP2 (``fully_shard``) per residual block and at the root: parameters, gradients and
    optimizer state sharded over the ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ctx = rank_context()
    dev = rank_device()
    mesh = init_device_mesh(ctx.device_type, (ctx.world_size,))
    model = classifier(arch).to(dev)
    blocks = [b for name in ("layer1", "layer2", "layer3", "layer4") for b in getattr(model, name, [])]
    if not blocks:
        raise ValueError(f"fsdp_step shards ResNet blocks; {arch} has none")
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    x, y = synthetic_batch(_local_batch(batch, ctx.world_size), image, 10, dev)
    return _train_step(model, _optimizer(optimizer, model.parameters()), x, y)


# -- model parallel and pipelining (seed 004) ----------------------------------------------------------
class ModelParallelResNet(nn.Module):
    """Seed 004's ModelParallelResNet50, for any torchvision ResNet: cut after layer2, conv1..layer2 on
    ``dev0``, layer3..fc on ``dev1``. With ``split_size`` the batch is cut into micro-batches so that
    both halves work at once."""

    def __init__(self, dev0, dev1, num_classes: int = 1000, split_size: Optional[int] = None,
                 arch: str = "resnet50"):
        super().__init__()
        base = classifier(arch, num_classes)
        self.dev1 = dev1
        self.split_size = split_size
        self.seq1 = nn.Sequential(base.conv1, base.bn1, base.relu, base.maxpool, base.layer1, base.layer2).to(dev0)
        self.seq2 = nn.Sequential(base.layer3, base.layer4, base.avgpool).to(dev1)
        self.fc = base.fc.to(dev1)

    def _tail(self, h):
        return self.fc(torch.flatten(self.seq2(h), 1))

    def forward(self, x):
        if not self.split_size:
            return self._tail(self.seq1(x).to(self.dev1))
        splits = iter(x.split(self.split_size, dim=0))
        prev = self.seq1(next(splits)).to(self.dev1)
        out = []
        for nxt in splits:
            out.append(self._tail(prev))  # dev1 works on micro-batch i ...
            prev = self.seq1(nxt).to(self.dev1)  # ... while dev0 (asynchronously) starts i + 1
        out.append(self._tail(prev))
        return torch.cat(out)


def _mse_step(model, batch: int, image: int, in_dev, num_classes: int):
    x, y = synthetic_batch(batch, image, num_classes, in_dev, one_hot=True)
    out_dev = next(model.parameters()).device if not hasattr(model, "dev1") else model.dev1
    y = y.to(out_dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    return _train_step(model, opt, x, y, nn.functional.mse_loss)


def resnet_whole_step(batch: int, image: int, num_classes: int = 1000, arch: str = "resnet50"):
    dev = rank_device()
    model = classifier(arch, num_classes).to(dev)
    return _mse_step(model, batch, image, dev, num_classes)


def resnet_split_step(batch: int, image: int, split_size: Optional[int] = None, num_classes: int = 1000,
                      arch: str = "resnet50"):
    """Model parallel (``split_size=None``) or pipelined, on the first and last of the process's
    GPUs; on emulated CPU ranks both halves live on the CPU."""
    ctx = rank_context()
    if ctx.device_type == "cuda":
        dev0, dev1 = ctx.devices[0], ctx.devices[-1]
    else:
        dev0 = dev1 = torch.device("cpu")
    model = ModelParallelResNet(dev0, dev1, num_classes, split_size, arch)
    return _mse_step(model, batch, image, dev0, num_classes)
