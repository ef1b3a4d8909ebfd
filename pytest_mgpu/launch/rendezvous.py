"""How ranks find each other: one TCPStore per test process, on a port the OS picks.

The store lives in the test process for the whole session, so its port is bound before any rank
starts (no "Address already in use", no fixed ports, safe under pytest-xdist), and every launch gets
its own key prefix instead of a fresh server (re-creating stores was measured to stall ~5 s in 1 of
10 re-inits; a long-lived store with prefixes did not).
"""
from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from torch.distributed import TCPStore

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Rendezvous:
    host: str
    port: int
    prefix: str


class StoreServer:
    """The session's TCPStore server, started on first use."""

    def __init__(self, host: str = HOST):
        self._host = host
        self._store: Optional[TCPStore] = None
        self._pid: Optional[int] = None
        self._lock = threading.Lock()
        self._counter = itertools.count()

    def _ensure(self):
        if self._store is None or self._pid != os.getpid():
            import torch.distributed as dist

            self._store = dist.TCPStore(
                self._host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
            )
            self._pid = os.getpid()
        return self._store

    def new_rendezvous(self) -> Rendezvous:
        with self._lock:
            store = self._ensure()
            return Rendezvous(self._host, store.port, f"mgpu/{os.getpid()}/{next(self._counter)}/")

    def close(self) -> None:
        self._store = None
