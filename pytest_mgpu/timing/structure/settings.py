"""The structure settings: whether calls are judged against their goldens, how far bytes may move,
and whether this run records goldens. Declared with the other options in ``pytest_mgpu.settings``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, cast

from ...settings import (SAVE_BASELINES, SAVE_STRUCTURE, STRUCTURE, STRUCTURE_MODES, STRUCTURE_TOLERANCE,
                         SettingsError, Sources, StructureMode, choice)


@dataclass(frozen=True)
class StructureSettings:
    mode: StructureMode = "auto"  # auto: judged where the goldens file exists; check: also list calls without one
    tolerance: float = 0.0  # fraction bytes sent and peak memory may move (0: exact)
    save: bool = False  # --mgpu-save-structure (or --mgpu-save-baselines): record goldens instead of judging


def resolve_structure(option: Callable[[str], object], ini: Callable[[str], object],
                      environ: Optional[Mapping[str, str]] = None) -> StructureSettings:
    """The structure settings; command line beats environment beats ini file beats default."""
    src = Sources(option, ini, environ)
    given = src.pick(STRUCTURE_TOLERANCE)
    tolerance = 0.0
    if given.value is not None:
        try:
            tolerance = float(str(given.value).strip().rstrip("%")) / 100.0
        except ValueError:
            raise SettingsError(f"{given.where} takes a percentage such as 0 or 5%, got {given.value!r}") from None
        if not (tolerance >= 0 and math.isfinite(tolerance)):
            raise SettingsError(f"{given.where} must be a finite percentage of 0 or more, got {given.value!r}")
    mode = choice(src.pick(STRUCTURE), STRUCTURE_MODES, "auto")
    save = bool(option(SAVE_BASELINES.dest) or option(SAVE_STRUCTURE.dest))
    return StructureSettings(mode=cast(StructureMode, mode), tolerance=tolerance, save=save)
