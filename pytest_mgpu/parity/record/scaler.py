"""What a ``torch.amp.GradScaler`` did in a step (inside a rank): the scale ``scale(loss)`` multiplied
by, the order of its ``unscale_`` against ``clip_grad_norm_`` (a clip before ``unscale_`` clips scaled
gradients), the steps it skipped (inf/NaN found in the scaled gradients: no optimizer step), and how
many scalers the loop made (one made per iteration starts over at its initial scale every time)."""
from __future__ import annotations

import sys
from typing import Any, List, Tuple

from ...timing.structure.counter import quiet


def scaler_calls(watch: Any) -> List[Tuple[Any, str, Any]]:
    """The patches that note a ``torch.amp.GradScaler``'s scale (what ``scale(loss)`` multiplied by) and
    the order of its ``unscale_`` against ``clip_grad_norm_`` (a clip before ``unscale_`` clips scaled
    gradients), each ``step`` that skipped the optimizer's, and each enabled scaler made, where torch has
    one. ``watch`` is the loop's ``watch.Watch`` (``saw_scaler``, ``scaler_skips``, ``scalers_made``)."""
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

    step, init = scaler.step, scaler.__init__

    def observed_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.is_enabled():
            watch.scalers_made += 1

    def observed_step(self, optimizer, *args, **kwargs):
        out = step(self, optimizer, *args, **kwargs)
        if self.is_enabled():
            with quiet():
                found = getattr(self, "_per_optimizer_states", {}).get(id(optimizer), {}).get("found_inf_per_device")
                if found and sum(float(v.sum()) for v in found.values()):
                    watch.scaler_skips += 1  # inf/NaN in the scaled gradients: no optimizer.step
        return out

    return [(scaler, "scale", observed_scale), (scaler, "unscale_", observed_unscale), (scaler, "step", observed_step),
            (scaler, "__init__", observed_init)]
