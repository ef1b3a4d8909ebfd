"""What a plateau scheduler (``ReduceLROnPlateau``) was given and how it was built, on each side, where the
lr agreed before a step and differs at it: the metrics each side gave it, how often it was stepped, and
its settings (mode, factor, patience, threshold, cooldown) where those differ. The words name which
(``SETTINGS``, ``REPEATED``, ``OFTENER``): ``schedule_causes.py`` reads them to pick the cause."""
from __future__ import annotations

import math
from typing import Dict, List, Sequence, Tuple

from ..record.where import PLATEAU, TRAIN_NO_GRAD
from .facts import UserFacts

SAME_METRIC = 1e-6  # relative: one metric, computed alike (float32 rounding apart)
SETTINGS = "its settings differ"
REPEATED = "each metric given again"
OFTENER = "more often than the reference"
IN_TRAINING = "its metric was computed with modules in training mode"
OTHERWISE = "metrics apart"


def _differs(a: float, b: float) -> bool:
    return not math.isclose(a, b, rel_tol=SAME_METRIC)


def plateau_words(f: UserFacts, first: int) -> str:
    """Where the lr agreed before ``first`` and a scheduler was given a metric: what differs about it, as
    words to follow the lr's ("" where no metric was given)."""
    mine = [m for per_rank in f.rank_metrics[1:first + 1] for m in (per_rank[0] if per_rank else [])]
    ref = [m for ms in f.ref_metrics[1:first + 1] for m in ms]
    if first == 0 or not (mine or ref):
        return ""
    settings = _settings(f, first)
    if settings:
        return f"; {SETTINGS}: {settings}; its metrics before: {_shown(mine) or 'none'} on rank 0, " \
               f"{_shown(ref) or 'none'} in the reference"
    if len(mine) == len(ref) and not any(_differs(a, b) for a, b in zip(mine, ref)):
        return f"; scheduler.step(metric) got the same metrics on both sides before it ({_shown(mine)})"
    if len(mine) > len(ref) and ref:
        once = _once(mine)
        if len(once) == len(ref) and not any(_differs(a, b) for a, b in zip(once, ref)):
            return (f"; rank 0 stepped it {len(mine)} times by then, the reference {len(ref)}, {REPEATED} "
                    f"({_shown(mine)}): one call steps it {len(mine) // len(ref)} times")
        return (f"; rank 0 stepped it {len(mine)} times by then, {OFTENER} ({len(ref)}), with other metrics "
                f"({_shown(mine)} on rank 0, {_shown(ref)} in the reference): its metric is computed {OFTENER}")
    calls = f" ({len(mine)} calls on rank 0, {len(ref)} in the reference)" if len(mine) != len(ref) else ""
    given = f"its metrics before: {_shown(mine) or 'none'} on rank 0, {_shown(ref) or 'none'} in the reference{calls}"
    if len(mine) != len(ref):
        return "; " + given
    line = _trained_validation(f, first)
    if line:
        return f"; {IN_TRAINING} (under no_grad at {line}, the reference's in eval mode); {given}"
    return f"; {OTHERWISE}: {_shown(mine)} on rank 0, {_shown(ref)} in the reference"


def _trained_validation(f: UserFacts, first: int) -> str:
    """The line of rank 0's forward under no_grad with modules in training mode before ``first`` where the
    reference ran none so ("" where none)."""
    mine = [line for w in f.rank_where[:first + 1] if w for line in w[0].get(TRAIN_NO_GRAD, ())]
    theirs = [line for w in f.ref_where[:first + 1] for line in w.get(TRAIN_NO_GRAD, ())]
    return mine[0].split(" ")[0] if mine and not theirs else ""


def _once(values: Sequence[float]) -> List[float]:
    """The values with each run of equal ones kept once."""
    return [v for i, v in enumerate(values) if i == 0 or _differs(v, values[i - 1])]


def _settings(f: UserFacts, first: int) -> str:
    """The settings that differ between rank 0's plateau scheduler and the reference's ("" where alike or
    unknown), as ``mode='max' on rank 0, 'min' in the reference``."""
    mine = next((w[0].get(PLATEAU) for w in f.rank_where[:first + 1] if w and w[0].get(PLATEAU)), None)
    ref = next((w.get(PLATEAU) for w in f.ref_where[:first + 1] if w.get(PLATEAU)), None)
    if not mine or not ref:
        return ""
    a, b = _parsed(mine[0]), _parsed(ref[0])
    apart = [(k, a[k], b[k]) for k in a if k in b and a[k] != b[k]]
    return "; ".join(f"{k}={x} on rank 0, {y} in the reference" for k, x, y in apart)


def _parsed(said: str) -> Dict[str, str]:
    return dict(_pair(part) for part in said.split(", ") if "=" in part)


def _pair(part: str) -> Tuple[str, str]:
    k, _, v = part.partition("=")
    return k, v


def _shown(values: List[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in values[-2:])
