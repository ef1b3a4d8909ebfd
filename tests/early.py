"""Pytest sessions started early: a test module whose module-scoped fixture runs pytest subprocess
sessions that mostly wait (ranks blocked on purpose until a limit) registers a builder of those runs
here (``register``), and its fixture asks for them with ``Early.wait``. The session-scoped fixture
``early`` (tests/conftest.py) starts the registered groups of the modules selected, one group at a
time, in the background from the start of the session, the group needed last first: their waits
overlap the in-process tests before them instead of adding to the serial run. A group not yet started
when its module needs it starts then. Nothing starts early under pytest-xdist (each worker collects
every module) or where only one such module is selected."""
from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional

BUILDERS: Dict[str, Callable] = {}  # test module name -> builder(tmp_path_factory) -> runs for run_together


def register(module: str) -> Callable[[Callable], Callable]:
    """Decorator: ``builder(tmp_path_factory)`` makes the runs (``(Subpytest, args)``, as for
    ``run_together``) of ``module``'s sessions."""
    def deco(builder: Callable) -> Callable:
        BUILDERS[module] = builder
        return builder
    return deco


class Early:
    """The groups of one session: started in ``order`` by a background thread, one at a time (each
    is two or three pytests already), or at once by ``wait``."""

    def __init__(self, factory, order: List[str], start_early: bool):
        from tests.conftest import start_together

        self._start_together = start_together
        self._factory = factory
        self._lock = threading.Lock()
        self._started: Dict[str, object] = {}
        self._order = [m for m in order if m in BUILDERS]
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if start_early and len(self._order) > 1:
            self._thread = threading.Thread(target=self._run, daemon=True, name="early-sessions")
            self._thread.start()

    def _start(self, module: str):
        with self._lock:
            if module not in self._started:
                runs = BUILDERS[module](self._factory)
                self._started[module] = (runs, self._start_together(runs))
            return self._started[module]

    def _run(self) -> None:
        for module in self._order:
            if self._stop.is_set():
                return
            _, group = self._start(module)
            while not self._stop.is_set() and not group.done(1.0):  # one group at a time
                pass

    def wait(self, module: str, timeout: float):
        """(runs, how each ended) of ``module``'s sessions, started now if not yet."""
        runs, group = self._start(module)
        return runs, group.wait(timeout)

    def close(self) -> None:
        """Stop starting groups; kill what any group left running (a session that was never waited for)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for _, group in list(self._started.values()):
            group.kill()
