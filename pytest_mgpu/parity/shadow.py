"""The reference's companions: the one-device reference trained again beside it, from the same
initial weights on the same batches, in float64 (the shadow) and in the strategy's summation order
(the twin). Their distances from the reference measure the model's own roundoff.

Why: ``||reference32 - shadow64||`` is the model's own float32 roundoff at that step, measured,
not guessed. A fixed rule (rtol = sqrt(eps) x sqrt(partial sums)) cannot fit every model: measured
here, MobileNetV2-GroupNorm's float32/float64 gap grows from 2.8e-6 at step 0 to 1.9e-3 at step 1
(one SGD step makes it ~1000x more sensitive), 4x above the fixed rule, so a correct DDP run failed
on one CPU and passed on another; a pipeline with its micro-batches in the wrong order moved the
gradients by 1.6e-4, under the fixed rule, and passed. With the shadow, the line follows the model.

Runs in rank 0 (or the one process of a single-process strategy), inside the same loop as the
reference. Cost (measured, 1 thread): a float64 step is 2x (MLP, ResNet50) to 4x (MobileNetV2-GN)
a float32 one on CPU, because oneDNN has no float64 convolutions.
"""
from __future__ import annotations

import copy
import math
from typing import Dict, Optional, Tuple

from .batches import batch_len, call_model, shard_indices, split_micro, to_float64, tree_index, tree_to
from .judge.distance import gap
from .records import StepRecord


class _Companion:
    """A copy of the reference model and optimizer, trained beside it on the same batches; its
    distance from the reference, per tensor and step, is one measurement of the model's roundoff.

    If anything about it fails (a model that hard-codes float32, a device without float64), it
    retires itself with the reason, and the parity run is judged without it; the report says so."""

    what = "companion"

    def __init__(self, reference, optimizer_fn, dtype=None):
        model = copy.deepcopy(reference)
        self.model = model.to(dtype) if dtype is not None else model
        self.optimizer = optimizer_fn(self.model.parameters())
        self.failed: Optional[str] = None
        self.loss = self.out = None

    @classmethod
    def build(cls, reference, optimizer_fn, *args) -> Tuple[Optional["_Companion"], str]:
        try:
            return cls(reference, optimizer_fn, *args), ""
        except Exception as exc:  # noqa: BLE001 - any failure means: no companion, say why
            return None, f"no {cls.what} ({type(exc).__name__}: {exc})"

    def forward_backward(self, loss_fn, inputs, targets, device) -> None:
        if self.failed:
            return
        try:
            self.optimizer.zero_grad(set_to_none=True)
            self.loss, self.out = self._forward_backward(loss_fn, inputs, targets, device)
        except Exception as exc:  # noqa: BLE001
            self.failed = f"the {self.what} failed ({type(exc).__name__}: {exc})"

    def _forward_backward(self, loss_fn, inputs, targets, device):
        raise NotImplementedError

    def step(self) -> None:
        if not self.failed:
            try:
                self.optimizer.step()
            except Exception as exc:  # noqa: BLE001
                self.failed = f"the {self.what}'s optimizer failed ({type(exc).__name__}: {exc})"

    def gaps_before_step(self, ref_loss, ref_out, reference) -> Dict[Tuple[str, str], float]:
        """The reference's distance from this companion: loss, output and gradients (after backward)."""
        if self.failed:
            return {}
        gaps = {("loss", "loss"): gap(ref_loss.reshape(()), self.loss.reshape(())),
                ("output", "output"): gap(ref_out, self.out)}
        mine = dict(self.model.named_parameters())
        for name, p in reference.named_parameters():
            gaps[("grad", name)] = gap(p.grad, mine[name].grad)
        return gaps

    def gaps_after_step(self, reference) -> Dict[Tuple[str, str], float]:
        """Parameters and buffers after the optimizer step."""
        if self.failed:
            return {}
        gaps = {}
        for kind, ours, theirs in (("param", reference.named_parameters(), self.model.named_parameters()),
                                   ("buffer", reference.named_buffers(), self.model.named_buffers())):
            mine = dict(theirs)
            for name, t in ours:
                gaps[(kind, name)] = gap(t, mine.get(name))
        return gaps


class Shadow(_Companion):
    """The reference in float64: ``||reference32 - shadow64||`` is the float32 roundoff of the model.

    Built by deep-copying the freshly built reference (the float32 init is exactly representable in
    float64). What it misses, measured: a ReLU/max kink is continuous in the forward and jumps in the
    backward, so a float32 run that flips one (DDP on 4 ranks, ResNet18-GN, step 2: 4.0e-3) sits far
    above a shadow that did not (2e-6); and float32 kernels can share an error that float64 lacks
    (ResNet18-GN, seed 1, step 0: float32 vs float64 3.5% median over tensors, DDP vs float32 1e-6).
    Hence the twin below, and the line uses the larger of the two."""

    what = "float64 shadow"

    def __init__(self, reference, optimizer_fn):
        import torch

        super().__init__(reference, optimizer_fn, torch.float64)

    def _forward_backward(self, loss_fn, inputs, targets, device):
        import torch

        out = call_model(self.model, to_float64(tree_to(inputs, device)))
        loss = loss_fn(out, to_float64(tree_to(targets, out.device)))
        if loss.dtype != torch.float64:
            raise TypeError(f"the loss came out as {loss.dtype} from a float64 model")
        loss.backward()
        return loss.detach(), out.detach()


class Twin(_Companion):
    """The reference in its own dtype, adding the strategy's partial sums in the strategy's order in
    one process (``SumOrder``: the same DistributedSampler shards, the same micro-batches).

    Its forward on a shard is the strategy rank's forward on that shard, so it meets the kinks the
    strategy meets: measured, DDP x4 of ResNet18-GN and a one-process twin of its 4 shards both
    jumped to 4.01e-3 at step 2. It also shares any model-level trap (BatchNorm statistics per
    shard, dropout, a 'sum' loss, padding): those move the step-0 loss, and the judge trusts a twin
    only when its step-0 loss is within the line (``tolerance.twin_qualifies``)."""

    what = "float32 twin in the strategy's order"

    def __init__(self, reference, optimizer_fn, order):
        super().__init__(reference, optimizer_fn)
        self.order = order

    def _forward_backward(self, loss_fn, inputs, targets, device):
        import torch

        x, y = tree_to(inputs, device), tree_to(targets, device)
        order, b = self.order, batch_len(x)
        if order.kind == "concat":
            chunks = [tree_index(x, slice(i, i + order.chunk)) for i in range(0, b, order.chunk)]
            out = torch.cat([call_model(self.model, c) for c in chunks])
            loss = loss_fn(out, y)
            loss.backward()
            return loss.detach(), out.detach()
        if order.kind == "shards":
            pieces = [(tree_index(x, idx), tree_index(y, idx)) for idx in
                      (shard_indices(b, order.parts, r) for r in range(order.parts))]
        else:  # "microbatches"
            pieces = list(zip(split_micro(x, order.parts), split_micro(y, order.parts)))
        pieces = [mb for xs, ys in pieces for mb in zip(split_micro(xs, order.accumulate),
                                                        split_micro(ys, order.accumulate))]
        total = 0.0
        for xm, ym in pieces:
            loss = loss_fn(call_model(self.model, xm), ym) / len(pieces)
            loss.backward()
            total = total + loss.detach()
        return total, None


def attach_floors(rec: StepRecord, shadow: Dict[Tuple[str, str], float],
                  twin: Dict[Tuple[str, str], float]) -> None:
    """Write each tensor's gaps into its error record (the judge pools them per step)."""
    for e in rec.errors:
        e.floor = shadow.get((e.kind, e.name), math.nan)
        e.twin = twin.get((e.kind, e.name), math.nan)
