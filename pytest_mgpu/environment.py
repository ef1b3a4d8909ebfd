"""What this machine offers for distributed tests (``python -m pytest_mgpu``), with the hardware
fingerprints that baseline files are named by (``timing.fingerprint``) and whether one matches."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .devices import usable_cpus
from .timing.fingerprint import Fingerprint, cpu_model, fingerprint


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
        else:
            n = len(self.devices)
            lines.append(f"  gpuN tests with N > {n} skip here unless run with --mgpu-fallback=cpu (N gloo CPU ranks) "
                         f"or --mgpu-fallback=share (N gloo ranks taking turns on the {n} GPU(s)).")
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
