"""The plugin's settings, resolved once from command line, ini file and environment."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Optional

from .devices import FALLBACKS

ENV_FALLBACK = "PYTEST_MGPU_FALLBACK"
DEFAULT_TIMEOUT_S = 300.0


class SettingsError(ValueError):
    pass


def validate_timeout(value: object, where: str, *, text_ok: bool) -> float:
    """A limit in seconds: a positive, finite number, or a SettingsError naming ``where`` it came from
    (as pytest-timeout's ``_validate_timeout(timeout, where)`` does). ``text_ok``: the value comes from
    a command line or an ini file, so "5" is read as 5; from Python code, a string is refused."""
    if isinstance(value, bool) or (isinstance(value, str) and not text_ok):
        raise SettingsError(f"{where} must be a positive, finite number of seconds, got "
                            f"{type(value).__name__} {value!r}")
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SettingsError(f"{where} must be a positive, finite number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise SettingsError(f"{where} must be a positive, finite number of seconds, got {value!r}")
    return seconds


@dataclass(frozen=True)
class Settings:
    fallback: str = "skip"
    timeout_s: float = DEFAULT_TIMEOUT_S
    timeout_source: str = f"the default --mgpu-timeout of {DEFAULT_TIMEOUT_S:g}s"  # named when it fires
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
    timeout, timeout_source = _timeout(option("mgpu_timeout"), ini("mgpu_timeout") or None)
    raw_seed = pick("mgpu_seed", "mgpu_seed")
    raw_max = pick("mgpu_max_cpu_ranks", "mgpu_max_cpu_ranks")
    try:
        seed = int(raw_seed) if raw_seed is not None else 0
        max_cpu = int(raw_max) if raw_max is not None else 8
    except ValueError as exc:
        raise SettingsError(f"--mgpu-seed and --mgpu-max-cpu-ranks take integers: {exc}") from None
    isolate = str(pick("mgpu_isolate", "mgpu_isolate", "PYTEST_MGPU_ISOLATE") or "").strip().lower()
    return Settings(fallback=fallback, timeout_s=timeout, timeout_source=timeout_source, seed=seed, max_cpu_ranks=max_cpu,
                    isolate=isolate in ("1", "true", "yes", "on"))


def _timeout(cli: object, ini_value: object):
    if cli is not None:
        seconds = validate_timeout(cli, "--mgpu-timeout", text_ok=True)
        return seconds, f"--mgpu-timeout={seconds:g}"
    if ini_value is not None:
        seconds = validate_timeout(ini_value, "ini mgpu_timeout", text_ok=True)
        return seconds, f"ini mgpu_timeout={seconds:g}"
    return DEFAULT_TIMEOUT_S, f"the default --mgpu-timeout of {DEFAULT_TIMEOUT_S:g}s"
