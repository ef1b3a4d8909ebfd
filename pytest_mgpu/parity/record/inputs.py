"""What one step of a side's loop saw before its ``optimizer.step()`` (``watch.Watch`` fills it)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from .where import merged


@dataclass
class Inputs:
    """What one step saw before its ``optimizer.step()``: the rows its forward calls took
    (outermost modules with parameters only), the scalars it backpropagated, its gradient clipping."""

    rows: List[float] = field(default_factory=list)  # one fingerprint per input row
    calls: int = 0  # forward calls of the trained model(s) in this step (micro-batches, accumulation)
    losses: List[float] = field(default_factory=list)  # every scalar backpropagated since the last step
    pipeline: bool = False  # backpropagated by a torch.distributed.pipelining schedule (per micro-batch)
    clips: List[Tuple[float, float, bool]] = field(default_factory=list)  # (total norm, max_norm, of DTensors) per clip call
    raw_norms: List[float] = field(default_factory=list)  # per backward pass: the total gradient norm it left (NaN: sharded)
    zeroed: List[int] = field(default_factory=list)  # backward passes (1-based) before which every gradient was zero again
    where: Dict[str, List[str]] = field(default_factory=dict)  # hook kind -> "file:line" in the user's code (where.py)
    eval_rows: List[float] = field(default_factory=list)  # rows of forwards in eval mode (validation, where others train)
    scale: float = math.nan  # the GradScaler's scale its last scale(loss) multiplied by (NaN: no scaler)
    order: List[str] = field(default_factory=list)  # "scale", "backward", "unscale_", "clip" in the loop's call order
    chunks: Dict[int, List[float]] = field(default_factory=dict)  # k -> each row's k equal parts' fingerprints
    probes: List[Any] = field(default_factory=list)  # the first step's outputs and their gradients (probe.py)
    metrics: List[float] = field(default_factory=list)  # the metric each scheduler.step(metric) was given

    def loss(self) -> float:
        """The step's loss, combined as its gradients are: the sum of the scalars backpropagated
        (a loop that accumulates divides them itself); a pipeline schedule backpropagates each
        micro-batch's loss undivided and scales the gradients by 1/n instead, so there the mean.
        NaN where nothing was backpropagated (a pipeline stage that holds no loss)."""
        if not self.losses:
            return math.nan
        total = math.fsum(self.losses)
        return total / len(self.losses) if self.pipeline else total

    def then(self, now: "Inputs") -> "Inputs":
        """This step's inputs followed by ``now``'s: a step that was not counted belongs to the next one."""
        return Inputs(self.rows + now.rows, self.calls + now.calls, self.losses + now.losses,
                      self.pipeline or now.pipeline, self.clips + now.clips, self.raw_norms + now.raw_norms,
                      self.zeroed + now.zeroed, merged(self.where, now.where), self.eval_rows + now.eval_rows,
                      now.scale if "scale" in now.order else self.scale, self.order + now.order,
                      metrics=self.metrics + now.metrics)
