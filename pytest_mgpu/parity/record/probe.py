"""The model's outputs at the first step, and the gradient the loss gave them: what tells a loss
computed otherwise from a forward computed otherwise.

At the first recorded step, each training forward of an outermost model whose first output (a
tensor, the first of a tuple, ``logits`` or the first value of a mapping) has one row per input row
gets a ``Probe``: the input rows' fingerprints, a fingerprint and norm per output row, and, once
backward reaches that output, its gradient per row and position (``[rows, positions, width]``: ``[rows, classes, *space]``'s pixels are its positions;
float64 on the CPU). A last dimension wider than ``WIDTH`` is projected on ``WIDTH`` fixed
vectors: linear, so a row scaled, zeroed or shifted stays so. The test process maps rows to the
reference's by their fingerprints and compares (``evidence/outputs.py``).
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

WIDTH = 8  # a wider last dimension is projected on this many fixed vectors
_running = [0]  # torch.autograd.backward calls under way (the watch's): a loss's backward


@contextlib.contextmanager
def loss_backward():
    """Marks a ``torch.autograd.backward`` under way. A probe keeps only the gradients that reach its
    output there: ``torch.autograd.grad``'s (a gradient penalty's ``grad_outputs``) are no loss's."""
    _running[0] += 1
    try:
        yield
    finally:
        _running[0] -= 1


@dataclass
class Probe:
    """One forward call's rows, its outputs per row (fingerprint, norm), and d loss / d output."""

    rows: List[float]
    out: List[Tuple[float, float]]
    grad: Any = None  # float64 [rows, positions, width] once backward reached the output
    shape: Tuple[int, ...] = field(default_factory=tuple)  # the output's shape
    outs: Any = None  # the output condensed as the gradient is: its positions, for parts of rows (a sequence split)
    open: bool = True  # its step is under way: a gradient that reaches it later is another step's
    trail: List[Any] = field(default_factory=list)  # its submodule calls' inputs and outputs per row (trail.py)
    ops: List[Any] = field(default_factory=list)  # the calls that made the loss from it (loss_ops.py)


@functools.lru_cache(maxsize=16)
def basis(n: int):
    """``n`` x ``WIDTH`` fixed float64 vectors, all entries distinct."""
    import torch

    i = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    k = torch.arange(WIDTH, dtype=torch.float64).unsqueeze(0)
    return torch.cos(i * (0.7071 + 0.37 * k) + 0.3 * k) + 1.5 + 0.1 * k


def first_output(output) -> Any:
    """The tensor a loss is most likely computed from: the output itself, the first tensor of a
    tuple or list, a mapping's ``logits`` (transformers' outputs) or its first tensor value."""
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        if isinstance(output.get("logits"), torch.Tensor):
            return output["logits"]
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return next((t for t in output if isinstance(t, torch.Tensor)), None)
    return None


def condensed(t) -> Any:
    """``t`` as float64 ``[rows, positions, width]`` on the CPU, its last dimension projected where wide."""
    import torch

    x = t.detach().to("cpu", torch.float64)
    n = x.shape[0]
    if x.dim() >= 4:  # [rows, channels, *space] (a dense prediction): the pixels are the positions
        x = x.movedim(1, -1)
    x = x.reshape(n, 1, -1) if x.dim() <= 2 else x.reshape(n, -1, x.shape[-1]) if x.dim() >= 4 else \
        x.reshape(n, x.shape[1], -1)
    return x @ basis(x.shape[2]) if x.shape[2] > WIDTH else x


def attach(output, rows: List[float]) -> Optional[Probe]:
    """A probe of ``output`` whose gradient is kept when backward reaches it; None where the output
    has no row per input row, no gradient, or is sharded (a DTensor)."""
    t = first_output(output)
    if t is None or not t.is_floating_point() or not t.requires_grad or t.dim() == 0 or t.shape[0] != len(rows) \
            or hasattr(t, "full_tensor") or t.numel() == 0:
        return None
    x = condensed(t)
    flat = x.reshape(x.shape[0], -1)
    prints = flat @ basis(flat.shape[1])[:, 0]
    probe = Probe(list(rows), [(float(p), float(q)) for p, q in zip(prints, flat.norm(dim=1))], shape=tuple(t.shape),
                  outs=x)

    def keep(grad):
        if not probe.open or grad is None or not _running[0]:  # none reached it from a loss's backward
            return
        g = condensed(grad)
        probe.grad = g if probe.grad is None or probe.grad.shape != g.shape else probe.grad + g

    t.register_hook(keep)
    return probe
