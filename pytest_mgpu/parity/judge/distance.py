"""How far one tensor is from another, in the ranks: the per-tensor error summaries that cross
back to the test process (``records.TensorError``), and the plain distance ``gap`` that the
reference's companions measure the model's roundoff with."""
from __future__ import annotations

import math
from typing import Dict, List

from ..records import Kind, TensorError


def norm(t) -> float:
    """||t||_2 without a float64 copy of ``t``.

    The tensors measured here are the model's (every gradient, parameter and buffer, every step, for
    the strategy and each companion), and float64 copies of them were most of a parity call's cost:
    measured on ResNet18-GN, DDP x2, 2 steps, ``.double()`` and float64 norms took 1.0 s of the rank's
    2.6 s; a float32 norm of 2.4M elements takes 0.3 ms against 20 ms through float64. Its relative
    error (5e-7 measured) is far below anything judged with it (lines are 16x the model's own
    roundoff). Half precision is widened to float32 first; a norm that overflows float32 on finite
    values is taken again in float64."""
    import torch

    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    n = float(torch.linalg.vector_norm(t))
    if math.isinf(n) and bool(torch.isfinite(t).all()):
        n = float(torch.linalg.vector_norm(t.double()))
    return n


def gap(a, b) -> float:
    """||a - b||_2 on ``a``'s device (NaN where either side is missing, they differ in shape, or ``a``
    is not floating). One pass instead of ``tensor_error``'s dozen: this runs on every tensor of the
    model, every step, for each companion. Two tensors of one dtype are subtracted in it: the
    difference of two floats within a factor 2 of each other is exact (Sterbenz), and a larger one
    is far above any line; a float32 tensor against its float64 shadow is subtracted in float64,
    since rounding the shadow to float32 would erase the very gap measured."""
    if a is None or b is None or a.shape != b.shape or not a.is_floating_point():
        return math.nan
    a, b = a.detach(), b.detach().to(a.device)
    if a.dtype == b.dtype:
        return norm(a - b)
    return norm(a.double() - b.double())


def _nonfinite_diff(got, ref):
    """|got - ref| where a side is not finite: equal entries (the same inf, NaN on both sides) count 0,
    any other NaN counts inf. Kept off the common path, where its five extra passes over every tensor
    of the model cost more than the rest of the summary."""
    import torch

    same = (got == ref) | (torch.isnan(got) & torch.isnan(ref))
    return torch.where(same, torch.zeros_like(ref), (got - ref).abs()).nan_to_num(nan=math.inf)


def tensor_error(kind: Kind, name: str, got, ref) -> TensorError:
    """Max abs error of ``got`` against ``ref``; a missing tensor counts as zeros (flagged)."""
    import torch

    missing = ""
    if got is None or ref is None:
        missing = "strategy" if got is None else "reference"
        present = ref if got is None else got
        got = torch.zeros_like(present) if got is None else got
        ref = torch.zeros_like(present) if ref is None else ref
    got = got.detach().to(device=ref.device, dtype=ref.dtype)
    ref = ref.detach()
    shape = tuple(ref.shape)
    if got.shape != ref.shape:
        return TensorError(kind, name, shape, math.inf, 0.0, math.nan, f"shape {tuple(got.shape)}")
    if ref.numel() == 0:
        return TensorError(kind, name, shape, 0.0, 0.0, 1.0, missing)
    if not ref.is_floating_point():
        return TensorError(kind, name, shape, float((got != ref).sum().item()), 0.0, 1.0, missing)
    diff, ref_abs = (got - ref).abs(), ref.abs()
    max_abs, scale = float(diff.max().item()), float(ref_abs.max().item())
    if not (math.isfinite(max_abs) and math.isfinite(scale)):  # NaN or inf on a side: the careful way
        diff, scale = _nonfinite_diff(got, ref), float(ref_abs.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max())
        max_abs = float(diff.max().item())
    rn, gn = norm(ref), norm(got)
    ratio = gn / rn if rn > 0 else (1.0 if gn == 0 else math.inf)
    norm_err = norm(diff)
    return TensorError(kind, name, shape, max_abs, scale, ratio, missing, norm_err=norm_err,
                       norm_ref=rn if math.isfinite(rn) else 0.0, numel=ref.numel())


def compare(kind: Kind, got: Dict, ref: Dict, skip_int: bool = True) -> List[TensorError]:
    out = []
    for name in list(ref) + [n for n in got if n not in ref]:
        r, g = ref.get(name), got.get(name)
        if r is None and g is None:
            continue
        if skip_int and any(t is not None and not t.is_floating_point() for t in (r, g)):
            continue  # num_batches_tracked and other counters
        out.append(tensor_error(kind, name, g, r))
    return out
