"""The causes of gradient clipping (``gradients.py``, ``clip_order.py``): a clip before the step's backward or
per micro-batch, by hand or per tensor, on one side, per rank, of still-scaled gradients or of another
norm; read by ``causes.py`` after ``table.TABLE``, first match wins."""
from __future__ import annotations

from typing import Final, Tuple

from .conditions import below, hand_scale, passes, scaled, world
from .table import ACCUM, ACCUM_WHY, CLIP, HAND_SCALE, UNSCALE, Cause

CLIPPING: Final[Tuple[Cause, ...]] = (
    Cause("clip-order", "clip_grad_norm_ runs before the step's backward (after the previous optimizer.step or "
          "zero_grad): the step uses unclipped gradients", "call clip_grad_norm_ after the step's last backward (after scaler.unscale_ with a "
          "GradScaler) and before optimizer.step"),
    Cause("clip-micro", "the gradients are clipped on every micro-batch (clip_grad_norm_ between the backward passes "
          "of one optimizer step): each partial sum is clipped, not the accumulated gradient", "clip once per optimizer "
          "step, after the last micro-batch's backward (with accelerate: under `if accelerator.sync_gradients:`)"),
    Cause("clip-by-hand", "gradients clipped by hand with another norm than the total (a rank's own shard's, norms "
          "summed, not the root of their squares)",
          "clip with torch.nn.utils.clip_grad_norm_ over every parameter, or all_reduce the shards' sums of squares "
          "and take the root of the total"),
    Cause("clip-per-tensor", "gradients clipped per tensor (clip_grad_norm_ called once per parameter or group), not "
          "by their total norm", "call clip_grad_norm_ once, on all the parameters"),
    Cause("clip-one-side", CLIP, "call torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) on both sides",
          "One side clips by hand (with a norm of its local shards) or not at all."),
    Cause("clip-ranks", CLIP, "clip on every rank, with the norm of the whole model's gradients (clip_grad_norm_ on "
          "DTensor parameters reduces it over the mesh)", "Clipped on some ranks only, or with each rank's own norm."),
    Cause("clip-norm", "gradients clipped while still multiplied by the GradScaler's scale", "call "
          "scaler.unscale_(optimizer) before clip_grad_norm_, then scaler.step(optimizer)", "The clip saw the scaled "
          "gradients' norm, so it clipped by a factor the scale sets.", scaled),
    Cause("clip-norm", "gradients clipped while still multiplied by a loss scale " + HAND_SCALE, UNSCALE, "",
          hand_scale),
    Cause("clip-norm", "gradient accumulation without dividing the loss", ACCUM, ACCUM_WHY, passes),
    Cause("clip-norm", CLIP, "backpropagate the mean loss, and let DDP/FSDP average (or divide an all_reduce SUM by "
          "the world size)", "The loss is scaled by the world size, or gradients summed instead of averaged.", world),
    Cause("clip-norm", CLIP, "all_reduce the squared local norms before clipping, or clip the whole model's "
          "gradients (clip_grad_norm_ on DTensor parameters reduces the norm over the mesh)",
          "The norm is computed over each rank's local shards or part of the parameters only.", below),
)
