"""Fresh ranks for one call: start, collect, time out with stacks, kill the whole tree.

Ranks are forked by a forkserver that has imported torch once (~0.1 s per launch instead of ~3 s
per rank for ``spawn``); the forkserver never runs a torch op, so the fork-after-OpenMP hang cannot
happen. Each rank detaches into its own process group and dies with its parent (PDEATHSIG), so no
outcome (pass, fail, hang, Ctrl-C, pytest-timeout) leaves one behind.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import shutil
import tempfile
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

from ..devices import usable_cpus
from .base import LaunchResult, LaunchSpec
from .collect import collect
from .flight import recorder_env
from .processes import alive, kill_tree
from .protocol import FnRef, RankTask
from .rank import rank_main
from .rank_coverage import preload
from .rendezvous import Rendezvous, StoreServer

JOIN_S = 5.0  # how long a rank that sent its result gets to exit before it is killed
# pytest: every test module a rank imports to find its function imports it. Preloaded once (0.13-0.18 s
# after torch, measured at load 5) rather than by every rank of every rebuilt pool: a rebuilt 4-rank pool
# was still importing it 6 s after it started at load 4-12 (docs/design/failures.md, "Under load"), past short limits.
# The ranks' own code never uses it.
PRELOAD = ["numpy", "torch", "torch.distributed", "pytest", "pytest_mgpu.launch.rank", "pytest_mgpu.launch.worker"]


def threads_per_rank(nprocs: int) -> int:
    return max(1, usable_cpus() // max(1, nprocs))


def rank_devices(spec: LaunchSpec, rank: int) -> Tuple[Tuple[int, ...], Optional[int]]:
    """The device indices rank ``rank`` may use, and its own: its share of the test's GPUs; on CPU
    ranks one index per device of the test it stands in for (``RankContext.devices`` lists ``cpu``
    that many times, so code written for N devices indexes them unchanged)."""
    if spec.device_type == "cuda":
        ndev = len(spec.device_ids)
        if spec.nprocs > 1 and spec.nprocs > ndev:  # --mgpu-fallback=share: ranks take turns on the GPUs
            return (rank % ndev,), rank % ndev
        if spec.nprocs == 1 and (spec.test_devices or 1) > ndev:  # one process standing in for more GPUs
            devices = tuple(i % ndev for i in range(spec.test_devices or 1))
            return devices, devices[0]
        per = max(1, ndev // spec.nprocs)
        devices = tuple(range(rank * per, rank * per + per)) if spec.nprocs > 1 else tuple(range(ndev))
        return devices, devices[0]
    return tuple(range(max(1, (spec.test_devices or spec.nprocs) // spec.nprocs))), None


def make_task(spec: LaunchSpec, rank: int, fn: Optional[FnRef], payload: bytes, rdv: Rendezvous,
              log_path: str) -> RankTask:
    """The task of one rank: its place in the group, its devices, and the call (if any)."""
    env = {**recorder_env(os.environ), **spec.env}  # the flight recorder on, unless the user set it
    # CPU ranks see no GPU, also on a GPU machine: code that asks torch for its accelerator
    # (fully_shard's default mesh, torch.accelerator, the tutorials' set_device(rank)) then picks
    # the CPU as it would on a CPU runner, instead of device ``rank`` of a GPU it does not own.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.device_ids) if spec.device_type == "cuda" else ""
    if spec.device_type == "cuda" and "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read at cuBLAS's first use: bitwise mode needs it
    devices, index = rank_devices(spec, rank)
    return RankTask(
        rank=rank,
        world_size=spec.nprocs,
        local_rank=rank,
        backend=spec.backend,
        device_type=spec.device_type,
        device_index=index,
        devices=devices,
        emulated=spec.emulated,
        store_host=rdv.host,
        store_port=rdv.port,
        store_prefix=rdv.prefix,
        seed=spec.seed,
        per_rank_seed=spec.per_rank_seed,
        threads=threads_per_rank(spec.nprocs),
        fn=fn,
        payload=payload,
        log_path=log_path,
        # gloo/nccl give up on their own a little after our deadline: a last line of defence.
        pg_timeout_s=spec.timeout_s + 60.0,
        launcher_pid=os.getpid(),
        env=env,
    )


LOGDIR_PREFIX = "pytest-mgpu-"
_LOGDIR = re.compile(r"^pytest-mgpu-(?:pool|call)-(\d+)-")


def make_logdir(kind: str) -> str:
    """A folder for ranks' output, named after this process (``pytest-mgpu-pool-<pid>-...``) so that a
    later session can remove what a killed one left: folders whose owner is gone."""
    remove_stale_logdirs()
    return tempfile.mkdtemp(prefix=f"{LOGDIR_PREFIX}{kind}-{os.getpid()}-")


def remove_stale_logdirs() -> None:
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        m = _LOGDIR.match(name)
        if m and not alive(int(m.group(1))):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def stop_forkserver(wait_s: float = 2.0) -> None:
    """End and reap the forkserver and multiprocessing's resource tracker, so that nothing pytest
    started still runs when it returns (they lingered, re-parented, about 1 s). Each stops when its
    "alive" pipe closes; multiprocessing has only the private ``_stop`` for it, which waits without a
    bound (a leftover holder of the pipe would hang pytest), so the wait here is bounded."""
    from multiprocessing import forkserver, resource_tracker

    fs: Any = forkserver._forkserver  # private attributes, which typeshed does not declare
    with fs._lock:
        if _end_helper(fs, "_forkserver_alive_fd", "_forkserver_pid", wait_s):
            address, fs._forkserver_address = fs._forkserver_address, None
            if address and isinstance(address, str) and not address.startswith("\0"):
                try:
                    os.unlink(address)
                except OSError:
                    pass
    rt: Any = resource_tracker._resource_tracker
    with rt._lock:
        _end_helper(rt, "_fd", "_pid", wait_s)


def _pid(p: mp.Process) -> int:
    """The pid of a started process (``Process.pid`` is None only before ``start()``)."""
    assert p.pid is not None
    return p.pid


def _end_helper(obj, fd_name: str, pid_name: str, wait_s: float) -> bool:
    fd, pid = getattr(obj, fd_name, None), getattr(obj, pid_name, None)
    if fd is None or pid is None:
        return False
    try:
        os.close(fd)
    except OSError:
        pass
    setattr(obj, fd_name, None)
    setattr(obj, pid_name, None)
    end = time.monotonic() + wait_s
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] != 0:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() > end:
            return True  # still running: it holds nothing of ours any more, and ends on its own
        time.sleep(0.01)


# OpenMP's default wait policy spins before it sleeps. With 2 intra-op threads and any other runnable
# process on the cores, a thread spins through its time slice waiting for one that is not scheduled,
# at every parallel op: measured on the 2-core CI machine at load ~3, a MobileNetV2 step (batch 16,
# 32 px) took 151 ms on 1 thread and 4,038 ms on 2 (ACTIVE: 7,997 ms; PASSIVE: 292 ms), and a
# pipelined ResNet step ran past the call's limit "in backward". PASSIVE keeps 2 threads useful on a
# loaded runner. libgomp reads it once, when torch is imported: so it is set for the forkserver (a
# fresh interpreter started with this environment) before it imports torch; a user's value wins.
WAIT_POLICY = ("OMP_WAIT_POLICY", "PASSIVE")
PRELOAD_ALSO: List[str] = []
"""Modules a capability asks the forkserver to import as well (``preload_also``): the simulated tier's
FSDP2, tensor parallel and fake process group imports (1.7 s per fresh process, measured)."""


def preload_also(modules: List[str]) -> None:
    """Have the forkserver import ``modules`` too. It takes effect only if the forkserver has not
    started yet (its preload is read once, at start); a rank imports what is missing itself."""
    PRELOAD_ALSO.extend(m for m in modules if m not in PRELOAD_ALSO)
    forkserver_context()


def forkserver_context(start_method: str = "forkserver"):
    os.environ.setdefault(*WAIT_POLICY)
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD + PRELOAD_ALSO + preload())
    return ctx


_OPEN_LAUNCHERS: "weakref.WeakSet[SpawnLauncher]" = weakref.WeakSet()
"""Launchers of this process not yet closed (weakly: one dropped without close() holds nothing up). The forkserver is one per process: a pytest session run
in-process inside another (pytester's ``runpytest``) must not stop it under the outer session, whose
warm ranks would then all read as "died: exit code 255" (their exit status comes through it)."""


class SpawnLauncher:
    """Starts fresh rank processes for every call."""

    def __init__(self, store: Optional[StoreServer] = None, start_method: str = "forkserver"):
        self._store = store or StoreServer()
        self._ctx = forkserver_context(start_method)
        self._live: Dict[int, mp.Process] = {}
        _OPEN_LAUNCHERS.add(self)

    # -- public -------------------------------------------------------------------------------
    def run(self, spec: LaunchSpec, fn: FnRef, payload: bytes) -> LaunchResult:
        t0 = time.perf_counter()
        logdir = make_logdir("call")
        log_paths = [os.path.join(logdir, f"rank{r}.log") for r in range(spec.nprocs)]
        procs: List[mp.Process] = []
        conns = []
        try:
            rdv = self._store.new_rendezvous()
            for rank in range(spec.nprocs):
                task = make_task(spec, rank, fn, payload, rdv, log_paths[rank])
                recv, send = self._ctx.Pipe(duplex=False)
                p = self._ctx.Process(
                    target=rank_main, args=(task, send), name=f"mgpu-rank{rank}", daemon=False
                )
                p.start()
                send.close()
                self._live[p.pid] = p
                procs.append(p)
                conns.append(recv)
            got = collect(procs, conns, log_paths, spec.limit())
            got.raise_if_failed(spec.describe(), log_paths)
            return LaunchResult.of(got, log_paths, t0)
        finally:
            for p in procs:
                if p.is_alive():
                    kill_tree(_pid(p))
            for p in procs:
                p.join(JOIN_S)
                if p.is_alive():  # pragma: no cover - SIGKILL did not take; say so rather than hide it
                    raise RuntimeError(f"rank process {p.pid} survived SIGKILL")
                self._live.pop(_pid(p), None)
                kill_tree(_pid(p))  # the rank's own children, if it left any in its group
            for c in conns:
                c.close()
            shutil.rmtree(logdir, ignore_errors=True)

    def prewarm(self, spec: LaunchSpec) -> None:
        """Start the forkserver now (its first start costs 2.1-2.5 s), before an outer timer starts."""
        if self._ctx.get_start_method() == "forkserver":
            from multiprocessing import forkserver

            forkserver.ensure_running()

    @property
    def fresh(self) -> "SpawnLauncher":
        """Itself: every call already gets fresh rank processes."""
        return self

    def close(self) -> None:
        """Kill anything still running (called at session end and on interrupt)."""
        for pid in list(self._live):
            kill_tree(pid)
        for p in self._live.values():
            p.join(JOIN_S)
        self._live.clear()
        _OPEN_LAUNCHERS.discard(self)
        if not _OPEN_LAUNCHERS:
            stop_forkserver()
