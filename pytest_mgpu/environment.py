"""What this machine offers for distributed tests, and the hardware fingerprint baselines are keyed by.

A timing baseline only means something on the hardware and software it was recorded on, so
baseline files are named by a fingerprint: device model and count, backend, torch and CUDA
versions, and the CPU model when the ranks are emulated on CPU (then the CPU is the device).
Driver versions are left out on purpose: "did the driver upgrade make DDP slower?" is a question
the gate should answer, not dodge by starting a fresh baseline.
"""
from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .devices import usable_cpus


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _slug(text: str, limit: int = 32) -> str:
    out = "".join(c if c.isalnum() else "-" for c in text.lower())
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")[:limit].strip("-")


@dataclass(frozen=True)
class Fingerprint:
    """The hardware and software that timings depend on; equal fingerprints share a baseline file."""

    device: str  # GPU model(s), or the CPU model when emulated
    device_count: int  # GPUs visible, or usable CPU cores when emulated
    backend: str  # nccl | gloo
    torch: str
    cuda: Optional[str]  # CUDA runtime of the torch build, for GPU runs
    emulated: bool

    def key(self) -> str:
        """A readable, file-name-safe key, e.g. ``cpu-amd-epyc-7b13-2x-gloo-torch2.14.1-1a2b3c4d``."""
        digest = hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:8]
        kind = ("cpu-" if self.emulated else "") + _slug(self.device)
        return f"{kind}-{self.device_count}x-{self.backend}-torch{self.torch.split('+')[0]}-{digest}"

    def same_hardware(self, other: "Fingerprint") -> bool:
        """Same machine kind, possibly other software: a baseline to fall back on after an upgrade."""
        return (self.device, self.device_count, self.backend, self.emulated) == (
            other.device, other.device_count, other.backend, other.emulated)

    def software_diff(self, other: "Fingerprint") -> str:
        """``torch 2.13.0 -> 2.14.1`` style note, empty when the software is the same."""
        parts = []
        if self.torch != other.torch:
            parts.append(f"torch {other.torch} -> {self.torch}")
        if self.cuda != other.cuda:
            parts.append(f"CUDA {other.cuda} -> {self.cuda}")
        return ", ".join(parts)

    def describe(self) -> str:
        where = f"{self.device_count} x {self.device}"
        soft = f"torch {self.torch}" + (f", CUDA {self.cuda}" if self.cuda else "")
        return f"{where} ({self.backend}{', emulated ranks' if self.emulated else ''}; {soft})"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Fingerprint":
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})


def fingerprint(device_type: str = "cpu", device_names: Optional[Sequence[str]] = None) -> Fingerprint:
    """The fingerprint of runs on ``device_type`` here. ``device_names`` (the visible GPUs, e.g. from
    ``devices.Hardware.cuda_names``) spares a CUDA context in the calling process."""
    import torch

    if device_type == "cuda":
        if device_names is None:
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            device_names = [torch.cuda.get_device_name(i) for i in range(n)]
        if device_names:
            models = " + ".join(sorted(set(device_names)))
            return Fingerprint(models, len(device_names), "nccl", torch.__version__, torch.version.cuda, False)
    return Fingerprint(cpu_model(), usable_cpus(), "gloo", torch.__version__, None, True)


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
    fingerprints: Dict[str, dict]  # "emulated cpu" / "cuda" -> fingerprint fields and key
    baselines: Dict[str, str]  # same keys -> the matching baseline file, or why there is none

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
            "  hardware fingerprints (baseline files are named by them):",
        ]
        for what, fp in self.fingerprints.items():
            lines.append(f"    {what:<14}{fp['key']}")
            lines.append(f"    {'':<14}{Fingerprint.from_dict(fp).describe()}")
            if what in self.baselines:
                lines.append(f"    {'':<14}baseline: {self.baselines[what]}")
        if not self.devices:
            lines.append("  gpuN tests skip here unless run with --mgpu-fallback=cpu (N gloo CPU ranks).")
        return "\n".join(lines)


def environment_report(baselines_dir: Optional[str] = None) -> EnvironmentReport:
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
    fps = {"emulated cpu": fingerprint("cpu")}
    if devices:
        fps["cuda"] = fingerprint("cuda", [name for _, name, _ in devices])
    found: Dict[str, str] = {}
    if baselines_dir is not None:
        from .timing.baselines import BaselineStore

        store = BaselineStore(baselines_dir)
        for what, fp in fps.items():
            found[what] = store.describe_match(fp)
    return EnvironmentReport(
        torch=torch.__version__,
        cuda_build=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
        devices=devices,
        nccl=nccl,
        gloo=dist.is_available() and dist.is_gloo_available(),
        python=sys.version.split()[0],
        cpu=cpu_model(),
        cpu_count=usable_cpus(),
        fingerprints={k: dict(fp.to_dict(), key=fp.key()) for k, fp in fps.items()},
        baselines=found,
    )
