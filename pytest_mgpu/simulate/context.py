"""Where a ``simulate()`` call takes its defaults from: the running test, the session, or nothing.

``simulate`` is a plain function, usable in any test, fixture or script, so it cannot take a fixture.
The plugin (``simulate/plugin.py``) pushes the session's settings at configure and the running test's
(its node id, its ``mgpu_timeout`` marker, pytest-timeout's deadline) at each test's setup; outside
pytest the defaults are those of a session without options (300 s, seed 0).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, List, Optional

from ..settings import DEFAULT_TIMEOUT_S, DEFAULT_TIMEOUT_SOURCE


@dataclass(eq=False)  # compared by identity: the stack holds equal-looking sessions
class CallDefaults:
    """What a ``simulate()`` call inherits: the same limits and seed a ``dist.run`` would get."""

    label: str = ""  # the test's node id; "" outside a test
    timeout_s: float = DEFAULT_TIMEOUT_S
    timeout_source: str = DEFAULT_TIMEOUT_SOURCE
    outer_deadline: Optional[float] = None  # time.monotonic() at which pytest-timeout ends the test
    outer_source: str = ""
    seed: int = 0
    invocation_dir: str = ""
    launcher: Optional[Callable[[], Any]] = None  # the session's fresh-process launcher, when there is one
    done: List[Any] = field(default_factory=list)  # this test's Simulations, for the session's table
    problem: str = ""  # the test's mgpu_timeout marker is malformed: said when simulate() needs it

    def for_test(self, label: str, timeout_s: float, timeout_source: str, problem: str = "") -> "CallDefaults":
        return replace(self, label=label, timeout_s=timeout_s, timeout_source=timeout_source, outer_deadline=None,
                       outer_source="", done=[], problem=problem)


_STACK: List[CallDefaults] = []  # sessions (pytester runs one inside another), then the running test


def current() -> CallDefaults:
    return _STACK[-1] if _STACK else CallDefaults()


def push(defaults: CallDefaults) -> None:
    _STACK.append(defaults)


def pop(defaults: CallDefaults) -> None:
    for i in range(len(_STACK) - 1, -1, -1):
        if _STACK[i] is defaults:
            del _STACK[i]
            return
