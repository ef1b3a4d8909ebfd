"""The code inside a warm rank: join the group once, then run call after call, each as a fresh
rank would (same seeds, flags, environment, default process group), reporting like a fresh rank.
"""
from __future__ import annotations

import dataclasses
import gc
import os
import pickle
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from . import flight
from .call_log import CallLog
from .fresh import Fresh
from .protocol import FnRef, RankOutcome, RankTask
from .hygiene import CallWatch
from .rank import detach, error_outcome, join_group, prepare_rank, run_call, send_outcome
from .rank_coverage import RankCoverage


@dataclass
class PoolCall:
    """One call for the warm ranks: the same bytes go to every rank, which picks its own entries."""

    fn: FnRef
    payload: bytes
    seed: int
    per_rank_seed: bool
    threads: int
    log_paths: List[str]  # per rank
    env: Dict[str, str] = field(default_factory=dict)
    sys_path: List[str] = field(default_factory=list)  # [] : the same as the call before
    rejoin_prefix: Optional[str] = None  # set when the last call changed the process groups
    # per rank, this call's device indices: a pool serves every test of its shape, and on CPU ranks
    # the number of devices a rank stands in for is the test's (run_single of a 2- or a 4-device test)
    devices: Optional[List[Tuple[int, ...]]] = None


def _groups_changed(default_pg) -> bool:
    """Did the call destroy the default group or create others? Then every rank joins afresh."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if not dist.is_initialized():
            return True
        return c10d._get_default_group() is not default_pg or len(c10d._world.pg_map) != 1
    except Exception:
        return True


def _release_memory(task: RankTask) -> None:
    """What a finished process would give back: garbage, and cached CUDA memory and peak stats."""
    gc.collect()
    # What outlived the call is module state (imports, caches): freeze it too, so the next full
    # collection scans only the next call's objects (a full scan of torch's heap costs ~0.2 s).
    gc.freeze()
    if task.device_type == "cuda":
        import torch

        for d in task.devices or (task.device_index,):
            with torch.cuda.device(d):
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()


def worker_main(task: RankTask, conn) -> None:
    """Entry point of a warm rank (target of the forkserver Process)."""
    from torch.distributed import distributed_c10d as c10d

    flight.begin(task.log_path, task.backend)
    detach(task.log_path, task.launcher_pid)
    t0 = time.perf_counter()
    try:
        prepare_rank(task)
        store = join_group(task)
        state = _WarmState(store, c10d._get_default_group(), Fresh.take(), CallWatch(), RankCoverage(),
                           list(sys.path))
        gc.freeze()  # torch's own objects are permanent: per-call collections only see the test's
    except BaseException as exc:
        send_outcome(conn, error_outcome(task, exc, "init"))
        os._exit(3)
    send_outcome(conn, RankOutcome(rank=task.rank, ok=True, ready=True, init_s=time.perf_counter() - t0))
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)
        call: Optional[PoolCall] = pickle.loads(data)
        if call is None:
            os._exit(0)
        _one_call(task, call, state, conn)


@dataclass
class _WarmState:
    store: object
    default_pg: object
    fresh: Fresh
    watch: CallWatch
    coverage: RankCoverage  # measures each call under pytest --cov, saved after each (SIGKILL ends a pool)
    sys_path: List[str]  # the test process's, as last sent: every call starts from it
    log: CallLog = field(default_factory=CallLog)


def _one_call(task: RankTask, call: PoolCall, state: _WarmState, conn) -> None:
    """Run one call as a fresh rank would; after it, end what it left running and say so."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    log_path = call.log_paths[task.rank]
    flight.begin(log_path, task.backend)
    state.log.start(log_path)
    state.fresh.restore()
    if call.sys_path:
        state.sys_path = call.sys_path
    if sys.path != state.sys_path:
        sys.path[:] = state.sys_path
    this = dataclasses.replace(
        task, fn=call.fn, payload=call.payload, seed=call.seed, per_rank_seed=call.per_rank_seed,
        threads=call.threads, env=call.env, devices=task.devices if call.devices is None else call.devices[task.rank],
    )
    t1 = time.perf_counter()
    try:
        prepare_rank(this)
        if call.rejoin_prefix:
            if dist.is_initialized():
                dist.destroy_process_group()
            join_group(this, state.store, call.rejoin_prefix)
            state.default_pg = c10d._get_default_group()
    except BaseException as exc:
        send_outcome(conn, error_outcome(task, exc, "init"))
        os._exit(3)
    init_s = time.perf_counter() - t1
    state.coverage.resume(call.env)
    state.watch.start()
    outcome = run_call(this)
    outcome.init_s = init_s
    outcome.dirty = _groups_changed(state.default_pg)
    if outcome.ok:
        gc.collect()  # a DataLoader iterator the call dropped ends its workers itself
        outcome.notes = state.watch.finish(task.rank)
    state.coverage.pause()
    outcome.log_size = state.log.size()  # flushed first: what the call printed is in the file now
    send_outcome(conn, outcome)
    if not outcome.ok:
        os._exit(1)  # peers may be stuck in a collective: the pool is rebuilt
    state.fresh.restore()
    _release_memory(this)
