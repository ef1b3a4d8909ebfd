"""The reference loop's companions in ``assert_same_training``: the user's one-device loop run again,
in the same process, from the same seed, so that its distance from the reference measures how far
the model lets roundoff grow, step by step, over the whole run. The loops cannot be re-synchronized
(they are the user's, not ours), so the floor must grow with the run as the model's own chaos does.

- The **float64 shadow**: the default dtype set to float64, every random op drawing as float32
  would (``nn.Linear(20, 32)`` built under both dtypes after ``manual_seed(0)`` differs by 0.42 in
  its weights otherwise) and widening. It runs as ``float64_kernels`` (the random ops' own kernels
  replaced while it runs, every other op untouched); ``float64_dispatch`` is the same rule as a
  dispatch mode, which sends every op through Python (measured on the minGPT-like trainer, 20 steps
  with dropout, one thread: the bare float64 loop 0.10 s, the mode 0.23 s, the kernels 0.12 s; the
  same records to the bit). A loop that pins its dtype (``nn.Linear(..., dtype=torch.float32)``,
  ``.float()``, ``.to(torch.bfloat16)``) keeps it and the float64 run fails (a parameter stayed
  float32, or the loop raised); only then is the loop run again under the mode, which remembers
  the pinning ops with the user's line (until ``PINS_KEPT`` of them), and the report names them.
- The **same-precision twin** (``split_sums``): the loop in its own dtype, every matrix product's
  inner sum (``mm``, ``addmm``, ``bmm``) taken as two halves, and every convolution's weight
  gradient as the batch's two halves accumulated: an equivalent run that only changes the summation
  order, which is what a data-parallel or tensor-parallel run changes. It needs nothing of the model,
  so it runs where the shadow cannot (a pinned dtype, a model in bfloat16), in that precision.
  A loop with no convolution runs it as ``split_products``: the three matrix products' own kernels
  replaced while it runs, every other op untouched, the same halves to the bit; a dispatch mode sends
  every op through Python (measured on the minGPT-like trainer, 20 steps, in two sessions: the twin
  cost 2.8-3.5x the bare loop's CPU time as a mode, 1.4-1.6x as kernels). A convolution stops that
  run at once; the mode runs it.

Measured (benchmarks/parity/parity_calibration.py --loops, 100 AdamW steps of a minGPT-like trainer, W=2
and 4, 2 seeds): where the dtype is pinned, the derived rule (no companion) failed all 8 correct
float32 and bf16-autocast runs (worst 17x the line); the twin passed them all (worst 0.08 of the line),
as close as the float64 run comes on the same model unpinned (0.076).
"""
from __future__ import annotations

import contextlib
import os
import traceback
from typing import Iterator, List

from .float64_kernels import as_float32

LOW = ("bfloat16", "float16")
PINS_KEPT = 3  # the first few pinning ops are enough to say which line pinned the dtype


def user_line() -> str:
    """The innermost frame of the user's code (not torch's, not ours): 'file.py:12 `source`'."""
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename
        if path.startswith("<") or f"{os.sep}torch{os.sep}" in path or f"{os.sep}pytest_mgpu{os.sep}" in path:
            continue
        return f"{os.path.basename(path)}:{frame.lineno} `{(frame.line or '').strip()}`"
    return "(no line of the user's code on the stack)"


@classmethod  # type: ignore[misc]  # set on the mode classes below, where it is a classmethod
def _no_dynamo_wrapper(cls) -> bool:
    """TorchDispatchMode wraps ``__torch_dispatch__`` in ``torch._disable_dynamo`` unless a subclass
    says not to; that wrapper was most of a companion's cost: measured on the minGPT-like trainer, 20
    steps, 16,384 calls through it took 0.32 s of the 0.46 s the twin spent. These modes call no
    compiled code themselves."""
    return False


class PinsFound(BaseException):
    """``float64_dispatch(pins, stop=True)`` has remembered ``PINS_KEPT`` pins: the rest of the run
    would add none to the report."""


def float64_dispatch(pins: List[str], stop: bool = False):
    """A dispatch mode under which every random op draws as it would in float32, then widens (the
    float64 run starts from the float32 run's weights and data, exactly: ``float64_kernels.as_float32``,
    the rule the shadow runs by, as kernels), and every op that asks for a floating dtype other than
    float64 (a pin) is remembered in ``pins`` with its line (``stop``: then ``PinsFound`` is raised
    once ``PINS_KEPT`` are)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seeded = torch.Tag.nondeterministic_seeded

    class Float64Run(TorchDispatchMode):
        _should_skip_dynamo = _no_dynamo_wrapper

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            dtype = kwargs.get("dtype")
            if dtype is not None and len(pins) < PINS_KEPT and isinstance(dtype, torch.dtype) \
                    and dtype.is_floating_point and dtype != torch.float64:
                pins.append(f"{user_line()} (asks for {str(dtype).replace('torch.', '')})")
                if stop and len(pins) == PINS_KEPT:
                    raise PinsFound()
            if seeded not in func.tags:  # the fast path: every op but the random ones runs as is
                return func(*args, **kwargs)
            return as_float32(func, func, args, kwargs)

    return Float64Run()


def _add(a, b):
    """a + b, low-precision partial sums added in float32 and rounded once (as an all-reduce of
    bfloat16 partial products into float32 gradients does)."""
    import torch

    if a.dtype in (torch.bfloat16, torch.float16):
        return (a.float() + b.float()).to(a.dtype)
    return a + b


def _halves_mm(op, a, b):
    """op(a, b) over the last dim of ``a`` / the matching dim of ``b``, as two halves summed."""
    k = a.shape[-1]
    h = k // 2
    return _add(op(a[..., :h], b[..., :h, :]), op(a[..., h:], b[..., h:, :]))


def split_sums():
    """The twin's dispatch mode: matrix products and convolution weight gradients summed as two
    halves (see the module docstring). Ops it does not know run unchanged."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    mm, bmm, addmm = aten.mm.default, aten.bmm.default, aten.addmm.default
    conv_bw = aten.convolution_backward.default

    class SplitSums(TorchDispatchMode):
        _should_skip_dynamo = _no_dynamo_wrapper

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in (mm, bmm) and not kwargs and args[0].shape[-1] >= 2 and args[0].is_floating_point():
                return _halves_mm(func, args[0], args[1])
            if func is addmm and args[1].shape[-1] >= 2 and args[1].is_floating_point():
                bias, a, b = args[:3]
                beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
                out = _halves_mm(mm, a, b)
                out = out * alpha if alpha != 1 else out
                return out + bias * beta if beta != 0 else out
            if func is conv_bw and args[1].shape[0] >= 2 and not kwargs:
                return _conv_backward_halves(func, args)
            return func(*args, **kwargs)

    return SplitSums()


def _conv_backward_halves(func, args):
    """convolution_backward over the batch's two halves: input gradients concatenated, weight and
    bias gradients accumulated."""
    import torch

    grad_out, inp = args[0], args[1]
    h = inp.shape[0] // 2
    first = func(grad_out[:h], inp[:h], *args[2:])
    second = func(grad_out[h:], inp[h:], *args[2:])
    gi = torch.cat([first[0], second[0]]) if first[0] is not None else None
    gw = _add(first[1], second[1]) if first[1] is not None else None
    gb = _add(first[2], second[2]) if first[2] is not None else None
    return gi, gw, gb


class Convolved(Exception):
    """``split_products`` met a convolution, whose backward it cannot split: run the mode instead."""


@contextlib.contextmanager
def split_products(convolved: List[str]) -> Iterator[None]:
    """The twin's sums without a dispatch mode: the CPU and CUDA kernels of ``mm``, ``bmm`` and
    ``addmm`` replaced while inside by ones that sum two halves (the mode's ``_halves_mm``, through
    the ops' ``out=`` overloads, which keep their own kernels), bitwise the mode's result; a
    convolution appends to ``convolved`` and raises ``Convolved``."""
    import torch

    aten = torch.ops.aten
    mm_out, bmm_out = aten.mm.out, aten.bmm.out

    def whole(op, a, b):
        return op(a, b, out=a.new_empty(0))

    def halves(op, a, b):
        h = a.shape[-1] // 2
        return _add(whole(op, a[..., :h], b[..., :h, :]), whole(op, a[..., h:], b[..., h:, :]))

    def mm(a, b):
        return halves(mm_out, a, b) if a.shape[-1] >= 2 and a.is_floating_point() else whole(mm_out, a, b)

    def bmm(a, b):
        return halves(bmm_out, a, b) if a.shape[-1] >= 2 and a.is_floating_point() else whole(bmm_out, a, b)

    def addmm(bias, a, b, *, beta=1, alpha=1):
        if not (a.shape[-1] >= 2 and a.is_floating_point()):
            return aten.addmm.out(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty(0))
        out = halves(mm_out, a, b)
        out = out * alpha if alpha != 1 else out
        return out + bias * beta if beta != 0 else out

    def convolution(*args, **kwargs):
        convolved.append(user_line())
        raise Convolved("a convolution: the twin runs as a dispatch mode")

    lib = torch.library.Library("aten", "IMPL")
    try:
        for key in ("CPU", "CUDA"):
            for name, kernel in (("mm", mm), ("bmm", bmm), ("addmm", addmm), ("convolution", convolution)):
                lib.impl(name, kernel, key)
        yield
    finally:
        lib._destroy()
