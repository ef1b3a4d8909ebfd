"""The ``log(model, loss)`` that the user's own training loops call once per step (inside ranks).

It records the loss, every gradient and every parameter under the model's own names: wrappers
are looked through (DDP and DataParallel's ``module``, torch.compile's ``_orig_mod``, FSDP1's
``_fsdp_wrapped_module``, activation checkpointing's ``_checkpoint_wrapped_module``) and sharded
tensors (DTensor, FSDP) are gathered to full ones, so that a DDP replica, an FSDP shard and a plain
one-device model all report ``fc1.weight``. Gathering is a collective: every rank logs the same
steps anyway, so they meet there.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ...timing.structure.counter import quiet
from ..gather import full_tensor, full_tensors
from ..layout.names import holders
from .where import frozen

# Path components that only wrappers add: dropped from every name.
WRAPPER_PARTS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_forward_module"})


@dataclass
class StepLog:
    """One step (a ``log(model, loss)`` call, or one ``optimizer.step()``): CPU copies, after
    backward and before the optimizer step."""

    loss: float
    grads: Dict[str, Any]  # name -> tensor, or None where the parameter got no gradient
    params: Dict[str, Any]
    rows: List[float] = field(default_factory=list)  # fingerprints of the input rows (watch.py)
    backwards: int = 1  # scalars backpropagated in this step (0: none on this rank; > 1: accumulation)
    lrs: List[float] = field(default_factory=list)  # the optimizer's learning rate per param group
    clips: List[Tuple[float, float, bool]] = field(default_factory=list)  # (total norm, max_norm, of DTensors) per clip
    state: Tuple[int, float] = (0, -1.0)  # the optimizer's state before the step: (tensors with state, step count)
    hyper: List[Dict[str, float]] = field(default_factory=list)  # per param group: its other numeric options
    untrained: Dict[str, float] = field(default_factory=dict)  # state no optimizer steps: name -> fingerprint
    raw_norm: float = float("nan")  # the total gradient norm the step's last backward pass left (before clipping)
    zeroed: List[int] = field(default_factory=list)  # backward passes before which every gradient was zero again
    modes: Tuple[int, int] = (0, 0)  # (in eval mode, in all) among the BatchNorm and dropout modules
    where: Dict[str, Tuple[str, ...]] = field(default_factory=dict)  # hook kind -> "file:line" in the loop (where.py)
    scaler: Tuple[float, Tuple[str, ...]] = (float("nan"), ())  # a GradScaler's scale; the step's scale/backward/unscale_/clip calls in order
    chunks: Dict[int, List[float]] = field(default_factory=dict)  # k -> the rows' k equal parts' fingerprints
    probes: List[Any] = field(default_factory=list)  # the first step's outputs and their gradients (probe.py)
    metrics: List[float] = field(default_factory=list)  # scheduler.step(metric) calls since the previous step

    def __reduce__(self):
        """Crosses back packed: every tensor of a step in one flat buffer per dtype. Measured on the
        minGPT-like trainer, 20 steps: 1,160 small tensors pickled and unpickled in 0.25 s, packed in
        0.02 s (a parity call moves one such record per rank, and one for the reference)."""
        return unpack_step, (self.loss, pack(self.grads), pack(self.params), self.rows, self.backwards, self.lrs,
                             self.clips, self.state, self.hyper, self.untrained, self.raw_norm, self.zeroed, self.modes,
                             self.where, self.scaler, self.chunks, self.probes, self.metrics)


def pack(tensors: Dict[str, Any]):
    """name -> tensor (or None) as (names, [(dtype, shape, offset) or None], {dtype: flat buffer})."""
    import torch

    metas: List[Optional[Tuple[str, Tuple[int, ...], int]]] = []
    chunks: Dict[str, List[Any]] = {}
    sizes: Dict[str, int] = {}
    for t in tensors.values():
        if t is None:
            metas.append(None)
            continue
        key = str(t.dtype)
        metas.append((key, tuple(t.shape), sizes.get(key, 0)))
        sizes[key] = sizes.get(key, 0) + t.numel()
        chunks.setdefault(key, []).append(t.reshape(-1))
    return list(tensors), metas, {k: raw(torch.cat(v)) for k, v in chunks.items()}


def raw(flat):
    """A CPU buffer as (dtype, its bytes): rebuilt in 2 us where a pickled tensor takes 0.1-0.6 ms
    (torch's rebuild looks for a fake mode on the stack), the same bits. Other devices, and torch
    without numpy, as they are."""
    import torch

    if flat.device.type != "cpu":
        return flat
    try:
        return flat.dtype, flat.detach().view(torch.uint8).numpy().tobytes()
    except RuntimeError:  # torch without numpy ("Numpy is not available"): the tensor pickles as before
        return flat


def rebuilt(flat):
    import torch

    if isinstance(flat, torch.Tensor):
        return flat
    dtype, data = flat
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype)


def unpack(packed) -> Dict[str, Any]:
    """``pack``'s tensors again: views of each dtype's buffer, cut by one ``split`` per buffer (the
    pieces lie in order, one after the other)."""
    import torch

    names, metas, flats = packed
    flats = {k: rebuilt(v) for k, v in flats.items()}
    sizes: Dict[str, List[int]] = {}
    for meta in metas:
        if meta is not None:
            n = 1
            for d in meta[1]:
                n *= d
            sizes.setdefault(meta[0], []).append(n)
    pieces = {k: iter(torch.split(flats[k], v)) for k, v in sizes.items()}
    return {name: None if meta is None else next(pieces[meta[0]]).view(meta[1]) for name, meta in zip(names, metas)}


def unpack_step(loss: float, grads, params, rows, backwards=1, lrs=(), clips=(), state=(0, -1.0), hyper=(),
                untrained=None, raw_norm=float("nan"), zeroed=(), modes=(0, 0), where=None,
                scaler=(float("nan"), ()), chunks=None, probes=(), metrics=()) -> "StepLog":
    return StepLog(loss, unpack(grads), unpack(params), rows, backwards, list(lrs), list(clips), tuple(state),
                   list(hyper), dict(untrained or {}), raw_norm, list(zeroed), tuple(modes), dict(where or {}),
                   (scaler[0], tuple(scaler[1])), dict(chunks or {}), list(probes), list(metrics))


@dataclass
class SideLog:
    """Everything one side (one rank, or the reference) logged, and what its model contains."""

    steps: List[StepLog] = field(default_factory=list)
    batchnorm: List[str] = field(default_factory=list)  # BatchNorm modules in training mode (not Sync)
    dropout: List[str] = field(default_factory=list)  # active dropout modules
    final: Dict[str, Any] = field(default_factory=dict)  # parameters after the last step
    dtype: str = ""  # the stepped parameters' dtype at step 0
    autocast: str = ""  # the dtype autocast computed in ("" if off)
    loss_dtype: str = ""  # the dtype of the loss backpropagated (bfloat16 under FSDP's param_dtype=bf16)
    tensor_parallel: bool = False  # DTensor parameters, not FSDP's: every rank must see the same rows
    dtensors: bool = False  # DTensor parameters of any kind (FSDP2's too)
    reduce_dtype: str = ""  # the precision gradients are reduced in, where below the parameters' (a bf16 comm hook)
    reduced_by: str = ""  # what reduces them so: "DDP's bf16_compress_hook", "FSDP's MixedPrecision(reduce_dtype=...)"
    foreign: List[str] = field(default_factory=list)  # stepped parameters of no module run forward
    unstepped: List[str] = field(default_factory=list)  # trained model's parameters no optimizer steps
    set_epoch_calls: int = 0  # DistributedSampler.set_epoch calls seen
    recomputed: bool = False  # modules ran forward inside backward (activation checkpointing)
    batchnorm_rows: int = 0  # the most rows one call of a training-mode BatchNorm (not Sync) took
    recurrent: str = ""  # "time-major" or "batch-first" where a model run forward holds an RNN/LSTM/GRU
    sampler_passes: int = 0  # passes over a DistributedSampler seen (0: none used)
    uncounted: int = 0  # optimizer steps that changed nothing (lr 0, no gradient): not steps
    scaler_found: List[bool] = field(default_factory=list)  # per GradScaler.step call: it skipped (inf/NaN found)
    scalers_made: int = 0  # enabled GradScalers the loop constructed (more than one: each starts over)
    scaled_clips: int = 0  # clip_grad_norm_ calls after scaler.scale(loss) and before scaler.unscale_
    tp_peers: List[int] = field(default_factory=list)  # ranks that share this one's batch (TP/SP dims)
    holders: List[str] = field(default_factory=list)  # name prefixes of modules holding the whole model (wrappers)
    aliases: Dict[str, str] = field(default_factory=dict)  # a tied parameter's other names -> the name it is recorded by
    start: Dict[str, float] = field(default_factory=dict)  # state no optimizer steps before the first forward

    @property
    def scaler_skips(self) -> int:
        """GradScaler.step calls that skipped the optimizer step (inf/NaN in the scaled gradients)."""
        return sum(self.scaler_found)


def grad_of(p):
    """The gradient a parameter's optimizer steps with: ``.grad``, or where that is None, Megatron's fp32
    ``main_grad`` (its DDP accumulates into that buffer and its optimizer reads it)."""
    return p.grad if p.grad is not None else getattr(p, "main_grad", None)


def clean_name(name: str) -> str:
    return ".".join(p for p in name.split(".") if p not in WRAPPER_PARTS)


def unwrap(model):
    """The user's module inside DDP / DataParallel / torch.compile wrappers."""
    import torch

    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def full_copy(t):
    """A CPU copy of the whole tensor: DTensors (FSDP2, tensor parallel) are gathered first."""
    if t is None:
        return None
    return cpu_copy(full_tensor(t))


def cpu_copy(t):
    """``t.detach().to("cpu", copy=True)``: the same bits and strides; a CPU tensor is cloned, which
    parses fewer arguments (58 copies a step on the minGPT-like trainer: 0.38 ms against 0.65 ms)."""
    t = t.detach()
    if t.is_sparse:  # an nn.Embedding(sparse=True)'s gradient: recorded as the dense tensor it adds up to
        return t.to_dense().to("cpu")
    return t.clone() if t.device.type == "cpu" else t.to("cpu", copy=True)


def full_copies(ts: List[Any]) -> List[Any]:
    """``[full_copy(t) for t in ts]``, the DTensors among them gathered together (``full_tensors``)."""
    present = [i for i, t in enumerate(ts) if t is not None]
    out: List[Any] = [None] * len(ts)
    for i, whole in zip(present, full_tensors([ts[i] for i in present])):
        out[i] = cpu_copy(whole)
    return out


def fsdp1_full_params(model, modules: Optional[List[Any]] = None):
    """FSDP1 keeps flat shards: unshard them (with gradients) while we read. Looked up only if the
    user imported FSDP, so that plain loops do not pay for importing it. ``modules``: ``model.modules()``
    where the caller has them already."""
    if "torch.distributed.fsdp" not in sys.modules:
        return contextlib.nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = [m for m in (model.modules() if modules is None else modules) if isinstance(m, FSDP)]
    if not units or not all(getattr(m, "_use_orig_params", True) for m in units):
        return contextlib.nullcontext()  # use_orig_params=False: its flat parameters are read by fsdp1_flat
    return FSDP.summon_full_params(model, with_grads=True, writeback=False)


class Recorder:
    """The ``log`` callable: ``log(model, loss)`` once per step."""

    def __init__(self, watch=None, on_first=None):
        self.side = SideLog()
        self.watch = watch  # watch.Watch: the input rows of each step (None: not recorded)
        self.on_first = on_first  # called with the SideLog after the first step (the shadow's check)

    def __call__(self, model, loss) -> None:
        with quiet():  # our gathers (and reading a DTensor loss): not the loop's collectives
            self._record(model, loss)
        if self.watch is not None:
            self.watch.census.clear()  # the next step's forward passes walk the trees again

    def _record(self, model, loss) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"log(model, loss): model must be an nn.Module, got {type(model).__name__}")
        loss_t = torch.as_tensor(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        if loss_t.numel() != 1:
            raise ValueError(f"log(model, loss): loss must be a scalar, got shape {tuple(loss_t.shape)}")
        with fsdp1_full_params(model):
            named = [(clean_name(n), p) for n, p in unwrap(model).named_parameters()]
            copies = full_copies([grad_of(p) for _, p in named] + [p for _, p in named])
            grads = {n: copies[i] for i, (n, _) in enumerate(named)}
            params = {n: copies[len(named) + i] for i, (n, _) in enumerate(named)}
        if not self.side.steps:
            describe(self.side, [("", model)], params)
            self.side.loss_dtype = dtype_name(loss_t.dtype)
        seen = self.watch.take_inputs() if self.watch is not None else None
        step = StepLog(float(loss_t.reshape(()).double().item()), grads, params, seen.rows if seen else [])
        step.where = frozen(seen.where) if seen else {}
        step.chunks = seen.chunks if seen else {}
        self.side.steps.append(step)
        if self.on_first and len(self.side.steps) == 1:
            self.on_first(self.side)


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def describe(side: SideLog, models: List[Tuple[str, Any]], params: Dict[str, Any]) -> None:
    """What a side's model(s) contain, read once at the first step: BatchNorm in training mode,
    active dropout, DTensor parameters that are not FSDP's (tensor parallel), the dtype.
    ``models``: (name prefix, module) pairs, named as the recorded parameters are."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd

    for prefix, model in models:
        side.holders += [prefix + h for h in holders(unwrap(model), clean_name)]
        first: Dict[int, str] = {}
        for name, p in unwrap(model).named_parameters(remove_duplicate=False):  # tied weights: one tensor, two names
            name = prefix + clean_name(name)
            if first.setdefault(id(p), name) != name:
                side.aliases[name] = first[id(p)]
        for name, m in unwrap(model).named_modules():
            name = prefix + clean_name(name)
            if isinstance(m, _BatchNorm) and m.training and not isinstance(m, torch.nn.SyncBatchNorm):
                side.batchnorm.append(name)
            if isinstance(m, _DropoutNd) and m.training and m.p > 0:
                side.dropout.append(name)
        fsdp = any(type(m).__name__.startswith("FSDP") for m in model.modules())
        dtensor = any(hasattr(p, "full_tensor") for p in model.parameters())
        side.tensor_parallel = side.tensor_parallel or (dtensor and not fsdp)
        side.dtensors = side.dtensors or dtensor
        if not side.reduce_dtype:
            side.reduce_dtype, side.reduced_by = lossy_reduction(model)
    some = next((t for t in params.values() if t is not None), None)
    side.dtype = dtype_name(some.dtype) if some is not None else ""


def lossy_reduction(model) -> Tuple[str, str]:
    """(dtype, what) where a wrapper reduces gradients in a lower precision than they are kept in:
    DDP's fp16/bf16 compression hooks (registered or built in), FSDP1's ``MixedPrecision(reduce_dtype=)``."""
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.parallel.DistributedDataParallel):
            names = [getattr(h, "__qualname__", getattr(h, "__name__", "")) for h, _ in getattr(m, "_comm_hooks", [])]
            try:
                names.append(str(m._get_ddp_logging_data().get("comm_hook", "")))
            except Exception:  # noqa: BLE001 - the logging data is a diagnostic, absent in some builds
                pass
            for name in names:
                low = name.lower()
                if "bf16" in low or "fp16" in low:
                    hook = name.split(".")[0] or name
                    return ("bfloat16" if "bf16" in low else "float16"), f"DDP's {hook}"
        policy = getattr(m, "mixed_precision", None)
        reduce = getattr(policy, "reduce_dtype", None)
        if reduce in (torch.bfloat16, torch.float16):
            return dtype_name(reduce), f"FSDP's MixedPrecision(reduce_dtype={dtype_name(reduce)})"
    return "", ""


def record(fn, args: tuple, kwargs: dict, steps: int) -> SideLog:
    """Run ``fn(log, *args, steps=steps, **kwargs)`` and return what it logged."""
    log = Recorder()
    fn(log, *args, steps=steps, **kwargs)
    return log.side
