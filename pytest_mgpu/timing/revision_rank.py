"""The rank side of the revision lane: set a step up once, then time batches of it, call after call.

Runs in the lane's own warm ranks (one set for the head, one for the base, ``timing.revision``). A
batch is one ``dist.run`` of ``batch_loop``; the step it times was built by the first batch of the
same ``token`` and is held in this module between calls (warm ranks keep module state; a fresh rank
builds it again). The user's function and arguments travel as a reference and pickled bytes and
are resolved here, after the base's folders were put first on ``sys.path``: REV's modules, not the
working tree's, are what the base ranks import. pytest-mgpu itself was imported before (this module
is part of it), so it is the installed one on both sides.

A function that cannot be imported on this side (its file or name does not exist at REV) is
reported back as ``missing``, not raised: the benchmark is new in this change. Every rank resolves
the same files, so all agree, and none enters a collective the others skip.
"""
from __future__ import annotations

import gc
import importlib
import pickle
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..launch.protocol import FnRef
from .inrank import Clock, LoopConfig, warm_up

_HELD: Dict[str, Tuple[Callable[[], Any], Clock]] = {}  # token -> (step, clock); one at a time


@dataclass
class BatchTiming:
    """What one rank measured in one batch; crosses the process boundary."""

    rank: int
    samples: List[float] = field(default_factory=list)
    warmup_samples: List[float] = field(default_factory=list)  # only on the call that set the step up
    missing: str = ""  # the function cannot be resolved on this side (why)


def _put_first(path_first: Tuple[str, ...]) -> None:
    if path_first:
        sys.path[:0] = [p for p in path_first if p not in sys.path[: len(path_first)]]
        importlib.invalidate_caches()


def _set_up(token: str, fn_ref: FnRef, payload: bytes, loop: LoopConfig, rank: int) -> BatchTiming:
    release()
    try:
        fn = fn_ref.resolve()
    except (ImportError, AttributeError) as exc:
        return BatchTiming(rank, missing=f"{type(exc).__name__}: {exc}")
    args, kwargs = pickle.loads(payload)
    made = fn(*args, **kwargs)
    step = made if callable(made) else (lambda: fn(*args, **kwargs))
    from .._context import rank_context

    clock = Clock(rank_context())
    warm = warm_up(clock, step, loop)
    _HELD[token] = (step, clock)
    return BatchTiming(rank, warmup_samples=warm)


def batch_loop(token: str, fn_ref: FnRef, payload: bytes, path_first: Tuple[str, ...], loop: LoopConfig,
               iterations: int) -> BatchTiming:
    """Time ``iterations`` steps (each after a barrier, as ``inrank`` does). The first call of a
    token sets the step up and warms it up first (``iterations`` may then be 0)."""
    from .._context import rank_context

    rank = rank_context().rank
    _put_first(path_first)
    out = BatchTiming(rank)
    if token not in _HELD:
        out = _set_up(token, fn_ref, payload, loop, rank)
        if out.missing:
            return out
    step, clock = _HELD[token]
    out.samples = [clock.time(step) for _ in range(iterations)]
    return out


def release(token: Optional[str] = None) -> None:
    """Drop the held step (all of them when ``token`` is None) and collect its memory. The warm rank
    froze it with the rest of its state after each call (``gc.freeze``): unfreeze, or its reference
    cycles (a model's hooks) would never be collected."""
    dropped = list(_HELD) if token is None else [t for t in (token,) if t in _HELD]
    for t in dropped:
        del _HELD[t]
    if dropped:
        gc.unfreeze()
        gc.collect()
