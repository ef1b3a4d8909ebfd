"""The process-wide state a fresh rank starts with, taken once in a warm rank and put back around
every call, so that no call sees what an earlier one left behind: environment, working directory,
default dtype and device, grad mode, deterministic algorithms, matmul precision, anomaly mode and the
backend flags.

Runs in ranks. Checking is the common case (a call changes none of it), so it is cheap: the
environment is compared as the raw dict ``os.environ`` keeps (one C-level dict comparison, 0.4 us,
where comparing the mapping decodes every variable, ~45 us), and only what differs is set back (a
setter may not be free: a cudnn flag loads cudnn, ~1 s; clearing and refilling the environment
costs ~0.1 ms in system calls).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ..compat import default_device

if TYPE_CHECKING:
    import torch

_FLAGS = (
    ("cudnn", "enabled"),
    ("cudnn", "benchmark"),
    ("cudnn", "deterministic"),
    ("cudnn", "allow_tf32"),
    ("cuda.matmul", "allow_tf32"),
    ("cuda.matmul", "allow_fp16_reduced_precision_reduction"),
    ("cuda.matmul", "allow_bf16_reduced_precision_reduction"),
    ("mkldnn", "enabled"),
)


def _raw_environ() -> Optional[dict]:
    """The dict behind ``os.environ`` (encoded keys and values), or None where it has none."""
    data = getattr(os.environ, "_data", None)
    return data if isinstance(data, dict) else None


def restore_environ(env: Dict[str, str]) -> None:
    """Make ``os.environ`` equal ``env``, setting and unsetting only the variables that differ."""
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


@dataclass
class Fresh:
    """The state to put back (``take`` it once, ``restore`` it before and after every call)."""

    env: Dict[str, str]
    cwd: str
    dtype: torch.dtype  # torch.set_default_dtype, and the dtype part of torch.set_default_tensor_type
    device: object  # torch.set_default_device, and the device part of torch.set_default_tensor_type
    grad: bool
    deterministic: Tuple[bool, bool]
    matmul_precision: str
    anomaly: bool
    flags: List[Tuple[object, str, object]] = field(default_factory=list)  # (backend module, name, value)
    raw_env: Optional[dict] = None  # a copy of ``_raw_environ()`` when taken

    @classmethod
    def take(cls) -> "Fresh":
        import torch

        flags = []
        for mod, name in _FLAGS:
            try:
                backend = _backend(mod)
                flags.append((backend, name, getattr(backend, name)))
            except (AttributeError, RuntimeError):
                pass
        raw = _raw_environ()
        return cls(
            env=dict(os.environ),
            cwd=os.getcwd(),
            dtype=torch.get_default_dtype(),
            device=default_device(),
            grad=torch.is_grad_enabled(),
            deterministic=(
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            matmul_precision=torch.get_float32_matmul_precision(),
            anomaly=torch.is_anomaly_enabled(),
            flags=flags,
            raw_env=None if raw is None else dict(raw),
        )

    def restore(self) -> None:
        """Put back what differs from the state taken; ~15 us when nothing does."""
        import torch

        raw = _raw_environ()
        if raw is None or self.raw_env is None or raw != self.raw_env:
            restore_environ(self.env)
        if os.getcwd() != self.cwd:
            os.chdir(self.cwd)
        if default_device() != self.device:  # compat: torch <= 2.9 raised after set_default_device(None)
            torch.set_default_device(None)  # a fresh rank has no default-device mode
        if torch.get_default_dtype() != self.dtype or torch.empty(0).dtype != self.dtype:
            torch.set_default_dtype(self.dtype)
        if torch.is_grad_enabled() != self.grad:
            torch.set_grad_enabled(self.grad)
        deterministic = (torch.are_deterministic_algorithms_enabled(),
                         torch.is_deterministic_algorithms_warn_only_enabled())
        if deterministic != self.deterministic:
            torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        if torch.get_float32_matmul_precision() != self.matmul_precision:
            torch.set_float32_matmul_precision(self.matmul_precision)
        if torch.is_anomaly_enabled() != self.anomaly:
            torch.autograd.set_detect_anomaly(self.anomaly)
        for backend, name, value in self.flags:
            try:
                if getattr(backend, name) != value:
                    setattr(backend, name, value)
            except (AttributeError, RuntimeError):
                pass


def _backend(mod: str):
    import torch

    obj = torch.backends
    for part in mod.split("."):
        obj = getattr(obj, part)
    return obj
