"""What this machine offers for distributed tests (``python -m pytest_mgpu``), with the hardware
fingerprints that baseline files are named by (``timing.fingerprint``) and whether one matches."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .devices import usable_cpus
from .project_ini import find_ini
from .settings import FALLBACK, Sources, resolve, resolve_timing
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
    ini: str = ""  # the project's pytest configuration file that was read, or why none
    fallback: str = "skip"  # what gpuN tests do without N GPUs, as pytest here would resolve it
    fallback_source: str = "default"  # where that came from: "ini mgpu_fallback", PYTEST_MGPU_FALLBACK
    max_cpu_ranks: int = 8
    baselines_dir: str = ""

    def format(self) -> str:
        lines = [
            "pytest-mgpu environment",
            f"  project ini     {self.ini}",
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
        lines.append(f"  baselines       {self.baselines_dir}")
        lines.append(self._fallback_line())
        return "\n".join(lines)

    def _fallback_line(self) -> str:
        """What gpuN tests do here, following the fallback the project's ini (or environment) sets."""
        n = len(self.devices)
        tests = "gpuN tests" if not n else f"gpuN tests with N > {n}"
        where = "" if self.fallback_source == "default" else f" ({self.fallback_source} = {self.fallback})"
        if self.fallback == "skip":
            return (f"  {tests} skip here{where} unless run with --mgpu-fallback=cpu (N gloo CPU ranks)"
                    + (f" or --mgpu-fallback=share (N gloo ranks taking turns on the {n} GPU(s))." if n else "."))
        if self.fallback == "share" and n:
            return (f"  {tests} run here on N gloo ranks taking turns on the {n} GPU(s){where}, "
                    f"up to N = {self.max_cpu_ranks} (--mgpu-max-cpu-ranks); larger ones skip.")
        return (f"  {tests} run here on N gloo CPU ranks{where}, up to N = {self.max_cpu_ranks} "
                "(--mgpu-max-cpu-ranks); larger ones skip.")


def environment_report(baselines_dir: Optional[str] = None, start: Optional[Path] = None) -> EnvironmentReport:
    """This machine, read with the settings pytest would use when started in ``start`` (default: the
    current folder): the project's ini (found as pytest finds it) and the environment. ``baselines_dir``
    (the command line) beats the ini's ``mgpu_baselines``."""
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
    fps = {"emulated cpu": fingerprint("cpu")}
    if devices:
        fps["cuda"] = fingerprint("cuda", [name for _, name, _ in devices])
    ini = find_ini(start)
    read = ini.get if ini is not None else (lambda name: None)
    settings = resolve(lambda dest: None, read, os.environ)
    here = Path.cwd() if start is None else Path(start)
    timing = resolve_timing(lambda dest: baselines_dir if dest == "mgpu_baselines" else None, read,
                            ini.rootdir if ini is not None else here, here)
    from .timing.baselines import BaselineStore

    store = BaselineStore(str(timing.baselines_dir))
    found = {what: store.describe_match(fp) for what, fp in fps.items()}
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
        ini=ini.describe() if ini is not None else f"none found from {here} up: the defaults",
        fallback=settings.fallback,
        fallback_source=Sources(lambda dest: None, read, os.environ).pick(FALLBACK).where,
        max_cpu_ranks=settings.max_cpu_ranks,
        baselines_dir=str(timing.baselines_dir),
    )
