"""How times and sizes are written in every timing line and table."""
from __future__ import annotations

import math
from typing import Optional


def fmt_time(seconds: Optional[float]) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds * 1e9:.4g} ns"


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    return f"{n / 2**20:.0f} MiB" if abs(n) >= 2**20 else f"{n / 2**10:.0f} KiB"


def fmt_size(n: float) -> str:
    """Three significant digits, trailing zeros kept: ``29.0 MiB``, ``7.52 MiB``, ``512 B``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:#.3g}".rstrip(".") + f" {unit}"
    return f"{int(n)} B"
