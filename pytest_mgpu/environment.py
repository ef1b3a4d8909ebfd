"""What this machine offers for distributed tests, and the hardware fingerprint baselines are keyed by."""
from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class Fingerprint:
    """The hardware and software that timings depend on; equal fingerprints may share a baseline."""

    device: str  # GPU model, or the CPU model when emulated
    device_count: int
    backend: str
    torch: str
    cuda: Optional[str]
    cpu: str
    cpu_count: int

    def key(self) -> str:
        """A readable, file-name-safe key: e.g. ``cpu-2x-gloo-torch2.14.1-a1b2c3d4``."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        digest = hashlib.sha1(blob).hexdigest()[:8]
        kind = "cpu" if self.backend == "gloo" and not self.cuda_device else self._slug(self.device)
        return f"{kind}-{self.device_count}x-{self.backend}-torch{self.torch.split('+')[0]}-{digest}"

    @property
    def cuda_device(self) -> bool:
        return self.device != self.cpu

    @staticmethod
    def _slug(text: str) -> str:
        return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:40]


def fingerprint(device_type: str = "cpu", device_count: Optional[int] = None) -> Fingerprint:
    import os

    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if device_type == "cuda" and torch.cuda.is_available():
        n = device_count if device_count is not None else torch.cuda.device_count()
        return Fingerprint(torch.cuda.get_device_name(0), n, "nccl", torch.__version__, torch.version.cuda,
                           cpu_model(), cpus)
    return Fingerprint(cpu_model(), cpus, "gloo", torch.__version__, None, cpu_model(), cpus)


@dataclass
class EnvironmentReport:
    torch: str
    cuda_build: Optional[str]
    cuda_available: bool
    devices: List[Tuple[int, str, str]]  # index, name, memory
    nccl: Optional[str]
    gloo: bool
    python: str
    cpu: str
    cpu_count: int
    fingerprints: Dict[str, str]

    def format(self) -> str:
        lines = [
            "pytest-mgpu environment",
            f"  python          {self.python}",
            f"  torch           {self.torch} (CUDA build: {self.cuda_build or 'no'})",
            f"  CUDA available  {self.cuda_available}",
            f"  CUDA devices    {len(self.devices)}",
        ]
        for idx, name, mem in self.devices:
            lines.append(f"    cuda:{idx}  {name}  {mem}")
        lines += [
            f"  NCCL            {self.nccl or 'not available'}",
            f"  gloo            {'available' if self.gloo else 'not available'}",
            f"  CPU             {self.cpu} ({self.cpu_count} usable cores)",
            "  baseline fingerprints:",
        ]
        for what, key in self.fingerprints.items():
            lines.append(f"    {what:<14}{key}")
        if not self.devices:
            lines.append("  gpuN tests skip here unless run with --mgpu-fallback=cpu (N gloo CPU ranks).")
        return "\n".join(lines)


def environment_report() -> EnvironmentReport:
    import os
    import sys

    import torch
    import torch.distributed as dist

    devices = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append((i, p.name, f"{p.total_memory / 2**30:.1f} GiB"))
    nccl = None
    if dist.is_available() and dist.is_nccl_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            nccl = "built in"
    fps = {"emulated cpu": fingerprint("cpu").key()}
    if devices:
        fps["cuda"] = fingerprint("cuda").key()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return EnvironmentReport(
        torch=torch.__version__,
        cuda_build=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
        devices=devices,
        nccl=nccl,
        gloo=dist.is_available() and dist.is_gloo_available(),
        python=sys.version.split()[0],
        cpu=cpu_model(),
        cpu_count=cpus,
        fingerprints=fps,
    )
