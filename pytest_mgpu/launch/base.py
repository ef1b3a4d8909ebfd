"""What every launcher shares: the call it is given (``LaunchSpec``), what it gives back
(``LaunchResult``), and the ``Launcher`` protocol that the session and ``dist`` hold.

It is a module of its own so that the three launchers (fresh ranks in ``spawn.py``, warm ranks in
``pool.py``, the ranks of a torchrun/srun job in ``external/``) depend on one small module instead of
on each other, and so that the session can hold "a launcher" without knowing which one it has.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Tuple

from .collect import CallLimit
from .protocol import FnRef


@dataclass(frozen=True)
class LaunchSpec:
    """What to start: the shape of the group and how long it may take."""

    nprocs: int
    backend: str = "gloo"
    device_type: str = "cpu"
    device_ids: Tuple[str, ...] = ()  # physical CUDA ids visible to every rank; rank r uses cuda:r
    test_devices: int = 0  # devices the test holds (emulated: one cpu per device); 0 = nprocs
    emulated: bool = False
    seed: int = 0
    per_rank_seed: bool = False
    timeout_s: float = 300.0
    label: str = "dist.run"
    env: Dict[str, str] = field(default_factory=dict)
    timeout_source: str = "--mgpu-timeout"  # where timeout_s came from, named when it fires
    outer_deadline: Optional[float] = None  # time.monotonic() at which pytest-timeout ends the test
    outer_source: str = ""  # e.g. "pytest-timeout's limit of 4s (--timeout)"

    def limit(self) -> CallLimit:
        return CallLimit(self.timeout_s, self.timeout_source, self.outer_deadline, self.outer_source)

    def describe(self) -> str:
        where = f"{self.backend} on {self.device_type}"
        if self.emulated:
            where += " (emulated)"
        return f"{self.label} [{self.nprocs} rank(s), {where}]"


@dataclass
class LaunchResult:
    values: List[Any]
    logs: List[str]
    startup_s: float  # the call's wall time not spent in the user's function (start, join, return)
    wall_s: float
    notes: List[str] = field(default_factory=list)  # what ranks left behind (children, threads)

    @classmethod
    def of(cls, got, log_paths, t0: float) -> "LaunchResult":
        """From what ``collect.collect`` gathered of ranks this process started."""
        values = [got.outcomes[r].value for r in range(len(log_paths))]
        wall = time.perf_counter() - t0
        work = max((o.run_s for o in got.outcomes.values()), default=0.0)
        notes = [n for r in sorted(got.outcomes) for n in got.outcomes[r].notes]
        return cls(values, got.logs(log_paths), max(0.0, wall - work), wall, notes)


class Launcher(Protocol):
    """Runs one call on ranks: what ``dist`` and the session need of any launcher."""

    def run(self, spec: LaunchSpec, fn: FnRef, payload: bytes) -> LaunchResult:
        """Run ``fn`` (with the pickled ``payload``) on ``spec.nprocs`` ranks; the values in rank order,
        or ``RankFailure``."""
        ...

    def prewarm(self, spec: LaunchSpec) -> None:
        """Start now what a call of ``spec`` will need, before an outer timer (pytest-timeout) starts,
        so that start-up is not counted against the test. May do nothing."""
        ...

    def close(self) -> None:
        """End everything this launcher started (session end, interrupt)."""
        ...

    @property
    def fresh(self) -> "Launcher":
        """The launcher for a test that asks for fresh rank processes (``--mgpu-isolate``, marker).

        Every launcher answers, so that the session chooses by asking rather than by probing: one that
        reuses ranks gives a fresh-process launcher, one whose every call is already as fresh as it can
        be (fresh processes, or the processes of a torchrun/srun job) gives itself."""
        ...
