"""Strategies that cut the model into stages: model parallel and the seed's micro-batched pipeline
in one process (stages on consecutive devices), and torch.distributed.pipelining across ranks."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ..batches import SumOrder, batch_len, call_model, split_micro, tree_index, tree_to
from .base import Runner


def auto_split_points(model, n_stages: int) -> List[str]:
    """Cut the top-level children into up to ``n_stages`` consecutive runs of about equal parameter
    count. Cuts fall only before children that hold parameters, so no stage after the first is left
    without parameters to train (a pipeline stage without any would have nothing to optimize)."""
    children = list(model.named_children())
    weights = [sum(p.numel() for p in m.parameters()) for _, m in children]
    candidates = [i for i in range(1, len(children)) if weights[i] > 0]
    n = min(n_stages, len(candidates) + 1)
    if n <= 1:
        return []
    total = sum(weights)
    points: List[str] = []
    acc = 0
    for i, (name, _) in enumerate(children):
        if i in candidates and len(points) < n - 1:
            share_done = acc >= (len(points) + 1) * total / n
            must_cut = len([c for c in candidates if c >= i]) <= n - 1 - len(points)
            if share_done or must_cut:
                points.append(name)
        acc += weights[i]
    return points


def stage_of_modules(model, split_points: Sequence[str]) -> Dict[str, int]:
    """Stage index of every module (pre-order): each split point starts a new stage."""
    names = dict(model.named_modules())
    missing = [p for p in split_points if p not in names]
    if missing:
        top = ", ".join(n for n, _ in model.named_children())
        raise ValueError(f"split_points {missing} name no module of the model; top-level modules: {top}")
    points, stage, out = set(split_points), 0, {}
    for name, _ in model.named_modules():
        if name in points:
            stage += 1
        out[name] = stage
    return out


def place_stages(model, split_points: Sequence[str], devices: Sequence) -> List[List[str]]:
    """Move each module's own tensors to its stage's device, and move every module's inputs to its
    device before it runs (a forward pre-hook): the model's own forward, glue ops included, runs
    across the devices unchanged, as in the seed's ModelParallelResNet50."""
    stage_of = stage_of_modules(model, split_points)
    n = max(stage_of.values()) + 1
    for name, mod in model.named_modules():
        dev = devices[stage_of[name] % len(devices)]
        has_own = any(True for _ in mod.parameters(recurse=False)) or any(True for _ in mod.buffers(recurse=False))
        if not has_own:
            continue
        mod._apply(lambda t, d=dev: t.to(d), recurse=False)

        def hook(module, args, kwargs, d=dev):
            return tree_to(args, d), tree_to(kwargs, d)

        mod.register_forward_pre_hook(hook, with_kwargs=True)
    stages: List[List[str]] = [[] for _ in range(n)]
    for name, _ in model.named_children():
        stages[stage_of[name]].append(name)
    return stages


class StagedRunner(Runner):
    """model_parallel, and the seed's pipelined version: the global batch in micro-batches of
    ``split_size`` through the staged model, outputs concatenated, one loss (CUDA's asynchronous
    launches overlap the stages)."""

    outputs_comparable = True

    def __init__(self, model, opts, ctx, loss_fn, optimizer_fn, example, world):
        super().__init__(model, opts, ctx, loss_fn, optimizer_fn, example, world)
        import torch

        if ctx.device_type == "cuda" and ctx.devices:
            devices = list(ctx.devices)
        else:
            devices = [torch.device("cpu")] * max(1, world)  # emulated: stages share the CPU
        points = opts["split_points"]
        if points is None:
            points = auto_split_points(model, len(devices))
        self.stages = place_stages(model, points, devices)
        self.module = model
        self.optimizer = optimizer_fn(model.parameters())
        self.split_size = opts.get("split_size")

    def sum_order(self, batch: int) -> Optional[SumOrder]:
        size = self.split_size
        return SumOrder("concat", chunk=size) if size and size < batch else None

    def forward_backward(self, inputs, targets):
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        b = batch_len(inputs)
        size = self.split_size or b
        self.microbatches = -(-b // size)
        chunks = [tree_index(inputs, slice(i, i + size)) for i in range(0, b, size)]
        outs = [call_model(self.module, c) for c in chunks]
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        loss = self.loss_fn(out, tree_to(targets, out.device))
        loss.backward()
        return loss.detach(), out.detach()


class DistributedPipelineRunner(Runner):
    """One stage per rank, torch.distributed.pipelining with ScheduleGPipe or Schedule1F1B.

    An ``nn.Sequential`` is cut by slicing (cheap, names kept); any other model is traced with
    ``pipeline()`` and ``SplitPoint.BEGINNING`` (needs torch.export to capture it whole)."""

    def __init__(self, model, opts, ctx, loss_fn, optimizer_fn, example, world):
        super().__init__(model, opts, ctx, loss_fn, optimizer_fn, example, world)
        import torch
        import torch.distributed.pipelining as pp

        dev = ctx.device()
        inputs, _ = example
        b = batch_len(inputs)
        if opts["n_microbatches"]:
            self.microbatches = opts["n_microbatches"]
        elif opts["split_size"]:
            self.microbatches = -(-b // opts["split_size"])
        else:
            self.microbatches = max(2, self.world_size)
        points = opts["split_points"]
        if points is None:
            points = auto_split_points(model, self.world_size)
        if len(points) != self.world_size - 1:
            raise ValueError(
                f"a pipeline over {self.world_size} ranks needs {self.world_size - 1} split point(s) "
                f"(one stage per rank), got {list(points)}"
            )
        if isinstance(model, torch.nn.Sequential):
            names = list(model._modules)
            missing = [p for p in points if p not in names]
            if missing:
                raise ValueError(f"split_points {missing} are not children of the nn.Sequential: {names}")
            cuts = [0] + [names.index(p) for p in points] + [len(names)]
            stage_mod = model[cuts[self.rank]:cuts[self.rank + 1]].to(dev)
            self.stages = [names[cuts[i]:cuts[i + 1]] for i in range(self.world_size)]
            stage = pp.PipelineStage(stage_mod, self.rank, self.world_size, dev)
        else:
            mb = split_micro(inputs, self.microbatches)[0]
            mb_args = tuple(mb) if isinstance(mb, (tuple, list)) else (mb,)
            pipe = pp.pipeline(model, mb_args=mb_args,
                               split_spec={p: pp.SplitPoint.BEGINNING for p in points})
            stage = pipe.build_stage(self.rank, dev)
            stage_mod = pipe.get_stage_module(self.rank)
            self.stages = [[f"from {p}"] for p in ["the input"] + list(points)]
        self.module = stage_mod
        sched_cls = pp.ScheduleGPipe if opts["schedule"] == "gpipe" else pp.Schedule1F1B
        self.schedule = sched_cls(stage, n_microbatches=self.microbatches, loss_fn=loss_fn)
        params = list(stage_mod.parameters())
        self.optimizer = optimizer_fn(params) if params else None  # a stage of only ReLUs and pools
        self.device = dev

    def sum_order(self, batch: int) -> Optional[SumOrder]:
        return SumOrder("microbatches", self.microbatches) if self.microbatches > 1 else None

    def optimizer_step(self):
        if self.optimizer is not None:
            self.optimizer.step()

    def forward_backward(self, inputs, targets):
        import torch
        import torch.distributed as dist

        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        first, last = self.rank == 0, self.rank == self.world_size - 1
        x = tree_to(inputs, self.device)
        args = tuple(x) if isinstance(x, (tuple, list)) else (x,)
        losses: list = []
        kwargs = {"target": tree_to(targets, self.device), "losses": losses} if last else {}
        self.schedule.step(*(args if first else ()), **kwargs)
        # float64 on every rank: the others do not know the loss's dtype, and fp64 adds no roundoff
        loss = torch.stack([l.detach().double() for l in losses]).mean().reshape(1) if last else \
            torch.zeros(1, dtype=torch.float64, device=self.device)
        dist.broadcast(loss, src=self.world_size - 1)
        return loss, None

    def _gather(self, get):
        import torch.distributed as dist

        mine = {n: (t.detach().cpu() if t is not None else None) for n, t in get(self.module).items()}
        parts = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, parts, dst=0)
        if self.rank != 0:
            return None
        merged: Dict[str, Any] = {}
        for part in parts:
            merged.update(part)
        return merged

    def grads(self):
        return self._gather(lambda m: {n: p.grad for n, p in m.named_parameters()})

    def params(self):
        return self._gather(lambda m: dict(m.named_parameters()))

    def buffers(self):
        return self._gather(lambda m: dict(m.named_buffers()))
