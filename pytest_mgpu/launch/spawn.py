"""Fresh ranks for one call: start, collect, time out with stacks, kill the whole tree.

Ranks are forked by a forkserver that has imported torch once (~0.1 s per launch instead of ~3 s
per rank for ``spawn``); the forkserver never runs a torch op, so the fork-after-OpenMP hang cannot
happen. Each rank detaches into its own process group and dies with its parent (PDEATHSIG), so no
outcome (pass, fail, hang, Ctrl-C, pytest-timeout) leaves one behind.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Dict, List, Optional, Tuple

from .errors import RankFailure, RankProblem, describe_exit
from .protocol import FnRef, RankOutcome, RankTask
from .rendezvous import StoreServer

FAILURE_GRACE_S = 3.0  # after a first failure, how long the other ranks get to report their own
STACK_WAIT_S = 2.0  # how long a hung rank gets to print its stack
JOIN_S = 5.0  # how long a rank that sent its result gets to exit before it is killed
PRELOAD = ["torch", "torch.distributed", "pytest_mgpu.launch.rank"]


@dataclass(frozen=True)
class LaunchSpec:
    """What to start: the shape of the group and how long it may take."""

    nprocs: int
    backend: str = "gloo"
    device_type: str = "cpu"
    device_ids: Tuple[str, ...] = ()  # physical CUDA ids visible to every rank; rank r uses cuda:r
    emulated: bool = False
    seed: int = 0
    per_rank_seed: bool = False
    timeout_s: float = 300.0
    label: str = "dist.run"
    env: Dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        where = f"{self.backend} on {self.device_type}"
        if self.emulated:
            where += " (emulated)"
        return f"{self.label} [{self.nprocs} rank(s), {where}]"


@dataclass
class LaunchResult:
    values: List[Any]
    logs: List[str]
    startup_s: float  # the call's wall time not spent in the user's function (start, join, return)
    wall_s: float


def _threads_per_rank(nprocs: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, nprocs))


def _kill_tree(pid: int) -> None:
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass


_STACK_START = re.compile(r"^(Current thread|Thread) 0x", re.M)


class SpawnLauncher:
    """Starts fresh rank processes for every call."""

    def __init__(self, store: Optional[StoreServer] = None, start_method: str = "forkserver"):
        self._store = store or StoreServer()
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(PRELOAD)
        self._live: Dict[int, mp.Process] = {}

    # -- public -------------------------------------------------------------------------------
    def run(self, spec: LaunchSpec, fn: FnRef, payload: bytes) -> LaunchResult:
        t0 = time.perf_counter()
        logdir = tempfile.mkdtemp(prefix="pytest-mgpu-")
        procs: List[mp.Process] = []
        conns = []
        try:
            rdv = self._store.new_rendezvous()
            for rank in range(spec.nprocs):
                task = self._task(spec, rank, fn, payload, rdv, os.path.join(logdir, f"rank{rank}.log"))
                recv, send = self._ctx.Pipe(duplex=False)
                p = self._ctx.Process(
                    target=_entry, args=(task, send), name=f"mgpu-rank{rank}", daemon=False
                )
                p.start()
                send.close()
                self._live[p.pid] = p
                procs.append(p)
                conns.append(recv)
            outcomes, problems, cuts = self._collect(spec, procs, conns, logdir, t0)
            logs = [_read(os.path.join(logdir, f"rank{r}.log"))[: cuts.get(r)] for r in range(spec.nprocs)]
            if problems:
                failure = RankFailure(spec.describe(), problems, hint=_hint(problems, spec))
                failure.logs = logs
                raise failure
            values = [outcomes[r].value for r in range(spec.nprocs)]
            wall = time.perf_counter() - t0
            work = max((o.run_s for o in outcomes.values()), default=0.0)
            return LaunchResult(values, logs, max(0.0, wall - work), wall)
        finally:
            for p in procs:
                if p.is_alive():
                    _kill_tree(p.pid)
            for p in procs:
                p.join(JOIN_S)
                if p.is_alive():  # pragma: no cover - SIGKILL did not take; say so rather than hide it
                    raise RuntimeError(f"rank process {p.pid} survived SIGKILL")
                self._live.pop(p.pid, None)
                _kill_tree(p.pid)  # the rank's own children, if it left any in its group
            for c in conns:
                c.close()
            shutil.rmtree(logdir, ignore_errors=True)

    def close(self) -> None:
        """Kill anything still running (called at session end and on interrupt)."""
        for pid in list(self._live):
            _kill_tree(pid)
        self._live.clear()

    # -- internals ----------------------------------------------------------------------------
    def _task(self, spec, rank, fn, payload, rdv, log_path) -> RankTask:
        env = dict(spec.env)
        if spec.device_type == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.device_ids)
            ndev = len(spec.device_ids)
            per = max(1, ndev // spec.nprocs)
            devices = tuple(range(rank * per, rank * per + per)) if spec.nprocs > 1 else tuple(range(ndev))
            index = devices[0]
        else:
            devices, index = (), None
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
            threads=_threads_per_rank(spec.nprocs),
            fn=fn,
            payload=payload,
            log_path=log_path,
            # gloo/nccl give up on their own a little after our deadline: a last line of defence.
            pg_timeout_s=spec.timeout_s + 60.0,
            launcher_pid=os.getpid(),
            env=env,
        )

    def _collect(self, spec, procs, conns, logdir, t0):
        deadline = t0 + spec.timeout_s
        outcomes: Dict[int, RankOutcome] = {}
        problems: List[RankProblem] = []
        first_failure: Optional[float] = None
        pending = set(range(spec.nprocs))
        by_conn = {id(c): r for r, c in enumerate(conns)}
        by_sentinel = {p.sentinel: r for r, p in enumerate(procs)}

        def fail(problem: RankProblem):
            nonlocal first_failure
            problem.secondary = first_failure is not None
            if first_failure is None:
                first_failure = time.perf_counter()
            problems.append(problem)
            pending.discard(problem.rank)

        while pending:
            now = time.perf_counter()
            limit = deadline if first_failure is None else min(deadline, first_failure + FAILURE_GRACE_S)
            if now >= limit:
                break
            waitables = [conns[r] for r in pending] + [procs[r].sentinel for r in pending]
            ready = wait(waitables, timeout=limit - now)
            # Results first: a rank that sent its outcome and exited is not a death.
            for obj in ready:
                r = by_conn.get(id(obj))
                if r is None or r not in pending:
                    continue
                outcome = _recv(obj)
                if outcome is None:
                    continue  # EOF: the process died; its sentinel tells how
                pending.discard(r)
                if outcome.ok:
                    outcomes[r] = outcome
                else:
                    fail(_raised(outcome))
            for obj in ready:
                r = by_sentinel.get(obj)
                if r is None or r not in pending:
                    continue
                outcome = _recv(conns[r]) if conns[r].poll() else None
                if outcome is not None:
                    pending.discard(r)
                    if outcome.ok:
                        outcomes[r] = outcome
                    else:
                        fail(_raised(outcome))
                    continue
                procs[r].join(1.0)
                tail = _tail(_read(os.path.join(logdir, f"rank{r}.log")))
                fail(RankProblem(r, "died", f"died: {describe_exit(procs[r].exitcode)}", tail))
        cuts: Dict[int, int] = {}
        if pending:
            timed_out = first_failure is None
            stacks, cuts = self._stacks(procs, sorted(pending), logdir)
            for r in sorted(pending):
                if timed_out:
                    summary = (
                        f"did not finish within {spec.timeout_s:g}s (hung); its Python stack:"
                    )
                    problems.append(RankProblem(r, "hung", summary, stacks.get(r, "(no stack)")))
                else:
                    summary = "was still running when another rank failed; stopped. Its stack:"
                    problems.append(
                        RankProblem(r, "stopped", summary, stacks.get(r, "(no stack)"), secondary=True)
                    )
        return outcomes, problems, cuts

    def _stacks(self, procs, ranks, logdir) -> Tuple[Dict[int, str], Dict[int, int]]:
        """Ask each rank for its Python stack (faulthandler on SIGUSR1) and read it back."""
        sizes = {}
        for r in ranks:
            path = os.path.join(logdir, f"rank{r}.log")
            sizes[r] = os.path.getsize(path) if os.path.exists(path) else 0
            try:
                os.kill(procs[r].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        got: Dict[int, str] = {}
        seen: Dict[int, int] = {}
        end = time.perf_counter() + STACK_WAIT_S
        while len(got) < len(ranks) and time.perf_counter() < end:
            for r in ranks:
                if r in got:
                    continue
                text = _read(os.path.join(logdir, f"rank{r}.log"))[sizes[r]:]
                m = _STACK_START.search(text)
                # faulthandler writes the dump in one go: take it once it stops growing
                if m and seen.get(r) == len(text):
                    got[r] = _user_stack(text[m.start():])
                seen[r] = len(text)
            if len(got) < len(ranks):
                wait([procs[r].sentinel for r in ranks if r not in got], timeout=0.05)
        for r in ranks:
            if r not in got:
                text = _read(os.path.join(logdir, f"rank{r}.log"))[sizes[r]:]
                m = _STACK_START.search(text)
                got[r] = _user_stack(text[m.start():]) if m else "(the rank did not answer the stack request)"
        return got, sizes


def _entry(task: RankTask, conn) -> None:
    from .rank import rank_main

    rank_main(task, conn)


def _recv(conn) -> Optional[RankOutcome]:
    try:
        return pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return None


def _raised(o: RankOutcome) -> RankProblem:
    where = {"init": " while joining the process group", "import": " while loading the function",
             "return": " while sending its result"}.get(o.phase, "")
    return RankProblem(o.rank, "raised", f"raised {o.exc_type}: {o.exc_message}{where}", o.traceback)


_BOOTSTRAP = (os.sep + "pytest_mgpu" + os.sep + "launch" + os.sep, os.sep + "multiprocessing" + os.sep, '"<string>"')


def _user_stack(dump: str) -> str:
    """A faulthandler dump without the frames of the launcher and multiprocessing below the user's."""
    keep = [ln for ln in dump.strip().splitlines() if not any(b in ln for b in _BOOTSTRAP)]
    return "\n".join(keep)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _tail(text: str, lines: int = 30) -> str:
    rows = text.rstrip().splitlines()
    if not rows:
        return "(the rank printed nothing)"
    cut = rows[-lines:]
    head = "last lines of its output:" if len(rows) > lines else "its output:"
    return head + "\n" + "\n".join(cut)


def _hint(problems: List[RankProblem], spec: LaunchSpec) -> str:
    kinds = {p.kind for p in problems if not p.secondary}
    if "hung" in kinds:
        return (
            "Hint: a rank blocked in a collective usually means the ranks disagree on which "
            "collectives to call (a rank-dependent branch, uneven data). Raise the limit with "
            "dist.run(..., timeout=S) or --mgpu-timeout if the work is just slow."
        )
    return ""
