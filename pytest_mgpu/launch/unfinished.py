"""A rank still running at its call's limit: blocked (hung), still computing, or still starting, told
apart by evidence, never by the limit alone.

Why: on a loaded 2-core CI machine (load 4-12) a single-process pipeline benchmark computing in
autograd's backward ran past the 300 s limit and a freshly rebuilt 4-rank pool was still importing the
test module after 6 s (docs/design/failures.md, "Under load"); both were reported "hung", with a hint about
collectives that sent the user looking for a deadlock that was not there.

The evidence, in the order it decides:
- **starting**: the rank had not begun the test's function (not joined the group, or still importing
  the function's module), from the rank's own phase (``flight.py``);
- **blocked** in a collective: its innermost Python frame is in torch.distributed, or (NCCL, where a
  waiting host thread may spin) the recorder shows an unfinished collective older than the window;
- **computing**: its CPU time (``/proc/<pid>/stat``, its descendants included) advanced by at least
  ``ADVANCING`` of one core over the last ``CPU_WINDOW_S`` seconds before the limit, or over a fresh
  ``RESAMPLE_S`` where its function began inside that window (the start-up's CPU is not the function's);
- otherwise **blocked** (sleeping, waiting on a lock, a pipe, a peer).

Measured 2026-11-24 on the shared 2-core machine (tests/test_verdicts.py's cases): a rank blocked in a
gloo collective or in ``time.sleep`` used 0-20 ms of CPU in the 2 s window (load 6-13); a rank spinning in
Python used 0.87-1.14 s at load 6-9 and 0.37 s at load 11-13 (median of benchmarks/load.py --procs 6), a
single process in autograd's backward 0.18 s at load 11-13. The line, 2.5% of a core (50 ms in 2 s),
sits 2.5x above the busiest blocked rank and 3.6x below the least served computing one.
"""
from __future__ import annotations

import os
import pickle
import re
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Dict, Literal, Optional, Sequence, Tuple

from .attribution import in_collective
from .flight import EVIDENCE_SUFFIX, Collective, Evidence
from .processes import descendants

CPU_WINDOW_S = 2.0  # CPU time is compared over this much time before the limit
ADVANCING = 0.025  # of one core over the window: at or above it a rank is computing
MIN_WINDOW_S = 0.25  # a shorter window is re-measured (25 clock ticks)
RESAMPLE_S = 0.5  # a fresh window for a rank whose function began inside the first one
STACK_WAIT_S = 2.0  # how long a rank gets to print its stack and write its evidence

Kind = Literal["blocked", "computing", "starting"]

_STACK_START = re.compile(r"^(Current thread|Thread) 0x", re.M)
_BOOTSTRAP = (
    os.sep + "pytest_mgpu" + os.sep + "launch" + os.sep,
    os.sep + "multiprocessing" + os.sep,
    '"<string>"',
    os.sep + "threading.py",
)
_MAIN_BOTTOM = '"<string>", line 1 in <module>'  # the forkserver child's first frame
_TICK = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


@dataclass(frozen=True)
class Verdict:
    """What one unfinished rank was doing when the limit came."""

    kind: Kind
    cpu_s: Optional[float]  # CPU it used over the window (None: not measured)
    window_s: float
    waiting_in: Optional[Collective] = None  # the unfinished collective it waits in, when recorded
    in_collective: bool = False  # waiting inside a collective (stack or recorder)


def cpu_seconds(pid: int) -> Optional[float]:
    """CPU time of a process and its descendants (live, and those it has reaped): utime + stime +
    cutime + cstime from /proc. None when the process is gone or there is no /proc."""
    total = None
    for p in [pid] + descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total = (total or 0.0) + sum(int(x) for x in fields[11:15]) * _TICK
        except (OSError, IndexError, ValueError):
            if p == pid:
                return None
    return total


class CpuWatch:
    """Samples the ranks' CPU time once inside the last window before a (moving) deadline, and once at
    the deadline. Between calls nothing is read: a warm call pays nothing for it."""

    def __init__(self, pids: Sequence[int]):
        self.pids = list(pids)
        self.first: Dict[int, float] = {}
        self.first_t: Optional[float] = None

    def due(self, deadline: float) -> float:
        """When the window's first sample is due (``deadline`` when it is taken)."""
        start = deadline - CPU_WINDOW_S
        return deadline if self.first_t is not None and self.first_t >= start else start

    def poll(self, now: float, deadline: float, ranks) -> None:
        start = deadline - CPU_WINDOW_S
        if now >= start and (self.first_t is None or self.first_t < start):
            self.sample(now, ranks)

    def sample(self, now: float, ranks) -> None:
        self.first = {r: c for r in ranks if (c := cpu_seconds(self.pids[r])) is not None}
        self.first_t = now

    def used(self, ranks) -> Tuple[Dict[int, float], float]:
        """CPU used by each rank since the window's first sample, and the window's length. Where
        the window is too short to say anything (a deadline that came at once), it waits one."""
        now = time.monotonic()
        if self.first_t is None or now - self.first_t < MIN_WINDOW_S:
            self.sample(now, ranks)
            time.sleep(MIN_WINDOW_S)
            now = time.monotonic()
        got = {}
        for r in ranks:
            c = cpu_seconds(self.pids[r])
            if c is not None and r in self.first:
                got[r] = max(0.0, c - self.first[r])
        return got, max(1e-3, now - (self.first_t or now))

    def began_inside(self, evidence: Optional[Evidence]) -> bool:
        """Whether the rank's function began after the window's first sample: then the window also
        counted its start-up (importing the test's module, unpickling its arguments), which a rank
        that then blocks at once would show as computing under load."""
        return (evidence is not None and self.first_t is not None and evidence.running_at > self.first_t)

    def resample(self, ranks) -> Tuple[Dict[int, float], float]:
        """CPU used by ``ranks`` over a fresh window of RESAMPLE_S, from now."""
        self.sample(time.monotonic(), ranks)
        time.sleep(RESAMPLE_S)
        return self.used(ranks)


def classify(started: bool, cpu_s: Optional[float], window_s: float, stack: str,
             evidence: Optional[Evidence]) -> Verdict:
    """The rule in this module's docstring."""
    waiting = None
    if evidence is not None and evidence.collectives:
        pending = [c for c in evidence.collectives if not c.done]
        waiting = pending[-1] if pending else None
    if not started or (evidence is not None and evidence.phase == "starting"):
        return Verdict("starting", cpu_s, window_s)
    # NCCL's host threads may spin while they wait for the device, so CPU time proves nothing there:
    # an NCCL collective unfinished for the whole window is the evidence instead (untested: no GPU).
    spins = waiting is not None and waiting.backend == "nccl" and waiting.age_s >= window_s
    if in_collective(stack) or spins:
        return Verdict("blocked", cpu_s, window_s, waiting, in_collective=True)
    if cpu_s is not None and cpu_s >= ADVANCING * window_s:
        return Verdict("computing", cpu_s, window_s, waiting)
    return Verdict("blocked", cpu_s, window_s, waiting, in_collective=waiting is not None)


def request_dumps(procs, ranks, log_paths, evidence_only=()) -> Tuple[Dict[int, str], Dict[int, Optional[Evidence]],
                                                                      Dict[int, int]]:
    """Ask ranks for their Python stack (faulthandler) and their evidence (``flight.py``), both on one
    signal, and read them back; ``evidence_only``: ranks whose stack is not wanted (warm ranks that
    returned: their recorders still count). Returns stacks, evidence and the log offsets where the
    dumps begin."""
    asked = sorted(set(ranks) | set(evidence_only))
    sizes = {}
    for r in asked:
        path = log_paths[r]
        sizes[r] = os.path.getsize(path) if os.path.exists(path) else 0
        try:
            os.unlink(path + EVIDENCE_SUFFIX)  # a warm rank's log path serves every call: none is stale
        except OSError:
            pass
        try:
            os.kill(procs[r].pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    stacks: Dict[int, str] = {}
    found: Dict[int, Optional[Evidence]] = {}
    seen: Dict[int, int] = {}
    end = time.perf_counter() + STACK_WAIT_S

    def missing():
        return [r for r in asked if r not in found or (r in ranks and r not in stacks)]

    while missing() and time.perf_counter() < end:
        for r in missing():
            if r not in found and os.path.exists(log_paths[r] + EVIDENCE_SUFFIX):
                found[r] = read_evidence(log_paths[r] + EVIDENCE_SUFFIX)
            if r in stacks or r not in ranks:
                continue
            text = read(log_paths[r])[sizes[r]:]
            m = _STACK_START.search(text)
            # the dump is complete once the main thread's bottom frame is out and it stops growing
            if m and _MAIN_BOTTOM in text and seen.get(r) == len(text):
                stacks[r] = user_stack(text[m.start():])
            seen[r] = len(text)
        if missing():
            wait([procs[r].sentinel for r in missing()], timeout=0.05)
    for r in ranks:
        if r not in stacks:
            text = read(log_paths[r])[sizes[r]:]
            m = _STACK_START.search(text)
            stacks[r] = user_stack(text[m.start():]) if m else "(the rank did not answer the stack request)"
    return stacks, {r: found.get(r) for r in asked}, sizes


def read_evidence(path: str) -> Optional[Evidence]:
    try:
        with open(path, "rb") as f:
            got = pickle.load(f)
        return got if isinstance(got, Evidence) else None
    except Exception:
        return None


def user_stack(dump: str) -> str:
    """A faulthandler dump without the frames of the launcher, multiprocessing and threading, and
    without the threads that are only ours (the launcher watch, the evidence thread)."""
    kept = []
    for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip()):
        head, *frames = block.strip().splitlines()
        frames = [ln for ln in frames if ln.strip() and not any(b in ln for b in _BOOTSTRAP)]
        if frames:
            kept.append("\n".join([head] + frames))
    return "\n\n".join(kept) or dump.strip()


def read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def collective_name(c: Collective) -> str:
    where = f" of group {c.group_name}" if c.group_name else ""
    return f"collective #{c.seq} ({c.op}){where}"


def cpu_words(v: Verdict) -> str:
    if v.cpu_s is None:
        return "its CPU time could not be read"
    return f"{v.cpu_s:.2f}s of CPU in the last {v.window_s:.1f}s"

