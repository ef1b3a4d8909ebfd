"""The strategies a parity run knows: how each wraps the model, splits the global batch, and gives
back full gradients, parameters and buffers in the original model's names.

The top half is plain data used in the test process (names, options, where a strategy can run,
whether it can be bitwise equal to one device). The runners below it run inside the ranks.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

# -- what the test process needs ------------------------------------------------------------------


@dataclass(frozen=True)
class Strategy:
    name: str
    process: str  # "ranks": one process per device (dist.run); "single": one process (run_single)
    options: Dict[str, Any]  # option -> default
    about: str


_COMMON = {"check_buffers": True}
STRATEGIES: Dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "ddp",
            "ranks",
            {
                "sync_bn": False,
                "accumulate": 1,
                "find_unused_parameters": False,
                "gradient_as_bucket_view": False,
                "static_graph": False,
                "bucket_cap_mb": None,
                "ddp_kwargs": None,  # any other DistributedDataParallel keyword arguments
            },
            "DistributedDataParallel, batch sharded as DistributedSampler(shuffle=False) does",
        ),
        Strategy(
            "fsdp",
            "ranks",
            {"fsdp_version": 2, "shard_modules": "children", "reshard_after_forward": True,
             "sharding_strategy": "FULL_SHARD"},
            "fully_shard (FSDP2; fsdp_version=1 for FullyShardedDataParallel), batch sharded like ddp",
        ),
        Strategy("dp", "single", {}, "nn.DataParallel over the test's GPUs in one process"),
        Strategy(
            "model_parallel",
            "single",
            {"split_points": None},
            "consecutive stages on consecutive devices in one process (cut before split_points)",
        ),
        Strategy(
            "pipeline",
            "single",
            {"split_points": None, "split_size": None, "schedule": None, "n_microbatches": None},
            "model_parallel fed micro-batches of split_size; with schedule='gpipe'|'1f1b', one stage "
            "per rank with torch.distributed.pipelining",
        ),
    )
}
SCHEDULES = ("gpipe", "1f1b")


class StrategyError(ValueError):
    """An unknown strategy, or an option it does not take."""


def resolve(strategy: str, options: Dict[str, Any]) -> Tuple[Strategy, Dict[str, Any]]:
    """The strategy and its full option set (defaults filled in); StrategyError says what is valid."""
    spec = STRATEGIES.get(strategy)
    if spec is None:
        known = "\n".join(f"  {s.name!r}: {s.about}" for s in STRATEGIES.values())
        raise StrategyError(f"unknown parity strategy {strategy!r}; pytest-mgpu knows:\n{known}")
    allowed = {**_COMMON, **spec.options}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise StrategyError(
            f"strategy {strategy!r} takes no option(s) {', '.join(map(repr, unknown))}; its options "
            f"are: {', '.join(f'{k}={v!r}' for k, v in allowed.items())} (and loss_fn, optimizer_fn, "
            "steps, rtol, atol, deterministic)"
        )
    opts = {**allowed, **options}
    if strategy == "pipeline":
        sched = opts["schedule"]
        if sched is not None and str(sched).lower() not in SCHEDULES:
            raise StrategyError(f"schedule must be one of {SCHEDULES} or None (one process), got {sched!r}")
        if sched is not None:
            opts["schedule"] = str(sched).lower()
            spec = Strategy(spec.name, "ranks", spec.options, spec.about)
        for key in ("split_size", "n_microbatches"):
            if opts[key] is not None and (not isinstance(opts[key], int) or opts[key] < 1):
                raise StrategyError(f"{key} must be a positive integer, got {opts[key]!r}")
    if strategy == "ddp" and (not isinstance(opts["accumulate"], int) or opts["accumulate"] < 1):
        raise StrategyError(f"accumulate must be a positive integer, got {opts['accumulate']!r}")
    if strategy == "fsdp" and opts["fsdp_version"] not in (1, 2):
        raise StrategyError(f"fsdp_version must be 1 or 2, got {opts['fsdp_version']!r}")
    sp = opts.get("split_points")
    if sp is not None and (isinstance(sp, str) or not all(isinstance(x, str) for x in sp)):
        raise StrategyError(f"split_points must be a list of module names, e.g. ['layer3'], got {sp!r}")
    return spec, opts


def unavailable(spec: Strategy, opts: Dict[str, Any], device_type: str, world_size: int) -> Optional[str]:
    """Why this strategy cannot run on this test's devices, or None."""
    if spec.name == "dp":
        if device_type != "cuda":
            return (
                "nn.DataParallel needs CUDA devices: on CPU its device_ids become [] and it just calls "
                "the module, which proves nothing (run on 2+ GPUs)"
            )
        if world_size < 2:
            return "nn.DataParallel needs 2+ GPUs to split a batch; this test has 1 (use gpu2 or gpu4)"
    if spec.name == "ddp" and opts.get("sync_bn") and device_type != "cuda":
        return (
            "SyncBatchNorm trains only on CUDA tensors ('SyncBatchNorm expected input tensor to be "
            "on GPU'); this test runs on emulated CPU ranks"
        )
    if spec.name == "fsdp" and opts.get("fsdp_version") == 1:
        import torch.distributed.fsdp as fsdp

        if not hasattr(fsdp, "FullyShardedDataParallel"):
            return "this torch has no FSDP1 (FullyShardedDataParallel); use fsdp_version=2"
    return None


def exactness(spec: Strategy, opts: Dict[str, Any], world_size: int, microbatches: int) -> Tuple[bool, str]:
    """Whether the strategy computes each number in the reference's order, so bitwise equality is
    a fair demand (deterministic=True), and why."""
    name = spec.name
    if name == "model_parallel":
        return True, "model parallel runs the same kernels on the same batch, stage after stage"
    if microbatches > 1:
        return False, f"{microbatches} micro-batches sum their gradients in a different order"
    if name == "pipeline":
        return True, "one micro-batch: the same kernels on the same batch, stage after stage"
    if world_size > 1:
        return False, f"{world_size} ranks reduce gradients across shards in a different order"
    return True, "one rank: the collectives are identities"


# -- inside the ranks -----------------------------------------------------------------------------


def _torch():
    import torch

    return torch


def tree_to(tree, device):
    from torch.utils._pytree import tree_map_only

    return tree_map_only(_torch().Tensor, lambda t: t.to(device), tree)


def tree_index(tree, index):
    from torch.utils._pytree import tree_map_only

    return tree_map_only(_torch().Tensor, lambda t: t[index], tree)


def batch_len(tree) -> int:
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(tree):
        if isinstance(leaf, _torch().Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    raise ValueError("batch_fn(step) must return (inputs, targets) with tensors batched along dim 0")


def call_model(model, inputs):
    return model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)


def shard_indices(batch: int, world_size: int, rank: int) -> List[int]:
    """This rank's samples of a global batch, exactly as DistributedSampler(shuffle=False) picks
    them: interleaved, padded by repeating the first samples when the batch is not divisible."""
    from torch.utils.data.distributed import DistributedSampler

    return list(DistributedSampler(range(batch), num_replicas=world_size, rank=rank, shuffle=False))


def split_micro(tree, n: int) -> list:
    """``n`` consecutive chunks along dim 0, sized as torch.tensor_split sizes them (the way
    torch.distributed.pipelining splits micro-batches)."""
    torch = _torch()
    if n <= 1:
        return [tree]
    parts = torch.arange(batch_len(tree)).tensor_split(n)
    return [tree_index(tree, slice(int(p[0]), int(p[-1]) + 1)) for p in parts if len(p)]


@dataclass(frozen=True)
class SumOrder:
    """How a strategy splits the global batch, so that a float32 twin of the reference can add the
    same partial sums in the same order in one process (see ``parity.shadow.Twin``).

    "shards": ``parts`` DistributedSampler shards, each in ``accumulate`` micro-batches, every loss
    divided by parts x accumulate before backward (DDP, FSDP); "concat": forward in chunks of
    ``chunk`` samples, outputs concatenated, one loss (the seed's pipeline, DataParallel);
    "microbatches": ``parts`` micro-batches, each loss divided by parts (pipelining schedules)."""

    kind: str
    parts: int = 1
    accumulate: int = 1
    chunk: int = 0


class Runner:
    """One strategy inside one rank. The worker calls, every step: forward_backward, grads,
    optimizer_step, params, buffers. Dict-returning methods are collective where the strategy needs
    it and return full tensors (any device) on rank 0, None elsewhere."""

    outputs_comparable = False  # whether forward_backward returns the global batch's output

    def __init__(self, model, opts, ctx, loss_fn, optimizer_fn, example, world):
        self.opts, self.ctx, self.loss_fn = opts, ctx, loss_fn
        self.rank, self.world_size = ctx.rank, ctx.world_size
        self.world = world  # devices the strategy spans (ranks, or devices of one process)
        self.microbatches = 1
        self.shard_sizes: List[int] = []
        self.stages: List[List[str]] = []

    def forward_backward(self, inputs, targets):  # -> (global loss as a 0-d tensor or float, output)
        raise NotImplementedError

    def sum_order(self, batch: int) -> Optional[SumOrder]:
        """How this strategy splits a global batch of ``batch``; None: in the reference's order."""
        return None

    def optimizer_step(self):
        self.optimizer.step()

    def grads(self):
        return self._local(lambda m: {n: p.grad for n, p in m.named_parameters()})

    def params(self):
        return self._local(lambda m: dict(m.named_parameters()))

    def buffers(self):
        return self._local(lambda m: dict(m.named_buffers()))

    def _local(self, get):
        return get(self.module) if self.rank == 0 else None


def _mean_over_ranks(value, world_size):
    """All-reduce a 0-d loss to its mean over ranks (gloo has no ReduceOp.AVG); in float64, so that
    the reduction adds no roundoff of its own to an fp64 loss."""
    import torch.distributed as dist

    t = value.detach().clone().reshape(1).double()
    dist.all_reduce(t)
    return t / world_size


class _ShardedRunner(Runner):
    """Data parallel across ranks: each rank takes its DistributedSampler shard of the global batch."""

    def _my_shard(self, inputs, targets):
        b = batch_len(inputs)
        idx = shard_indices(b, self.world_size, self.rank)
        self.shard_sizes = [len(shard_indices(b, self.world_size, r)) for r in range(self.world_size)]
        dev = self.ctx.device()
        return tree_to(tree_index(inputs, idx), dev), tree_to(tree_index(targets, idx), dev)


class DDPRunner(_ShardedRunner):
    def __init__(self, model, opts, ctx, loss_fn, optimizer_fn, example, world):
        super().__init__(model, opts, ctx, loss_fn, optimizer_fn, example, world)
        torch = _torch()
        from torch.nn.parallel import DistributedDataParallel

        dev = ctx.device()
        if opts["sync_bn"]:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model.to(dev)
        kwargs = {k: opts[k] for k in ("find_unused_parameters", "gradient_as_bucket_view", "static_graph")}
        if opts["bucket_cap_mb"] is not None:
            kwargs["bucket_cap_mb"] = opts["bucket_cap_mb"]
        kwargs.update(opts["ddp_kwargs"] or {})
        self.ddp = DistributedDataParallel(model, device_ids=[dev] if dev.type == "cuda" else None, **kwargs)
        self.module = self.ddp.module
        self.optimizer = optimizer_fn(self.ddp.parameters())
        self.microbatches = opts["accumulate"]

    def sum_order(self, batch: int) -> Optional[SumOrder]:
        if self.world_size * self.microbatches == 1:
            return None
        return SumOrder("shards", self.world_size, self.microbatches)

    def forward_backward(self, inputs, targets):
        self.optimizer.zero_grad(set_to_none=True)
        x, y = self._my_shard(inputs, targets)
        k = self.microbatches
        total = 0.0
        for i, (xm, ym) in enumerate(zip(split_micro(x, k), split_micro(y, k))):
            # gradient accumulation: all micro-batches but the last skip the all-reduce
            sync = contextlib.nullcontext() if i == k - 1 else self.ddp.no_sync()
            with sync:
                loss = self.loss_fn(call_model(self.ddp, xm), ym)
                (loss / k).backward()
            total = total + loss.detach() / k
        return _mean_over_ranks(total, self.world_size), None


class FSDPRunner(_ShardedRunner):
    def __init__(self, model, opts, ctx, loss_fn, optimizer_fn, example, world):
        super().__init__(model, opts, ctx, loss_fn, optimizer_fn, example, world)
        dev = ctx.device()
        names = self._shard_names(model, opts["shard_modules"])
        self.version = opts["fsdp_version"]
        if self.version == 2:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            model.to(dev)
            mesh = init_device_mesh(dev.type, (self.world_size,))
            for name in names:
                fully_shard(model.get_submodule(name), mesh=mesh,
                            reshard_after_forward=opts["reshard_after_forward"])
            fully_shard(model, mesh=mesh, reshard_after_forward=opts["reshard_after_forward"])
            self.module = self.wrapped = model
        else:
            import functools

            from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
            from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

            targets = {id(model.get_submodule(n)) for n in names}
            policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: id(m) in targets)
            self.wrapped = FullyShardedDataParallel(
                model,
                device_id=dev,
                use_orig_params=True,
                auto_wrap_policy=policy,
                sharding_strategy=ShardingStrategy[str(opts["sharding_strategy"]).upper()],
            )
            self.module = self.wrapped
        self.optimizer = optimizer_fn(self.wrapped.parameters())

    def sum_order(self, batch: int) -> Optional[SumOrder]:
        return SumOrder("shards", self.world_size) if self.world_size > 1 else None

    @staticmethod
    def _shard_names(model, spec) -> List[str]:
        if spec in (None, "root"):
            return []
        if spec == "children":
            return [n for n, m in model.named_children() if any(True for _ in m.parameters())]
        return list(spec)

    def forward_backward(self, inputs, targets):
        self.optimizer.zero_grad(set_to_none=True)
        x, y = self._my_shard(inputs, targets)
        loss = self.loss_fn(call_model(self.wrapped, x), y)
        loss.backward()
        return _mean_over_ranks(loss, self.world_size), None

    def _full(self, which):
        """Full tensors: DTensor.full_tensor() (FSDP2) or summon_full_params (FSDP1); collective."""
        if self.version == 2:
            from torch.distributed.tensor import DTensor

            def full(t):
                return t.full_tensor() if isinstance(t, DTensor) else t

            if which == "grads":
                out = {n: (full(p.grad) if p.grad is not None else None) for n, p in self.module.named_parameters()}
            else:
                out = {n: full(p.detach()) for n, p in self.module.named_parameters()}
            return out if self.rank == 0 else None
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp._common_utils import clean_tensor_name

        with FullyShardedDataParallel.summon_full_params(self.wrapped, writeback=False, with_grads=which == "grads"):
            if which == "grads":
                out = {clean_tensor_name(n): (p.grad.detach().clone() if p.grad is not None else None)
                       for n, p in self.wrapped.named_parameters()}
            else:
                out = {clean_tensor_name(n): p.detach().clone() for n, p in self.wrapped.named_parameters()}
        return out if self.rank == 0 else None

    def grads(self):
        return self._full("grads")

    def params(self):
        return self._full("params")

    def buffers(self):
        if self.rank != 0:
            return None
        if self.version == 2:
            return dict(self.module.named_buffers())
        from torch.distributed.fsdp._common_utils import clean_tensor_name

        return {clean_tensor_name(n): b for n, b in self.wrapped.named_buffers()}


class DPRunner(Runner):
    outputs_comparable = True

    def __init__(self, model, opts, ctx, loss_fn, optimizer_fn, example, world):
        super().__init__(model, opts, ctx, loss_fn, optimizer_fn, example, world)
        torch = _torch()
        ids = list(ctx.devices)
        self.device = torch.device("cuda", ids[0])
        self.module = model.to(self.device)
        self.dp = torch.nn.DataParallel(self.module, device_ids=ids)
        self.optimizer = optimizer_fn(self.module.parameters())
        self.shard_sizes = []

    def sum_order(self, batch: int) -> Optional[SumOrder]:
        n = len(self.dp.device_ids)
        return SumOrder("concat", chunk=-(-batch // n)) if n > 1 else None

    def forward_backward(self, inputs, targets):
        self.optimizer.zero_grad(set_to_none=True)
        b = batch_len(inputs)
        self.shard_sizes = [len(c) for c in _torch().arange(b).chunk(len(self.dp.device_ids))]
        out = call_model(self.dp, tree_to(inputs, self.device))
        loss = self.loss_fn(out, tree_to(targets, out.device))
        loss.backward()
        return loss.detach(), out.detach()
