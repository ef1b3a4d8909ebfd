"""Files that concurrent sessions share (the baselines): an flock that leaves no side file behind,
and writes that a reader never sees half done."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

__all__ = ["locked", "replace_atomically"]


@contextlib.contextmanager
def locked(lock: Path) -> Iterator[None]:
    """An exclusive flock on the side file ``lock``, removed again when released, so that nothing is
    left beside the baselines to commit. A waiter that got the lock of a file its holder has since
    removed tries again on the new one (the inode behind the name must be the one locked)."""
    import fcntl  # POSIX only, and only needed when saving

    while True:
        fd = os.open(str(lock), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(lock)  # before the unlock: a waiter then sees its file is gone
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def replace_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, readable by all (0644)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
