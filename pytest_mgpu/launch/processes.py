"""Process trees on Linux: find, describe and end every descendant of a rank.

A rank's children may leave its process group (``subprocess.Popen(start_new_session=True)``) and its
grandchildren may be orphaned; ranks make themselves child subreapers (prctl PR_SET_CHILD_SUBREAPER),
so every such process stays below the rank and /proc's parent links find it. Plain Python, used on
both sides: the test process kills a rank's tree, a warm rank ends what a call left running.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Dict, List

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it (not to init), so it can end them."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except Exception:  # not Linux: process groups still cover children that stay in the group
        pass


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one owned by another user counts: it cannot be signalled)."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _parents() -> Dict[int, int]:
    parents: Dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return parents
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[0] != "Z":
                    parents[int(entry)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                pass
    return parents


def descendants(pid: int) -> List[int]:
    """Every live (non-zombie) process below ``pid``, nearest first; [] where /proc is missing."""
    parents = _parents()
    found: List[int] = []
    frontier = {pid}
    while frontier:
        kids = sorted(c for c, pp in parents.items() if pp in frontier and c not in found)
        found += kids
        frontier = set(kids)
    return found


EXEC_WAIT_S = 0.5  # how long an empty command line is read again (a child still inside exec)


def command_line(pid: int) -> str:
    """The process's command line. Read empty while the process is still inside ``execve``: the
    parent's ``subprocess.Popen`` returns when exec closed its pipe, before the kernel sets the new
    arguments (seen at load 8: "sleep 600; pid 12008" for a ``sleep 601`` started just before), so
    an empty one is read again for up to EXEC_WAIT_S; then the executable's name stands in."""
    end = time.monotonic() + EXEC_WAIT_S
    while True:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                parts = [p.decode(errors="replace") for p in f.read().split(b"\0") if p]
        except OSError:
            return f"pid {pid}"
        if parts:
            return " ".join(parts)
        if time.monotonic() > end:
            try:
                return f"{os.path.basename(os.readlink(f'/proc/{pid}/exe'))} (pid {pid})"
            except OSError:
                return f"pid {pid}"
        time.sleep(0.005)


def _kill(pid: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except OSError:
        pass


def kill_tree(pid: int) -> None:
    """SIGKILL a rank, its process group (it made itself group leader) and every descendant that
    left the group."""
    for child in descendants(pid):
        _kill(child)
    _kill(pid, group=True)
    _kill(pid)


def has_children() -> bool:
    """Whether this process has a child, live or a zombie (one system call, ~1 us). A process with
    no child has no descendant either: orphans below a subreaper are re-parented to it."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    except (AttributeError, OSError):  # no waitid (not Linux): ask /proc
        return True
    return True


def end_descendants() -> List[str]:
    """End every process below this one and reap those that are our children; return their
    command lines (what the test left running). Reading /proc's parent links costs ~2-5 ms on a
    machine running ~100 processes, so a process without children is answered at once."""
    if not has_children():
        return []
    me = os.getpid()
    left = descendants(me)
    names = [command_line(p) for p in left]
    for pid in left:
        _kill(pid)
    for _ in left:  # orphans re-parented to us (the subreaper) are our children too
        try:
            if os.waitpid(-1, 0)[0] == 0:
                break
        except ChildProcessError:
            break
    return names
