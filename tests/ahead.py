"""Sessions started ahead of the tests that read them. A module-scoped fixture whose work is one or
more pytest subprocesses that end by themselves (or wait to be stopped) registers that work here with
``@ahead("fixture name")``: a function of ``tmp_path_factory`` that returns its result, or yields it
and cleans up after, as a fixture does. Once collection ended, ``Lane`` (the session fixture ``lane``
in tests/conftest.py) runs the registered work that a selected test asks for, one after the other in
the order the tests come, in a background thread, while the tests before it run (tests/conftest.py
runs the modules that read such work after the others); the fixture then
only takes what was already done (``yield from lane.take(fn)``), or does it at once where the lane has
not reached it yet. The subprocesses mostly wait (limits that must pass, ranks blocked on purpose,
start-ups), and 2 cores running the tests in-process leave a third of their time idle: this fills it.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Iterator, Optional

Work = Callable[[Any], Any]  # (tmp_path_factory) -> the result, or a generator yielding it once


@dataclasses.dataclass
class Ahead:
    fn: Work
    fixture: str  # a test that asks for this fixture, however indirectly, needs the work
    shared: bool = False  # a fixture of conftest.py, which tests of every module ask for
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    claimed: bool = False
    taken: bool = False
    result: Any = None
    error: Optional[BaseException] = None
    rest: Optional[Iterator] = None  # a generator's cleanup, run when its fixture ends


REGISTERED: dict[Work, Ahead] = {}


def ahead(fixture: str, shared: bool = False) -> Callable[[Work], Work]:
    """Registers ``fn`` as the work of ``fixture`` (call it as a decorator at a test module's import;
    ``shared`` where the fixture is conftest.py's, asked for by tests of any module)."""
    def register(fn: Work) -> Work:
        REGISTERED[fn] = Ahead(fn, fixture, shared)
        return fn
    return register


class Lane:
    """Runs the work that ``items`` need, in their order, in one background thread."""

    def __init__(self, factory, items: list, enabled: bool = True):
        self.factory = factory
        self.lock = threading.Lock()
        self.stopped = False
        self.queue: list[Ahead] = []
        for item in items if enabled else ():
            self.queue += [entry for entry in _needed(item) if entry not in self.queue]
        self.thread = threading.Thread(target=self._run, name="tests-ahead", daemon=True)
        if self.queue:
            self.thread.start()

    def _claim(self, entry: Ahead, by_lane: bool) -> bool:
        with self.lock:
            if entry.claimed or (by_lane and self.stopped):
                return False
            entry.claimed = True
            return True

    def _do(self, entry: Ahead) -> None:
        try:
            out = entry.fn(self.factory)
            if hasattr(out, "__next__"):
                entry.rest, out = out, next(out)
            entry.result = out
        except BaseException as e:  # noqa: B036 (a skip or a failure, raised again by the fixture)
            entry.error = e
        finally:
            entry.done.set()

    def _run(self) -> None:
        for entry in self.queue:
            if self._claim(entry, by_lane=True):
                self._do(entry)

    def take(self, fn: Work) -> Iterator:
        """The fixture's value (``yield from lane.take(fn)``): the lane's result, waited for, or the work
        done now where the lane has not started it; the work's cleanup runs when the fixture ends."""
        entry = REGISTERED[fn]
        if self._claim(entry, by_lane=False):
            self._do(entry)
        entry.done.wait()
        entry.taken = True
        if entry.error is not None:
            raise entry.error
        try:
            yield entry.result
        finally:
            _finish(entry)

    def close(self, kill: Callable[[], None]) -> None:
        """At the session's end: no more work starts; work still running is ended by ``kill`` (its
        processes), and the cleanup of work no test took is run."""
        with self.lock:
            self.stopped = True
        if self.thread.is_alive():
            kill()
            self.thread.join(timeout=60)
        for entry in self.queue:
            if entry.done.is_set() and not entry.taken:
                _finish(entry)


def _finish(entry: Ahead) -> None:
    rest, entry.rest = entry.rest, None
    if rest is not None:
        try:
            next(rest)
        except StopIteration:
            pass
        else:
            rest.close()


def needs_ahead(item) -> bool:
    """Whether the test reads work registered here."""
    return bool(_needed(item))


def _needed(item) -> list[Ahead]:
    """The work the test reads: that of the fixtures it asks for, however indirectly."""
    names = set(getattr(item, "fixturenames", ()))
    return [entry for entry in REGISTERED.values()
            if entry.fixture in names and (entry.shared or _same_module(entry.fn, item))]


def _same_module(fn: Work, item) -> bool:
    module = getattr(item, "module", None)
    return module is not None and module.__name__ == fn.__module__
