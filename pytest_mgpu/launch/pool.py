"""Warm ranks reused across tests: a test pays for its own work, not for starting processes.

One pool per group shape (world size, backend, devices). Its ranks fork from the torch-preloaded
forkserver, join the group once, then run call after call (``worker.py`` puts back the state a fresh
rank has before each). Any failure, hang or death tears that pool down; the next test builds a new
one. Under pytest-xdist with GPUs, pools are not kept between tests: an idle rank would hold a CUDA
context on devices leased to another worker.
"""
from __future__ import annotations

import os
import pickle
import shutil
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from .base import LaunchResult, LaunchSpec
from .collect import collect
from .errors import RankFailure
from .processes import kill_tree
from .protocol import FnRef
from .rendezvous import StoreServer
from .spawn import JOIN_S, SpawnLauncher, forkserver_context, make_logdir, make_task, rank_devices, threads_per_rank
from .worker import PoolCall

Key = Tuple[int, str, str, Tuple[str, ...], bool]


@dataclass
class _Pool:
    key: Key
    procs: list
    conns: list
    logdir: str
    calls: int = 0
    rejoin: bool = False
    sys_path: Optional[list] = None  # as last sent to the ranks: sent again only when it changed
    busy: bool = False  # a call was sent and not yet collected: never evicted to make room

    @property
    def call_logs(self) -> List[str]:
        """Each rank's output file for its calls, emptied by the rank as a call starts."""
        return [os.path.join(self.logdir, f"calls-rank{r}.log") for r in range(len(self.procs))]


class PoolLauncher:
    """Runs calls on warm ranks; same interface as ``SpawnLauncher``."""

    def __init__(self, store: Optional[StoreServer] = None, max_ranks: int = 16,
                 recycle_after: int = 1000):
        self._store = store or StoreServer()
        self._ctx = forkserver_context()
        self._pools: "OrderedDict[Key, _Pool]" = OrderedDict()
        self._fresh = SpawnLauncher(self._store)
        self.max_ranks = max_ranks
        self.recycle_after = recycle_after  # calls before a pool is replaced, to bound slow leaks
        self._reapers: List[threading.Thread] = []  # discarded pools' ranks, killed, waited for apart

    @staticmethod
    def key(spec: LaunchSpec) -> Key:
        return (spec.nprocs, spec.backend, spec.device_type, tuple(spec.device_ids), spec.emulated)

    def run(self, spec: LaunchSpec, fn: FnRef, payload: bytes) -> LaunchResult:
        return self.start(spec, fn, payload).result()

    def start(self, spec: LaunchSpec, fn: FnRef, payload: bytes) -> "Started":
        """Send the call to its warm ranks and return at once: ``result()`` waits for it, as ``run``
        does. Calls of other group shapes may run meanwhile (``dist.run_with_single``); ``abandon()``
        ends one whose result is no longer wanted."""
        if spec.device_type == "cuda" and os.environ.get("PYTEST_XDIST_WORKER"):
            return Started(self, spec, None, [], 0.0, lambda: self._fresh.run(spec, fn, payload))
        t0 = time.perf_counter()
        key = self.key(spec)
        pool = self._pools.get(key)
        if pool is not None and pool.busy:
            raise RuntimeError(f"{spec.describe()}: these warm ranks still run a call that was not waited for")
        if pool is not None and pool.calls >= self.recycle_after:
            self._discard(key)
            pool = None
        if pool is None:
            pool = self._start(spec, key)
            t0 = time.perf_counter()  # starting the pool is not the call's work, nor its overhead
        self._pools.move_to_end(key)
        pool.calls += 1
        log_paths = pool.call_logs
        rejoin = self._store.new_rendezvous().prefix if pool.rejoin else None
        threads = threads_per_rank(spec.nprocs)
        sys_path = [] if pool.sys_path == sys.path else list(sys.path)  # []: the ranks keep the last one
        pool.sys_path = list(sys.path)
        call = PoolCall(
            fn=fn, payload=payload, seed=spec.seed, per_rank_seed=spec.per_rank_seed, threads=threads,
            log_paths=log_paths, env=dict(spec.env), sys_path=sys_path, rejoin_prefix=rejoin,
            devices=[rank_devices(spec, r)[0] for r in range(spec.nprocs)],
        )
        data = pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)  # once: every rank gets the same bytes
        pool.busy = True
        try:
            for conn in pool.conns:
                try:
                    conn.send_bytes(data)
                except OSError:
                    pass  # the rank is gone: collect() reports how it died
        except BaseException:
            self._discard(key)
            raise
        return Started(self, spec, pool, log_paths, t0)

    def _finish(self, started: "Started") -> LaunchResult:
        """Wait for a started call's ranks (``Started.result``)."""
        pool, spec, log_paths = started.pool, started.spec, started.log_paths
        assert pool is not None  # a deferred call has none, and never comes here
        key = pool.key
        try:
            got = collect(pool.procs, pool.conns, log_paths, spec.limit(), started=True)
            pool.busy = False
            pool.rejoin = any(o.dirty for o in got.outcomes.values())
            try:
                got.raise_if_failed(spec.describe(), log_paths)  # reads the logs: before a discard removes them
            except RankFailure:
                if not got.ranks_intact:
                    self._discard(key)
                raise  # a pool whose ranks are all fine (only a value was unreadable) serves the next test
            return LaunchResult.of(got, log_paths, started.t0)
        except RankFailure:
            raise
        except BaseException:
            self._discard(key)  # Ctrl-C, pytest-timeout: never reuse a pool in doubt
            raise

    def prewarm(self, spec: LaunchSpec) -> None:
        """Start the warm ranks ``spec`` needs now (before an outer timer starts), if none are up. A
        failure here is left for the call itself to meet and report."""
        if spec.device_type == "cuda" and os.environ.get("PYTEST_XDIST_WORKER"):
            return
        key = self.key(spec)
        if key not in self._pools:
            try:
                self._start(spec, key)
            except RankFailure:
                pass

    @property
    def fresh(self) -> SpawnLauncher:
        """Fresh processes per call, sharing this pool's store (``--mgpu-isolate``, marker)."""
        return self._fresh

    def close(self) -> None:
        for key in list(self._pools):
            self._discard(key)
        for reaper in self._reapers:
            reaper.join()  # each bounded: JOIN_S a rank, the ranks already killed
        self._reapers.clear()
        self._fresh.close()

    # -- internals ----------------------------------------------------------------------------
    def _start(self, spec: LaunchSpec, key: Key) -> _Pool:
        while sum(k[0] for k in self._pools) + spec.nprocs > self.max_ranks:
            idle = [k for k, p in self._pools.items() if not p.busy]
            if not idle:
                break  # every pool has a call in flight: this one is over the cap until they return
            self._discard(idle[0])  # the least recently used pool makes room
        logdir = make_logdir("pool")
        log_paths = [os.path.join(logdir, f"rank{r}.log") for r in range(spec.nprocs)]
        pool = _Pool(key, [], [], logdir)
        self._pools[key] = pool
        from .worker import worker_main

        try:
            rdv = self._store.new_rendezvous()
            for rank in range(spec.nprocs):
                task = make_task(spec, rank, None, b"", rdv, log_paths[rank])
                here, there = self._ctx.Pipe(duplex=True)
                p = self._ctx.Process(target=worker_main, args=(task, there), name=f"mgpu-warm{rank}")
                p.start()
                there.close()
                pool.procs.append(p)
                pool.conns.append(here)
            got = collect(pool.procs, pool.conns, log_paths, spec.limit(), until_ready=True)
            got.raise_if_failed(spec.describe() + " (starting warm ranks)", log_paths)
        except BaseException:
            self._discard(key)
            raise
        return pool

    def _discard(self, key: Key) -> None:
        pool = self._pools.pop(key, None)
        if pool is None:
            return
        for p in pool.procs:
            kill_tree(p.pid)  # a rank may be stuck in a collective: asking it to exit is not enough
        for conn in pool.conns:
            conn.close()
        # Their exit comes through the forkserver, which a loaded machine can make slow to tell: waited
        # for beside the test (a failure is reported at once), and at close.
        self._reapers = [r for r in self._reapers if r.is_alive()]
        reaper = threading.Thread(target=_reap, args=(pool,), name="mgpu-reap", daemon=True)
        reaper.start()
        self._reapers.append(reaper)


def _reap(pool: "_Pool") -> None:
    for p in pool.procs:
        p.join(JOIN_S)
    shutil.rmtree(pool.logdir, ignore_errors=True)


@dataclass
class Started:
    """A call sent to warm ranks (``PoolLauncher.start``), not yet waited for."""

    launcher: PoolLauncher
    spec: LaunchSpec
    pool: Optional[_Pool]
    log_paths: List[str]
    t0: float
    deferred: Optional[Callable[[], LaunchResult]] = None  # a call that runs only when waited for

    def result(self) -> LaunchResult:
        """The call's values, or ``RankFailure``, as ``PoolLauncher.run`` gives them."""
        if self.deferred is not None:
            return self.deferred()
        return self.launcher._finish(self)

    def abandon(self) -> None:
        """End the call unwaited for: its ranks are killed and their pool is rebuilt when next needed."""
        if self.pool is not None:
            self.launcher._discard(self.pool.key)
