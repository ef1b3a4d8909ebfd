"""The hardware fingerprint timing baselines are keyed by.

A timing baseline only means something on the hardware and software it was recorded on, so
baseline files are named by a fingerprint: device model and count, backend, torch and CUDA
versions, and for emulated ranks the CPU (then the CPU is the device). A CPU model name alone is
too coarse: virtual machines report "Intel(R) Xeon(R) Processor" or "AMD EPYC" for several
generations, and the committed baseline keyed "AMD EPYC" matched a machine 1.3-2.2x faster (issue
13). So emulated fingerprints also carry the CPU's vendor/family/model/stepping and the ISA level
torch dispatches its CPU kernels for (``torch.backends.cpu.get_cpu_capability()``: AVX2, AVX512...).
Driver versions are left out on purpose: "did the driver upgrade make DDP slower?" is a question
the gate should answer, not dodge by starting a fresh baseline.
"""
from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Sequence

from ..devices import usable_cpus


def cpu_identity() -> Optional[str]:
    """``GenuineIntel 6/167/1`` (vendor family/model/stepping) from /proc/cpuinfo, None elsewhere."""
    fields: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                k, _, v = line.partition(":")
                fields[k.strip()] = v.strip()
    except OSError:
        return None
    if "cpu family" not in fields:
        return fields.get("CPU implementer") and "arm {CPU implementer}/{CPU part}/{CPU variant}".format_map(
            {k: fields.get(k, "?") for k in ("CPU implementer", "CPU part", "CPU variant")})
    return f"{fields.get('vendor_id', '?')} {fields['cpu family']}/{fields.get('model', '?')}/{fields.get('stepping', '?')}"


def cpu_isa() -> Optional[str]:
    """The ISA level torch picked for its CPU kernels here (e.g. AVX512), when torch says."""
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:
        return None


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
    cpu_id: Optional[str] = None  # emulated: vendor family/model/stepping (cpu_identity)
    isa: Optional[str] = None  # emulated: torch's CPU kernel level (cpu_isa)

    def key(self) -> str:
        """A readable, file-name-safe key, e.g. ``cpu-amd-epyc-7b13-2x-gloo-torch2.14.1-1a2b3c4d``."""
        fields = {k: v for k, v in asdict(self).items() if v is not None or k not in ("cpu_id", "isa")}
        digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]
        kind = ("cpu-" if self.emulated else "") + _slug(self.device)
        if self.emulated and self.isa:
            kind += "-" + _slug(self.isa, 12)
        return f"{kind}-{self.device_count}x-{self.backend}-torch{self.torch.split('+')[0]}-{digest}"

    def same_hardware(self, other: "Fingerprint") -> bool:
        """Same machine kind, possibly other software: a baseline to fall back on after an upgrade."""
        return (self.device, self.device_count, self.backend, self.emulated, self.cpu_id, self.isa) == (
            other.device, other.device_count, other.backend, other.emulated, other.cpu_id, other.isa)

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
        if self.cpu_id or self.isa:
            where += f" [{', '.join(v for v in (self.cpu_id, self.isa) if v)}]"
        soft = f"torch {self.torch}" + (f", CUDA {self.cuda}" if self.cuda else "")
        return f"{where} ({self.backend}{', emulated ranks' if self.emulated else ''}; {soft})"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Fingerprint":
        kw: Dict[str, Any] = {k: d.get(k) for k in cls.__dataclass_fields__}
        return cls(**kw)


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
    return Fingerprint(cpu_model(), usable_cpus(), "gloo", torch.__version__, None, True, cpu_identity(), cpu_isa())


