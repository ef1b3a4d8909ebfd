"""What a ``torch.amp.GradScaler`` did in a step (inside a rank): the scale ``scale(loss)`` multiplied
by, the order of its ``unscale_`` against ``clip_grad_norm_`` (a clip before ``unscale_`` clips scaled
gradients), the steps it skipped (inf/NaN found in the scaled gradients: no optimizer step), and how
many scalers the loop made (one made per iteration starts over at its initial scale every time)."""
from __future__ import annotations

import sys
from typing import Any, List, Tuple

from ...timing.structure.counter import quiet


def scaler_calls(watch: Any) -> List[Tuple[Any, str, Any]]:
    """The patches that note a ``torch.amp.GradScaler``'s scale (what ``scale(loss)`` multiplied by),
    the order of its ``unscale_`` against ``clip_grad_norm_`` (a clip before ``unscale_`` clips scaled
    gradients), and each enabled scaler made, where torch has one. ``watch`` is the loop's
    ``watch.Watch`` (``saw_scaler``, ``scalers_made``)."""
    amp = sys.modules.get("torch.amp")
    scaler = getattr(amp, "GradScaler", None)
    if scaler is None:
        return []
    scale, unscale = scaler.scale, scaler.unscale_

    def observed_scale(self, outputs):
        out = scale(self, outputs)
        if self.is_enabled() and getattr(self, "_scale", None) is not None:
            with quiet():
                watch.saw_scaler("scale", float(self._scale.reshape(-1)[0]))
        return out

    def observed_unscale(self, optimizer):
        if self.is_enabled():
            watch.saw_scaler("unscale_")
        return unscale(self, optimizer)

    init = scaler.__init__

    def observed_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.is_enabled():
            watch.scalers_made += 1

    return [(scaler, "scale", observed_scale), (scaler, "unscale_", observed_unscale), (scaler, "__init__", observed_init)]


def scaler_steps(watch: Any) -> List[Tuple[Any, str, Any]]:
    """The patch of ``GradScaler.step`` that notes, per call, whether it skipped the optimizer's step
    (``watch.scaler_found``), and in a companion's run skips where the reference
    skipped (``watch.follow``): the float64 run finds no overflow where float16 did, and would take an
    update the reference never took, so every later step would be compared one update apart."""
    amp = sys.modules.get("torch.amp")
    scaler = getattr(amp, "GradScaler", None)
    if scaler is None:
        return []
    step = scaler.step

    def observed_step(self, optimizer, *args, **kwargs):
        if not self.is_enabled():
            return step(self, optimizer, *args, **kwargs)
        k = len(watch.scaler_found)
        if k < len(watch.follow) and watch.follow[k]:
            with quiet():
                skipped_as_the_reference(self, optimizer)
        out = step(self, optimizer, *args, **kwargs)
        with quiet():
            found = getattr(self, "_per_optimizer_states", {}).get(id(optimizer), {}).get("found_inf_per_device")
            skipped = bool(found) and sum(float(v.sum()) for v in found.values()) > 0
        watch.scaler_found.append(skipped)  # inf/NaN in the scaled gradients: no optimizer.step
        return out

    return [(scaler, "step", observed_step)]


def skipped_as_the_reference(scaler: Any, optimizer: Any) -> None:
    """Make ``scaler.step(optimizer)`` skip, as it does on inf/NaN: unscale as ``step`` would, then mark
    an inf found (``update()`` then backs the scale off, as the reference's did)."""
    from torch.amp.grad_scaler import OptState

    state = scaler._per_optimizer_states[id(optimizer)]
    if state["stage"] is OptState.READY:
        scaler.unscale_(optimizer)
    for found in state["found_inf_per_device"].values():
        found.fill_(1.0)
