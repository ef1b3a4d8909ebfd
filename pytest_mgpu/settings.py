"""The plugin's settings, resolved once from command line, ini file and environment."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

from .devices import FALLBACKS

ENV_FALLBACK = "PYTEST_MGPU_FALLBACK"
DEFAULT_TIMEOUT_S = 300.0


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Settings:
    fallback: str = "skip"
    timeout_s: float = DEFAULT_TIMEOUT_S
    seed: int = 0
    max_cpu_ranks: int = 8
    isolate: bool = False  # fresh rank processes for every call instead of warm ones


def resolve(option: Callable[[str], object], ini: Callable[[str], object]) -> Settings:
    """Command line beats environment beats ini file beats default."""

    def pick(opt: str, ini_name: str, env: Optional[str] = None):
        v = option(opt)
        if v is None and env:
            v = os.environ.get(env) or None
        if v is None:
            v = ini(ini_name) or None
        return v

    fallback = str(pick("mgpu_fallback", "mgpu_fallback", ENV_FALLBACK) or "skip").strip().lower()
    if fallback not in FALLBACKS:
        raise SettingsError(
            f"--mgpu-fallback (or {ENV_FALLBACK} / ini mgpu_fallback) must be one of "
            f"{', '.join(FALLBACKS)}, got {fallback!r}"
        )
    raw_timeout = pick("mgpu_timeout", "mgpu_timeout")
    try:
        timeout = float(raw_timeout) if raw_timeout is not None else DEFAULT_TIMEOUT_S
    except ValueError:
        raise SettingsError(f"--mgpu-timeout must be a number of seconds, got {raw_timeout!r}") from None
    if timeout <= 0:
        raise SettingsError(f"--mgpu-timeout must be positive, got {timeout:g}")
    raw_seed = pick("mgpu_seed", "mgpu_seed")
    raw_max = pick("mgpu_max_cpu_ranks", "mgpu_max_cpu_ranks")
    try:
        seed = int(raw_seed) if raw_seed is not None else 0
        max_cpu = int(raw_max) if raw_max is not None else 8
    except ValueError as exc:
        raise SettingsError(f"--mgpu-seed and --mgpu-max-cpu-ranks take integers: {exc}") from None
    isolate = str(pick("mgpu_isolate", "mgpu_isolate", "PYTEST_MGPU_ISOLATE") or "").strip().lower()
    return Settings(fallback=fallback, timeout_s=timeout, seed=seed, max_cpu_ranks=max_cpu,
                    isolate=isolate in ("1", "true", "yes", "on"))
