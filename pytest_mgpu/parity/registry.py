"""The strategies a parity run knows, as plain data read in the test process: their names, their
options and defaults, where each can run, and whether it can be bitwise equal to one device.

How each strategy trains is in ``runners`` (inside the ranks); this module imports no torch, so
that a bad strategy or option is refused before any rank starts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, Final, Literal, Optional, Tuple

# "ranks": one process per device (dist.run); "single": one process that sees every device (run_single)
Process = Literal["ranks", "single"]


@dataclass(frozen=True)
class Strategy:
    name: str
    process: Process
    options: Dict[str, Any]  # option -> default
    about: str


COMMON: Final[Dict[str, Any]] = {"check_buffers": True}  # options every strategy takes
STRATEGIES: Final[Dict[str, Strategy]] = {
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
SCHEDULES: Final = ("gpipe", "1f1b")


class StrategyError(ValueError):
    """An unknown strategy, or an option it does not take."""


def resolve(strategy: str, options: Dict[str, Any]) -> Tuple[Strategy, Dict[str, Any]]:
    """The strategy and its full option set (defaults filled in); StrategyError says what is valid."""
    __tracebackhide__ = True  # a bad strategy or option is the caller's line, not ours
    spec = STRATEGIES.get(strategy)
    if spec is None:
        known = "\n".join(f"  {s.name!r}: {s.about}" for s in STRATEGIES.values())
        raise StrategyError(f"unknown parity strategy {strategy!r}; pytest-mgpu knows:\n{known}")
    allowed = {**COMMON, **spec.options}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise StrategyError(
            f"strategy {strategy!r} takes no option(s) {', '.join(map(repr, unknown))}; its options "
            f"are: {', '.join(f'{k}={v!r}' for k, v in allowed.items())} (and loss_fn, optimizer_fn, "
            "steps, rtol, atol, deterministic)"
        )
    opts = {**allowed, **options}
    if strategy == "pipeline":
        spec = _pipeline(spec, opts)
    _check_values(strategy, opts)
    return spec, opts


def _pipeline(spec: Strategy, opts: Dict[str, Any]) -> Strategy:
    """A schedule makes the pipeline one stage per rank; without one it runs in one process."""
    sched = opts["schedule"]
    if sched is not None and str(sched).lower() not in SCHEDULES:
        raise StrategyError(f"schedule must be one of {SCHEDULES} or None (one process), got {sched!r}")
    for key in ("split_size", "n_microbatches"):
        if opts[key] is not None and (not isinstance(opts[key], int) or opts[key] < 1):
            raise StrategyError(f"{key} must be a positive integer, got {opts[key]!r}")
    if sched is None:
        return spec
    opts["schedule"] = str(sched).lower()
    return replace(spec, process="ranks")


def _check_values(strategy: str, opts: Dict[str, Any]) -> None:
    if strategy == "ddp" and (not isinstance(opts["accumulate"], int) or opts["accumulate"] < 1):
        raise StrategyError(f"accumulate must be a positive integer, got {opts['accumulate']!r}")
    if strategy == "fsdp" and opts["fsdp_version"] not in (1, 2):
        raise StrategyError(f"fsdp_version must be 1 or 2, got {opts['fsdp_version']!r}")
    sp = opts.get("split_points")
    if sp is not None and (isinstance(sp, str) or not all(isinstance(x, str) for x in sp)):
        raise StrategyError(f"split_points must be a list of module names, e.g. ['layer3'], got {sp!r}")


def unavailable(spec: Strategy, opts: Dict[str, Any], device_type: str, world_size: int,
                shared: bool = False) -> Optional[str]:
    """Why this strategy cannot run on this test's devices, or None (``shared``: ranks sharing GPUs)."""
    if spec.name == "dp" and shared:
        return ("nn.DataParallel splits a batch over distinct GPUs; under --mgpu-fallback=share this test's "
                "devices are one GPU named several times (run on 2+ GPUs)")
    if spec.name == "pipeline" and opts.get("schedule") and shared:
        return ("torch.distributed.pipelining sends activations rank to rank (send/recv), and gloo does not "
                "carry CUDA tensors that way ('writev ... Bad address'); run it on 2+ GPUs or CPU ranks")
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
    from .. import compat

    if spec.name == "fsdp" and opts.get("fsdp_version", 2) == 2 and device_type == "cpu" \
            and not compat.available("fsdp2_cpu"):
        return compat.reason("fsdp2_cpu")
    if spec.name == "pipeline" and opts.get("schedule") and not compat.available("pipeline_parity"):
        return compat.reason("pipeline_parity")
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
