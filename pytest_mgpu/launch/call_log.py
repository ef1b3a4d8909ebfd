"""A warm rank's output: one file per rank for all its calls, emptied as each call starts.

Standard output and error (file descriptors 1 and 2, so C++ and child processes write there too) go to
the file the test process reads after the call. Creating a file per call and removing it after cost
a system call or two on each side of every call; one file, truncated, costs one ``ftruncate``, and
the size it reached tells the test process whether there is anything to read at all.

Runs in ranks.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Tuple


class CallLog:
    """``start(path)`` before a call; ``size()`` after it (flushed), None when fd 1 is no longer ours."""

    def __init__(self):
        self.path = ""
        self.ident: Optional[Tuple[int, int]] = None  # (st_dev, st_ino) of the file fds 1 and 2 write to

    def _ours(self) -> bool:
        if self.ident is None:
            return False
        try:
            return all((s.st_dev, s.st_ino) == self.ident for s in (os.fstat(1), os.fstat(2)))
        except OSError:
            return False

    def start(self, path: str) -> None:
        """Output from here on goes to ``path``, empty. A call that pointed fd 1 or 2 elsewhere (dup2)
        gets the file opened again rather than truncating what it pointed them at."""
        sys.stdout.flush()
        sys.stderr.flush()
        if path == self.path and self._ours():
            try:
                os.ftruncate(1, 0)  # O_APPEND: the next write lands at the new end, 0
                return
            except OSError:
                pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        st = os.fstat(1)
        self.path, self.ident = path, (st.st_dev, st.st_ino)

    def size(self) -> Optional[int]:
        """Bytes the call wrote so far, Python's buffers flushed; None: unknown (read the file)."""
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            return os.fstat(1).st_size if self._ours() else None
        except (OSError, ValueError):
            return None
