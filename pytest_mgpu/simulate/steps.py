"""``step(name)``: the user's mark of one step inside a measured call. Torch-free, so that
``pytest_mgpu.simulate`` imports cheaply; the measuring mode (``instruments.Instruments``) registers
itself in ``ACTIVE`` while it runs."""
from __future__ import annotations

import contextlib
from typing import Any, List, Optional

ACTIVE: List[Any] = []  # the Instruments measuring now, innermost last


def step(name: Optional[str] = None):
    """Mark one step of a measured call::

        with step("train"):
            loss = model(x).sum(); loss.backward(); optimizer.step()

    The call's figures (collectives, bytes, peak, memory at the step's end) are then reported per
    marked step instead of per ``optimizer.step()``. Outside a measured call (the real tier, plain
    Python) it does nothing, so the same code runs in both tiers."""
    if not ACTIVE:
        return contextlib.nullcontext()
    return ACTIVE[-1].marked(name)
