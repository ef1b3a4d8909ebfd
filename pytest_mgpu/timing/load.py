"""What else runs on the ranks' cores: the runner's load, said beside a ``noisy`` verdict.

Two readings, both from Linux's ``/proc`` (elsewhere: nothing is said): the 1-minute load average
against the cores this process (and so its ranks) may run on, and the CPU time that processes
outside this process tree, allowed on those cores, used over a short window. Only read when a
verdict needs the words; it never decides a verdict.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

BUSY = 0.1  # share of one core over the window from which another process is named
EXPLAINS = 0.5  # cores' worth of other processes' CPU time that is said to explain noise
WINDOW_S = 0.25  # how long the processes' CPU time is watched


@dataclass(frozen=True)
class Busy:
    """A process outside this process tree that kept a core busy."""

    pid: int
    name: str
    share: float  # of one core, over the window


@dataclass(frozen=True)
class RunnerLoad:
    loadavg: float  # 1-minute load average
    cores: int  # cores this process may run on
    busy: Tuple[Busy, ...] = ()  # other processes busy on those cores, busiest first
    others: float = 0.0  # cores' worth of CPU time all other processes on those cores used

    def describe(self) -> str:
        """The load's words where it explains noise (other processes' CPU time on the ranks' cores, or
        the load average over the cores), with the numbers; "" where it does not."""
        parts = []
        if self.others >= EXPLAINS:
            names = ", ".join(f"pid {b.pid} {b.name} {b.share * 100:.0f}%" for b in self.busy[:3])
            more = f" and {len(self.busy) - 3} more" if len(self.busy) > 3 else ""
            parts.append(f"other processes used {self.others:.1f} of the ranks' {self.cores} core(s)"
                         + (f" ({names}{more})" if names else ""))
        if self.loadavg > self.cores:
            parts.append(f"load average {self.loadavg:.1f} on {self.cores} core(s)")
        return "runner loaded: " + "; ".join(parts) if parts else ""


def _cpu_list(text: str) -> FrozenSet[int]:
    """``0-3,6`` -> {0, 1, 2, 3, 6}."""
    out: Set[int] = set()
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.update(range(int(lo), int(hi) + 1))
        elif part:
            out.add(int(part))
    return frozenset(out)


def _stat(pid: str) -> Optional[Tuple[int, str, int]]:
    """(parent pid, name, utime + stime in ticks) of a process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1: text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), name, int(fields[11]) + int(fields[12])


def _snapshot() -> Dict[int, Tuple[int, str, int]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(entry)
            if st is not None:
                out[int(entry)] = st
    return out


def _tree(root: int, parents: Dict[int, int]) -> Set[int]:
    """``root`` and its descendants (the ranks, their forkserver)."""
    mine, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in mine and pid not in mine}
        mine |= more
        grew = bool(more)
    return mine


def _allowed(pid: int) -> Optional[FrozenSet[int]]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return _cpu_list(line.split(":", 1)[1])
    except OSError:
        return None
    return None


def busy_others(before: Dict[int, Tuple[int, str, int]], after: Dict[int, Tuple[int, str, int]],
                seconds: float, ticks: int, cores: FrozenSet[int], me: int) -> List[Busy]:
    """Every process outside ``me``'s tree that used CPU between two snapshots and may run on
    ``cores``, with its share of one core; busiest first."""
    mine = _tree(me, {pid: st[0] for pid, st in after.items()})
    out = []
    for pid, (_, name, cpu) in after.items():
        if pid in mine or pid not in before or cpu <= before[pid][2]:
            continue
        allowed = _allowed(pid)
        if allowed is None or allowed & cores:
            out.append(Busy(pid, name, (cpu - before[pid][2]) / ticks / seconds))
    return sorted(out, key=lambda b: -b.share)


def probe(window_s: float = WINDOW_S) -> Optional[RunnerLoad]:
    """The runner's load now; None where /proc or the load average cannot be read."""
    try:
        cores = frozenset(os.sched_getaffinity(0))
        loadavg = os.getloadavg()[0]
        ticks = os.sysconf("SC_CLK_TCK")
        start, before = time.monotonic(), _snapshot()
        time.sleep(window_s)
        after, seconds = _snapshot(), time.monotonic() - start
    except (OSError, AttributeError, ValueError):
        return None
    others = busy_others(before, after, seconds, ticks, cores, os.getpid())
    return RunnerLoad(loadavg, len(cores), tuple(b for b in others if b.share >= BUSY), sum(b.share for b in others))
