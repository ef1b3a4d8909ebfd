"""What a rank of a torchrun/srun job says about itself when it ends itself (its monitor thread, while
the main thread is stuck): its main thread's Python stack, and the evidence the test process reads from
spawned ranks (``unfinished.py``): its phase, this call's collectives, and the CPU it used over the last
seconds, from samples its monitor thread takes four times a second.

Why here and not from outside: in a launched job no process is the ranks' parent, and each pytest is
its own rank, so nothing else can read its /proc entry or signal it; the store carries what it says.
Plain Python, no pytest.
"""
from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from collections import deque
from typing import Optional, Tuple

from . import flight

CPU_WINDOW_S = 2.0  # the same window as for spawned ranks (unfinished.CPU_WINDOW_S)

# Frames that say nothing about where the user's code is stuck.
_NOISE = (os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep, os.sep + "pytest_mgpu" + os.sep, "<frozen ",
          os.sep + "pytest" + os.sep + "__main__.py", os.sep + "runpy.py")


def main_thread_stack() -> str:
    """The Python stack of this process's main thread, without pytest's and the plugin's frames."""
    ident = threading.main_thread().ident
    frame = sys._current_frames().get(ident) if ident is not None else None
    if frame is None:
        return "(no stack)"
    rows = [r for r in traceback.format_stack(frame) if not any(n in r.split("\n", 1)[0] for n in _NOISE)]
    return "".join(rows).rstrip() or "(only pytest and pytest-mgpu frames)"


class CpuTrail:
    """This process's CPU time (all its threads), sampled by the monitor thread."""

    def __init__(self):
        self._samples: deque = deque(maxlen=64)

    def tick(self) -> None:
        self._samples.append((time.monotonic(), time.process_time()))

    def used(self) -> Tuple[Optional[float], float]:
        """CPU seconds over the last ``CPU_WINDOW_S`` (or what there is of it), and that window."""
        self.tick()
        now, cpu = self._samples[-1]
        older = [s for s in self._samples if now - s[0] >= CPU_WINDOW_S] or list(self._samples)[:1]
        t0, c0 = older[-1]
        return (cpu - c0, now - t0) if now > t0 else (None, 0.0)


def evidence_blob(trail: CpuTrail) -> bytes:
    """(Evidence, CPU seconds, window) pickled, for the store."""
    cpu, window = trail.used()
    return pickle.dumps((flight.evidence(), cpu, window), protocol=pickle.HIGHEST_PROTOCOL)


def read_evidence_blob(blob: bytes):
    try:
        got = pickle.loads(blob)
        return got if isinstance(got, tuple) and len(got) == 3 else None
    except Exception:
        return None


class Stderr:
    """This process's stderr as it was when the job was joined: pytest captures fd 2 during tests, and
    a rank that ends itself from the monitor thread must still be heard."""

    def __init__(self):
        try:
            self._fd: Optional[int] = os.dup(2)
        except OSError:
            self._fd = None

    def __call__(self, text: str) -> None:
        data = text.encode(errors="replace")
        try:
            if self._fd is None:
                raise OSError
            while data:
                data = data[os.write(self._fd, data):]
        except OSError:
            (sys.__stderr__ or sys.stderr).write(text)
