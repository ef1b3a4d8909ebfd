"""``simulate(fn, *args, world_size=W, rank=0, **kwargs)``: one rank of a W-rank job, on this CPU.

The real tier answers "does it train right, how fast" on the ranks a machine holds. The simulated tier
answers the questions asked at scales no CI machine has: does an FSDP2 / tensor-parallel plan at
1,024 ranks shard every parameter, how many collectives does a step issue, how many bytes does a rank
send, how much memory does it hold. Under PyTorch's fake process group collectives move no data, so
it checks plans, counts and memory, never numbers.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional

from ..launch.errors import RankFailure
from ..launch.protocol import pack_call
from ..settings import SettingsError
from . import context
from .result import Simulation
from .steps import step


def simulate(fn: Callable[..., Any], *args: Any, world_size: int, rank: int = 0, timeout: Optional[float] = None,
             **kwargs: Any) -> Simulation:
    """One rank of a ``world_size``-rank job on this CPU: ``fn(*args, **kwargs)`` in a fresh process
    as rank ``rank`` of PyTorch's fake process group, whose collectives move no data, counting its
    collectives and bytes and tracking its memory. ``init_device_mesh("cpu", ...)``, FSDP2, tensor
    parallel and DTensor run there unchanged; DDP does not. Called as ``pytest_mgpu.simulate(...)``.

    Args:
        fn: A module-level function; its arguments and return value are pickled.
        *args: Positional arguments of ``fn``.
        world_size: The ranks of the job played (1 or more).
        rank: The rank played, from 0 to ``world_size - 1``.
        timeout: Seconds before a hang is ended with the rank's stack. None: the test's
            ``mgpu_timeout`` marker, else ``--mgpu-timeout`` (default 300).
        **kwargs: Keyword arguments of ``fn``.

    Returns:
        The call's counts, bytes, memory and per-step figures, and ``fn``'s value.

    Raises:
        RankFailure: ``fn`` raised or hung; it names the simulated rank, with its traceback.
    """
    __tracebackhide__ = True
    from .runner import run, timeout_of

    _check_shape(world_size, rank)
    defaults = context.current()
    try:
        seconds, source = timeout_of(timeout, defaults)  # a bad limit is refused before anything starts
    except SettingsError as exc:
        raise SettingsError(str(exc)) from None  # the test's line, not our frames
    ref, payload = pack_call(fn, args, kwargs, caller="simulate")
    from .inrank import SimCall

    call = SimCall(fn=ref, payload=payload, world_size=world_size, rank=rank, seed=defaults.seed)
    t0 = time.perf_counter()
    try:
        result = run(call, defaults, seconds, source)
    except RankFailure as failure:
        _echo(failure.logs, rank)
        raise failure.with_traceback(None) from None
    record = result.values[0]
    _echo(result.logs, rank)
    sim = Simulation(world_size=world_size, rank=rank, value=record.value, collectives=record.collectives,
                     comm_bytes=record.comm_bytes, peak_bytes=record.peak_bytes, memory=record.memory,
                     steps=record.steps, wall_s=record.wall_s, call_s=time.perf_counter() - t0,
                     fn=ref.qualname, comm_bytes_by_op=record.comm_bytes_by_op)
    defaults.done.append(sim)
    return sim


simulate.step = step  # type: ignore[attr-defined]  # pytest_mgpu.simulate names this function: step is on it too


class SimulateError(ValueError):
    """``simulate`` was asked for a world it cannot play."""


def _check_shape(world_size, rank) -> None:
    __tracebackhide__ = True
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise SimulateError(f"simulate(world_size=...) takes a whole number of ranks >= 1, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise SimulateError(f"simulate(rank=...) takes a rank from 0 to world_size - 1 = {world_size - 1}, "
                            f"got {rank!r}")


def _echo(logs, rank: int) -> None:
    """The simulated rank's output goes to the test's stdout (pytest shows it per test), prefixed."""
    for text in logs:
        for line in text.splitlines():
            sys.stdout.write(f"[simulated rank {rank}] {line}\n")
