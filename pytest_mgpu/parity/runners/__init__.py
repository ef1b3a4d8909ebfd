"""How each strategy trains inside the ranks; ``registry`` names them and their options."""
from __future__ import annotations

from .base import Runner
from .data_parallel import DDPRunner, DPRunner, FSDPRunner
from .staged import DistributedPipelineRunner, StagedRunner

__all__ = ["Runner", "make_runner"]


def make_runner(name: str, opts, model, ctx, loss_fn, optimizer_fn, example, world: int) -> Runner:
    """The runner of strategy ``name`` (the registry's names), inside a rank."""
    if name == "ddp":
        cls = DDPRunner
    elif name == "fsdp":
        cls = FSDPRunner
    elif name == "dp":
        cls = DPRunner
    else:
        cls = DistributedPipelineRunner if opts.get("schedule") else StagedRunner
    return cls(model, opts, ctx, loss_fn, optimizer_fn, example, world)
