"""Which devices a test gets: a DevicePlan (cuda ranks, emulated cpu ranks, or a skip with reason),
and disjoint device leases so that pytest-xdist workers never share a GPU.
"""
from __future__ import annotations

import errno
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

FALLBACKS = ("skip", "cpu", "share")


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class Hardware:
    """What this process can see: CUDA device ids (as the outer CUDA_VISIBLE_DEVICES names them)."""

    cuda_ids: Tuple[str, ...]
    cuda_names: Tuple[str, ...] = ()
    cpu_count: int = 1

    @property
    def cuda_count(self) -> int:
        return len(self.cuda_ids)


def detect_hardware() -> Hardware:
    """Count GPUs without creating a CUDA context in this process (NVML first, as torch does)."""
    import torch

    cpus = usable_cpus()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() != "":
        ids = tuple(x.strip() for x in visible.split(",") if x.strip())[:count]
    else:
        ids = tuple(str(i) for i in range(count))
    names = tuple(torch.cuda.get_device_name(i) for i in range(count)) if count else ()
    return Hardware(ids, names, cpus)


@dataclass(frozen=True)
class DevicePlan:
    """How one test runs: on which devices, with which backend, or why it is skipped."""

    world_size: int
    device_type: str = "cpu"  # "cuda" | "cpu"
    backend: str = "gloo"  # "nccl" | "gloo"
    emulated: bool = False
    skip_reason: Optional[str] = None
    shared_gpus: int = 0  # --mgpu-fallback=share: the GPUs its world_size ranks take turns on (gloo)

    @property
    def gpus_to_lease(self) -> int:
        return self.shared_gpus or self.world_size

    def describe(self) -> str:
        if self.skip_reason:
            return f"skipped: {self.skip_reason}"
        if self.shared_gpus:
            return f"{self.world_size} x cuda sharing {self.shared_gpus} GPU(s) ({self.backend}, emulated)"
        if self.emulated:
            return f"{self.world_size} x cpu ({self.backend}, emulated)"
        return f"{self.world_size} x {self.device_type} ({self.backend})"


def plan_for(world_size: int, hw: Hardware, fallback: str, max_cpu_ranks: int = 8) -> DevicePlan:
    """The plan for a test that needs ``world_size`` GPUs on hardware ``hw``."""
    if world_size <= hw.cuda_count:
        return DevicePlan(world_size, "cuda", "nccl", emulated=False)
    found = f"found {hw.cuda_count} CUDA device(s)"
    if fallback == "share" and hw.cuda_count and world_size <= max_cpu_ranks:
        # NCCL refuses two ranks on one GPU; gloo carries CUDA tensors (staged through host memory)
        return DevicePlan(world_size, "cuda", "gloo", emulated=True, shared_gpus=hw.cuda_count)
    if fallback in ("cpu", "share"):  # share without a GPU: CPU ranks, as cpu
        if world_size > max_cpu_ranks:
            return DevicePlan(
                world_size,
                skip_reason=(
                    f"needs {world_size} GPUs, {found}, and emulating {world_size} CPU ranks exceeds "
                    f"--mgpu-max-cpu-ranks={max_cpu_ranks}"
                ),
            )
        return DevicePlan(world_size, "cpu", "gloo", emulated=True)
    return DevicePlan(
        world_size,
        skip_reason=(
            f"needs {world_size} GPU(s), {found}; run it on {world_size} gloo CPU ranks with "
            "--mgpu-fallback=cpu (or PYTEST_MGPU_FALLBACK=cpu)"
        ),
    )


def default_lock_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"pytest-mgpu-locks-{os.getuid()}")


@dataclass
class DeviceLease:
    """Devices held exclusively by this process until ``release()``."""

    ids: Tuple[str, ...]
    _fds: List[int] = field(default_factory=list, repr=False)
    waited_s: float = 0.0

    def release(self) -> None:
        import fcntl  # here, not at the top: see DeviceLeaser

        for fd in self._fds:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        self._fds.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class DeviceLeaser:
    """Hands out disjoint sets of devices across processes with one flock'ed file per device.

    Locks are tied to open file descriptors, so a worker that dies frees its devices at once.
    A request waits (polling) until enough devices are free rather than oversubscribing.

    ``fcntl`` is imported where a lock is taken, not at the top: the plugin loads in every pytest run
    (the ``pytest11`` entry point), and a platform without fcntl (Windows) must still run pytest;
    only GPU leases need it.
    """

    def __init__(self, ids: Sequence[str], lock_dir: Optional[str] = None, poll_s: float = 0.05):
        self.ids = tuple(ids)
        self.lock_dir = lock_dir or default_lock_dir()
        self.poll_s = poll_s
        os.makedirs(self.lock_dir, exist_ok=True)

    def _try(self, n: int) -> Optional[List[Tuple[str, int]]]:
        import fcntl

        held: List[Tuple[str, int]] = []
        for dev in self.ids:
            fd = os.open(os.path.join(self.lock_dir, f"cuda-{dev}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                continue
            held.append((dev, fd))
            if len(held) == n:
                return held
        for _, fd in held:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        return None

    def acquire(self, n: int, timeout_s: float = 600.0) -> DeviceLease:
        if n > len(self.ids):
            raise ValueError(f"asked for {n} devices, only {len(self.ids)} exist: {list(self.ids)}")
        t0 = time.monotonic()
        delay = self.poll_s
        while True:
            held = self._try(n)
            if held is not None:
                return DeviceLease(tuple(d for d, _ in held), [fd for _, fd in held], time.monotonic() - t0)
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(
                    f"waited {timeout_s:g}s for {n} free GPU(s) of {list(self.ids)}: other pytest "
                    f"processes hold them (locks in {self.lock_dir}); run fewer xdist workers (-n)"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)
