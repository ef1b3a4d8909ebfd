"""The plugin's state for one pytest process: settings, hardware, launcher, leases, call records."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from .devices import DeviceLease, DeviceLeaser, DevicePlan, Hardware, detect_hardware, plan_for
from .launch.base import Launcher
from .settings import Settings

if TYPE_CHECKING:
    from .launch.external.session import ExternalSession


@dataclass
class TestRecord:
    """What the summary needs to know of one distributed test (from report.user_properties)."""

    nodeid: str
    plan: str
    emulated: bool
    world_size: int
    calls: int
    startup_s: List[float]
    shared: bool = False  # emulated by ranks sharing GPUs (--mgpu-fallback=share)


@dataclass
class MgpuSession:
    settings: Settings
    _hardware: Optional[Hardware] = None
    _launcher: Optional[Launcher] = None
    _leaser: Optional[DeviceLeaser] = None
    records: Dict[str, TestRecord] = field(default_factory=dict)
    # Distributed tests this machine could not run: nodeid -> (world size, the option that runs them).
    skipped: Dict[str, Tuple[int, str]] = field(default_factory=dict)
    # False on every rank but 0 when pytest itself runs inside ranks started by torchrun/srun:
    # only the primary process prints reports and writes report files and baselines.
    is_primary: bool = True
    # The job this process is a rank of, when torchrun/srun started pytest (launch/external/).
    external: Optional["ExternalSession"] = None

    @property
    def hardware(self) -> Hardware:
        if self._hardware is None:
            self._hardware = detect_hardware()
        return self._hardware

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None and self.external is not None:
            from .launch.external.launcher import ExternalLauncher

            self._launcher = ExternalLauncher(self.external)
        if self._launcher is None:
            from .launch.pool import PoolLauncher
            from .launch.spawn import SpawnLauncher

            self._launcher = SpawnLauncher() if self.settings.isolate else PoolLauncher()
        return self._launcher

    def launcher_for(self, isolate: bool) -> Launcher:
        """The launcher for one test: warm ranks, or fresh processes when the test asks for them."""
        return self.launcher.fresh if isolate else self.launcher

    def plan(self, world_size: int) -> DevicePlan:
        if self.external is not None:
            return self.external.plan(world_size, self.settings.fallback)
        return plan_for(world_size, self.hardware, self.settings.fallback, self.settings.max_cpu_ranks)

    def lease(self, plan: DevicePlan, timeout_s: float) -> Optional[DeviceLease]:
        if plan.device_type != "cuda" or self.external is not None:  # external: GPU LOCAL_RANK
            return None
        if self._leaser is None:
            self._leaser = DeviceLeaser(self.hardware.cuda_ids)
        return self._leaser.acquire(plan.gpus_to_lease, timeout_s)

    def close(self) -> None:
        if self._launcher is not None:
            self._launcher.close()

    def summary_lines(self) -> List[str]:
        """Said after every run that had distributed tests, also when none could run (without it,
        `pytest -m gpu4` on a machine without GPUs printed only "28 skipped")."""
        return self._ran_lines() + self._skipped_lines()

    def _skipped_lines(self) -> List[str]:
        by_fix: Dict[str, List[int]] = {}
        for size, fix in self.skipped.values():
            by_fix.setdefault(fix, []).append(size)
        return [f"{len(sizes)} distributed test(s) skipped, needing "
                f"{'/'.join(str(n) for n in sorted(set(sizes)))} GPU(s): {fix}"
                for fix, sizes in by_fix.items()]

    def _ran_lines(self) -> List[str]:
        if not self.records:
            return []
        recs = list(self.records.values())
        shared = sum(r.shared for r in recs)
        emulated = sum(r.emulated for r in recs) - shared
        starts = [s for r in recs for s in r.startup_s]
        calls = sum(r.calls for r in recs)
        line = f"{len(recs)} distributed test(s), {calls} call(s)"
        if emulated:
            line += f"; {emulated} emulated on CPU ranks (gloo)"
        if shared:
            line += f"; {shared} emulated by ranks sharing GPUs (gloo)"
        if starts:
            line += (
                f"; rank start-up per call: median {statistics.median(starts) * 1000:.0f} ms, "
                f"max {max(starts) * 1000:.0f} ms"
            )
        return [line]
