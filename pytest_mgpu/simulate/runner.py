"""The test-process side of one simulation: a fresh rank process, its limits, and its failures.

It is a one-rank call of the ordinary launcher (``launch.spawn.SpawnLauncher``), so the simulated
rank is started, watched, timed out (its Python stack shown), killed as a tree and cleaned up exactly
as a real rank is; what differs is told here: a failure names the simulated rank and world, not the
launcher's one rank, and a hang is explained for a process group whose collectives never block.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
from typing import Optional

from ..launch.base import LaunchResult, LaunchSpec
from ..launch.collect import START_LIMIT_S
from ..launch.errors import RankFailure
from ..launch.protocol import pack_call
from ..launch.rank_coverage import ranks_env
from .context import CallDefaults
from .inrank import PRELOAD, SimCall, run_simulated

_OWN = None  # the launcher of simulations outside a pytest session, closed at exit


def launcher(defaults: CallDefaults):
    """The session's fresh-process launcher; outside a session (or in a torchrun/srun job, whose
    launcher runs calls in the job's ranks) one of our own."""
    global _OWN
    from ..launch.spawn import SpawnLauncher, preload_also

    preload_also(PRELOAD)  # effective if no rank has started yet in this process
    own = defaults.launcher() if defaults.launcher is not None else None
    if isinstance(own, SpawnLauncher):
        return own
    if _OWN is None:
        _OWN = SpawnLauncher()
        atexit.register(close_own)
    return _OWN


def warm_up(defaults: CallDefaults) -> None:
    """Start the forkserver and wait until it can fork (its preload: 2-6 s), before an outer timer
    (pytest-timeout) starts; ``SpawnLauncher.prewarm`` only starts it."""
    from ..launch.spawn import forkserver_context

    launcher(defaults).prewarm(None)
    probe = forkserver_context().Process(target=os.getpid, name="mgpu-warm-up", daemon=True)
    probe.start()
    probe.join(START_LIMIT_S)


def close_own() -> None:
    global _OWN
    if _OWN is not None:
        _OWN.close()
        _OWN = None


def describe(call: SimCall, label: str) -> str:
    return f"{label or 'simulate(' + call.fn.qualname + ')'} [simulated rank {call.rank} of {call.world_size}, " \
           "fake process group on cpu]"


def spec_for(call: SimCall, defaults: CallDefaults, timeout_s: float, timeout_source: str) -> LaunchSpec:
    return LaunchSpec(nprocs=1, backend="gloo", device_type="cpu", emulated=True, seed=call.seed,
                      timeout_s=timeout_s, timeout_source=timeout_source, outer_deadline=defaults.outer_deadline,
                      outer_source=defaults.outer_source, label=describe(call, defaults.label),
                      env=ranks_env(defaults.invocation_dir))


def run(call: SimCall, defaults: CallDefaults, timeout_s: float, timeout_source: str) -> LaunchResult:
    """Run ``call`` in a fresh process; its ``SimRecord`` is ``.values[0]``, or ``RankFailure``."""
    spec = spec_for(call, defaults, timeout_s, timeout_source)
    ref, payload = pack_call(run_simulated, (call,), {}, caller="simulate")
    try:
        return launcher(defaults).run(spec, ref, payload)
    except RankFailure as failure:
        raise relabel(failure, call, spec) from None


HANG = ("Hint: the fake process group's collectives return at once, so a simulated rank that does not finish "
        "is stuck in its own code (a loop that waits for data a fake collective never brings). ")
OWN_LIMIT = ("If the work is just slow, raise the limit ({source}): simulate(..., timeout=S), "
             "@pytest.mark.mgpu_timeout(S) or --mgpu-timeout.")
OUTER_LIMIT = ("The call was cut short by {outer}, not by pytest-mgpu's own limit ({seconds:g}s from {source}): if "
               "the work is just slow, raise pytest-timeout's limit (--timeout, or @pytest.mark.timeout).")
_OWN_FRAMES = os.sep + "pytest_mgpu" + os.sep + "simulate" + os.sep
DDP_HOOK = "expected the hook result is either a Tensor or a TensorList"
DDP = ("Hint: DistributedDataParallel cannot run on the simulated tier; simulate FSDP2 (fully_shard), tensor or "
       "pipeline parallel, and check DDP on real ranks (dist.benchmark, dist.assert_parity, "
       "dist.assert_same_training: their collectives and bytes are judged as structure too). Why: torch's fake "
       "process group completes DDP's built-in all-reduce without a result, and DDP's reducer asserts on that.")


def relabel(failure: RankFailure, call: SimCall, spec: LaunchSpec) -> RankFailure:
    """The launcher's failure of its one rank, told as the simulated rank's; a hang is explained for a
    group whose collectives never block, and the simulated rank's own frames leave its stack."""
    problems = [dataclasses.replace(p, rank=call.rank) for p in failure.problems]
    hint = failure.hint
    if any(p.kind == "hung" for p in problems):
        for p in problems:
            p.detail = "\n".join(line for line in p.detail.splitlines() if _OWN_FRAMES not in line)
        outer = bool(spec.outer_source) and spec.outer_source in hint
        hint = HANG + (OUTER_LIMIT.format(outer=spec.outer_source, seconds=spec.timeout_s, source=spec.timeout_source)
                       if outer else OWN_LIMIT.format(source=spec.timeout_source))
    for p in problems:
        if DDP_HOOK in p.summary:  # torch's INTERNAL ASSERT text would take the message's head
            p.summary, hint = ("raised RuntimeError: DistributedDataParallel's all-reduce returned no result "
                               "on the fake process group (torch's INTERNAL ASSERT in c10d comm.cpp)"), DDP
    relabeled = RankFailure(spec.label, problems, hint)
    relabeled.logs = failure.logs
    return relabeled


def timeout_of(timeout: Optional[float], defaults: CallDefaults):
    """``simulate(timeout=)`` beats the test's marker, which beats the option (as for ``dist.run``)."""
    if timeout is None:
        if defaults.problem:
            from ..settings import SettingsError

            raise SettingsError(defaults.problem)
        return defaults.timeout_s, defaults.timeout_source
    from ..settings import validate_timeout

    return validate_timeout(timeout, "simulate(timeout=...)", text_ok=False), f"simulate(timeout={timeout!r})"
