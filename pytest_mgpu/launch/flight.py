"""Inside a rank: what it is doing (starting, running the test's function, done) and the collectives
this call entered, read from torch's flight recorder, and written to a file when the test process asks.

Why the flight recorder: a hung rank's Python stack says *that* it waits in a collective, not which one
its peers are in. torch records every collective of every group (gloo and NCCL) in a ring buffer when
``TORCH_FR_BUFFER_SIZE`` is set before the group is created (measured 2026-11-23, torch 2.14.1: entries
carry ``collective_seq_id``, ``profiling_name`` such as ``gloo:broadcast``, ``input_sizes``, and
``retired`` False while the collective is unfinished; the state field stays "scheduled" on gloo).

Why a thread and the wakeup fd: a rank blocked in a C++ collective never runs a Python signal handler
(those run in the main thread, between bytecodes). ``signal.set_wakeup_fd`` is written by the C-level
handler itself, at once, so a thread blocked on the other end of that pipe wakes while the main thread
is still stuck. The test process sends one signal (SIGUSR1, the one that already prints the stack
through faulthandler, chained) and gets both the stack and this evidence.

Why set it: torch 2.14.1 records by default (2000 entries when the variable is unset, measured), older
versions may not; 1000 entries keep a failing call's dump at ~35 ms (2000: ~58 ms). A user's own value,
0 included, wins (``recorder_env``).

Why sequence numbers relative to the call: warm ranks keep their group across calls, and the recorder's
``collective_seq_id`` counts from the group's creation (measured: it restarts at 1 in every new group,
subgroups and re-created default groups included; the recorder's ``pg_id`` is new for each). A call's
collective #1 is the first it entered: ``pg_status`` (11 us) at the call's start gives each existing
group's count to subtract. Costs: two ``pg_status`` reads per call; a full dump (1000 entries: ~35 ms)
only for a rank that raised or that the test process asks (a hung one).

Runs in ranks (never imports pytest); the dataclasses cross to the test process.
"""
from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Literal, Optional, Tuple

RECORDER_ENV = "TORCH_FR_BUFFER_SIZE"
RECORDER_ENVS = (RECORDER_ENV, "TORCH_NCCL_TRACE_BUFFER_SIZE")  # torch reads both; a user who set either keeps it
RECORDER_ENTRIES = 1000  # per rank; a dump of 1000 entries takes ~35 ms, only when a call fails
EVIDENCE_SUFFIX = ".evidence"  # next to the rank's log of the call
DUMP_SIGNAL = signal.SIGUSR1  # the stack request (rank.STACK_SIGNAL): one request, both answers

Phase = Literal["starting", "running", "done"]


@dataclass(frozen=True)
class Collective:
    """One collective a rank entered in this call."""

    group: int  # the recorder's group id: the same on every rank, as groups are created in step
    group_name: str  # "" for the default group
    seq: int  # its number in the group within this call: 1 is the call's first
    op: str  # all_reduce, broadcast, all_gather, barrier, ...
    sizes: Tuple = ()  # input sizes
    dtypes: Tuple = ()
    done: bool = True  # False: still waiting for it to finish
    backend: str = ""  # gloo, nccl (from the recorder's profiling name)
    age_s: float = 0.0  # how long ago it was entered, when the dump was taken


@dataclass
class Evidence:
    """What a rank says about itself when asked (written to ``<log>.evidence``)."""

    phase: Phase
    collectives: Optional[List[Collective]] = None  # None: no recorder (off, or its dump failed)
    last: Dict[int, int] = field(default_factory=dict)  # per group id: the last collective of this call
    running_at: float = 0.0  # time.monotonic() when the test's function began (0: not yet)


def recorder_env(environ) -> Dict[str, str]:
    """The variable that turns the recorder on in ranks, unless the user set one (0 turns it off)."""
    if any(environ.get(name) not in (None, "") for name in RECORDER_ENVS):
        return {}
    from .. import compat

    if not compat.available("flight_recorder"):
        return {}  # the session's header says why
    return {RECORDER_ENV: str(RECORDER_ENTRIES)}


class _Call:
    """This process's current call (module state: one rank per process)."""

    wakeup: int = -1  # the pipe end the C-level signal handler writes to (arm)
    path: str = ""
    backend: str = ""
    phase: Phase = "starting"
    running_at: float = 0.0
    base: Dict[int, int] = {}
    told: List[Callable[[], None]] = []  # told once, when the test's function starts (``when_running``)


_CALL = _Call()


def begin(log_path: str, backend: str) -> None:
    """A call (or the rank itself) is starting: evidence goes next to ``log_path``."""
    _CALL.path = log_path + EVIDENCE_SUFFIX if log_path else ""
    _CALL.backend = backend
    if _CALL.wakeup >= 0 and threading.current_thread() is threading.main_thread():
        signal.set_wakeup_fd(_CALL.wakeup, warn_on_full_buffer=False)  # a call's asyncio loop may have reset it
    _CALL.phase = "starting"
    _CALL.running_at = 0.0
    _CALL.base = {}


def running() -> None:
    """The test's function starts now: collectives counted from here, and whoever asked is told."""
    _CALL.base = _status()
    _CALL.phase = "running"
    _CALL.running_at = time.monotonic()
    told, _CALL.told = _CALL.told, []
    for tell in told:
        tell()


def when_running(tell: Callable[[], None]) -> None:
    """Call ``tell`` once the test's function starts (a fresh rank's launcher: the limit starts then)."""
    _CALL.told = [*_CALL.told, tell]


def finished() -> None:
    _CALL.phase = "done"


def last_collectives() -> Dict[int, int]:
    """Per group, the number of this call's last collective (cheap: no entries are dumped)."""
    return {g: n - _CALL.base.get(g, 0) for g, n in _status().items() if n - _CALL.base.get(g, 0) > 0}


def collectives() -> Optional[List[Collective]]:
    """This call's collectives from the recorder, oldest first; None when there is no recorder."""
    raw = _dump(True)
    if raw is None or not raw["entries"] and not raw["pg_status"]:
        return None  # off (TORCH_FR_BUFFER_SIZE=0): it then reports no group at all
    out, now_ns = [], time.time_ns()
    for e in raw.get("entries", []):
        g = int(e.get("pg_id", 0))
        seq = int(e.get("collective_seq_id", 0)) - _CALL.base.get(g, 0)
        if seq <= 0 or e.get("is_p2p"):
            continue
        name, desc = (tuple(e.get("process_group") or ("", "")) + ("", ""))[:2]
        backend, _, op = str(e.get("profiling_name", "?")).rpartition(":")
        out.append(Collective(
            group=g, group_name="" if desc == "default_pg" else str(desc if desc not in ("", "undefined") else name),
            seq=seq, op=op, sizes=_frozen(e.get("input_sizes")), dtypes=_frozen(e.get("input_dtypes")),
            done=bool(e.get("retired", True)) or e.get("state") == "completed", backend=backend,
            age_s=max(0.0, (now_ns - int(e.get("time_created_ns") or now_ns)) / 1e9),
        ))
    return out


def evidence() -> Evidence:
    return Evidence(_CALL.phase, collectives(), last_collectives(), _CALL.running_at)


def arm() -> None:
    """Answer ``DUMP_SIGNAL`` with an evidence file, also while the main thread is stuck in C++.
    Call before ``faulthandler.register(DUMP_SIGNAL, chain=True)``, which then chains to this."""
    if threading.current_thread() is not threading.main_thread():
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.signal(DUMP_SIGNAL, _ignore)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    _CALL.wakeup = w
    threading.Thread(target=_serve, args=(r,), name="mgpu-evidence", daemon=True).start()


def _ignore(signum, frame) -> None:
    """The Python-level handler: the work is done by the thread woken through the wakeup fd."""


def _serve(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 512)
        except OSError:
            return
        if not data:
            return
        if int(DUMP_SIGNAL) in data and _CALL.path:
            _write(_CALL.path)


def _write(path: str) -> None:
    try:
        blob = pickle.dumps(evidence(), protocol=pickle.HIGHEST_PROTOCOL)
        tmp = f"{path}.{time.monotonic_ns()}.tmp"
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)  # the test process never reads half a file
    except Exception:
        pass  # no evidence: the test process falls back on the stack and the CPU time


def _frozen(value) -> Tuple:
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _dump(entries: bool) -> Optional[dict]:
    """The recorder's dump, or None. On an NCCL group the NCCL recorder's entries are added to the CPU
    recorder's (gloo subgroups of an NCCL job stay in the latter): untested here, there is no GPU."""
    try:
        from torch._C import _distributed_c10d as c10d

        # private torch functions, missing from torch's stubs (a missing one is caught below)
        nccl = [c10d._dump_nccl_trace] if _CALL.backend == "nccl" else []  # type: ignore[attr-defined]
        dumps = [c10d._dump_fr_trace] + nccl  # type: ignore[attr-defined]
        raws = [pickle.loads(fn(entries, False, False)) for fn in dumps]
    except Exception:
        return None
    merged: dict = {"entries": [], "pg_status": {}}
    for raw in raws:
        merged["entries"] += raw.get("entries") or []
        for g, st in (raw.get("pg_status") or {}).items():
            try:
                n = max(0, int(st.get("last_enqueued_collective", 0)))
            except (TypeError, ValueError, AttributeError):
                continue
            merged["pg_status"][int(g)] = max(n, merged["pg_status"].get(int(g), 0))
    return merged


def _status() -> Dict[int, int]:
    """Per group id, how many collectives it has enqueued so far (11 us; {} when the recorder is off)."""
    raw = _dump(False)
    return raw["pg_status"] if raw else {}
