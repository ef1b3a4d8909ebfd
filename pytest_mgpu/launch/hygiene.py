"""What a call may leave running in a warm rank, found and dealt with after the call.

Child processes are ended (``processes.end_descendants``; the rank is their subreaper). Python threads
cannot be ended from outside, so they are reported, and what they print from then on is dropped: a
thread left by one test once printed into the next test's ``[rank N]`` output. Runs inside ranks.
"""
from __future__ import annotations

import sys
import threading
from typing import List, Optional, Set

from .processes import end_descendants
from .rank import leftover_note


class MutedThreads:
    """A stream that drops what the given threads write (print() goes through ``write``)."""

    def __init__(self, stream):
        self._stream = stream
        self.muted: Set[Optional[int]] = set()

    def write(self, text: str) -> int:
        if threading.get_ident() in self.muted:
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class CallWatch:
    """Threads alive before a call; after it, what the call left behind, as report lines."""

    def __init__(self):
        self.streams: List[MutedThreads] = []
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if not isinstance(stream, MutedThreads):
                stream = MutedThreads(stream)
                setattr(sys, name, stream)
            self.streams.append(stream)
        self.before: Set[Optional[int]] = set()  # Thread.ident: None before start

    def start(self) -> None:
        self.before = {t.ident for t in threading.enumerate()}

    def finish(self, rank: int) -> List[str]:
        notes = leftover_note(rank, end_descendants())
        left = [t for t in threading.enumerate() if t.ident not in self.before and t.is_alive() and not _kept(t)]
        if left:
            names = ", ".join(f"{t.name}{' (daemon)' if t.daemon else ''}" for t in left[:5])
            what = "1 thread" if len(left) == 1 else f"{len(left)} threads"
            notes.append(f"rank {rank} left {what} running: {names}; threads cannot be ended from outside, so "
                         "what they print is dropped from now on (stop and join them in the test)")
            for stream in self.streams:
                stream.muted.update(t.ident for t in left)
        return notes


def _kept(thread: threading.Thread) -> bool:
    """A library's own process-wide thread, kept for every later user and silent: tqdm's monitor
    (``tqdm.tqdm.monitor``, started by the first progress bar; it prints nothing). Not a leftover."""
    tqdm = sys.modules.get("tqdm")
    return tqdm is not None and getattr(getattr(tqdm, "tqdm", None), "monitor", None) is thread
