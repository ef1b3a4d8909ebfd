"""Data parallel strategies inside the ranks: DDP and FSDP (one rank per device, each on its
DistributedSampler shard of the global batch) and nn.DataParallel (one process, GPUs only)."""
from __future__ import annotations

import contextlib
from typing import List, Optional

from ..batches import SumOrder, batch_len, call_model, shard_indices, split_micro, tree_index, tree_to
from .base import Runner


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
        import torch
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
            from ..gather import full_tensor as full

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
        import torch

        ids = list(ctx.device_indices)
        self.device = torch.device("cuda", ids[0])
        self.module = model.to(self.device)
        self.dp = torch.nn.DataParallel(self.module, device_ids=ids)
        self.optimizer = optimizer_fn(self.module.parameters())
        self.shard_sizes = []

    def sum_order(self, batch: int) -> Optional[SumOrder]:
        n = len(self.dp.device_ids)
        return SumOrder("concat", chunk=-(-batch // n)) if n > 1 else None

    def forward_backward(self, inputs, targets):
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        b = batch_len(inputs)
        self.shard_sizes = [len(c) for c in torch.arange(b).chunk(len(self.dp.device_ids))]
        out = call_model(self.dp, tree_to(inputs, self.device))
        loss = self.loss_fn(out, tree_to(targets, out.device))
        loss.backward()
        return loss.detach(), out.detach()
