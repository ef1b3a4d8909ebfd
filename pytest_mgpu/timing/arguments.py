"""``dist.benchmark``'s arguments, checked in the test process before any rank starts: the loop's
counts and the global batch (``batch_size`` is its older name)."""
from __future__ import annotations

from typing import Optional, Tuple

from .inrank import DEFAULT_MIN_RUN_TIME, LoopConfig


def positive_int(name: str, value, allow_zero: bool) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        least = 0 if allow_zero else 1
        raise ValueError(f"dist.benchmark: {name} must be an integer >= {least} (or None to calibrate), "
                         f"got {value!r}")
    return value


def resolve_global_batch(global_batch: Optional[int], batch_size: Optional[int]) -> Tuple[Optional[int], str]:
    """(the global batch, the keyword it came as)."""
    if global_batch is not None and batch_size is not None:
        raise ValueError("dist.benchmark: give global_batch= or its older name batch_size=, not both")
    keyword = "global_batch" if global_batch is not None else "batch_size" if batch_size is not None else ""
    value = global_batch if global_batch is not None else batch_size
    return positive_int(keyword or "global_batch", value, allow_zero=False), keyword


def loop_config(warmup, repeat, min_run_time) -> LoopConfig:
    """The rank loop's counts, checked here, before any rank starts."""
    warmup = positive_int("warmup", warmup, allow_zero=True)
    repeat = positive_int("repeat", repeat, allow_zero=False)
    if min_run_time is not None and not min_run_time > 0:
        raise ValueError(f"dist.benchmark: min_run_time must be a positive number of seconds, got {min_run_time!r}")
    return LoopConfig(warmup, repeat, float(min_run_time or DEFAULT_MIN_RUN_TIME))
