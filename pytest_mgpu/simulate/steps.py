"""``step(name)``: the user's mark of one step inside a measured call. Torch-free, so that
``pytest_mgpu.simulate`` imports cheaply; the measuring mode (``instruments.Instruments``) registers
itself in ``ACTIVE`` while it runs."""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, List, Optional

ACTIVE: List[Any] = []  # the Instruments measuring now, innermost last


def step(name: Optional[str] = None) -> ContextManager[Any]:
    """Mark one step of a simulated call: ``with step("train"): ...`` around the step's forward,
    backward and optimizer step. The call's figures (collectives, bytes, peak, memory at the step's
    end) are then reported per marked step instead of per ``optimizer.step()``. Outside a measured
    call (real ranks, plain Python) it does nothing, so the same code runs in both tiers.

    Args:
        name: The step's name in the table. None: "step i".

    Returns:
        The step, while the block runs.
    """
    if not ACTIVE:
        return contextlib.nullcontext()
    return ACTIVE[-1].marked(name)
