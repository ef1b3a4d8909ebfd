"""The table of causes, read from the evidence: localise the first phase that differs (the earliest
finding of the phase modules, by step, then by the order a step runs), then name the cause that
evidence points to (``table.py``). A cause is said as ``<what> (<evidence>). Fix: <fix>``; what no evidence
points to (a BatchNorm in the model, dropout) is said after it, as "possible"."""
from __future__ import annotations

import math
from typing import Final, List, Optional

from . import conduct, gradients, inputs, loss, loss_ops, outputs, state, update
from .conditions import later_step, loss_calls, micro_steps, passes_words, scaled, scaler_order
from .facts import UserFacts
from .finding import Finding, Report
from .located import located
from .possible import possible_causes
from .clip_causes import CLIPPING
from .schedule_causes import SCHEDULE
from .forward_causes import FORWARD
from .table import TABLE, Cause
from .update_causes import UPDATE

EVIDENCE: Final = 240  # characters of a finding's evidence said before its location (the line keeps both)


# Evidence that only passes a difference on (clipping of gradients that already differ): a lead only
# where nothing else was found.
PASSES_ON: Final = ("clip-passes-on",)
NO_CAUSE: Final = ("no known cause detected: look for rank-dependent code, non-deterministic kernels, or state kept "
                   "between steps; rerun with steps=1 to see if the first step already diverges.")


def cause_of(x: Finding, f: UserFacts) -> Optional[Cause]:
    return next((c for c in TABLE + CLIPPING + SCHEDULE + UPDATE + FORWARD if c.signal == x.signal and c.when(x, f)), None)


def said(x: Finding, f: UserFacts) -> str:
    """``<what> (<evidence>). Fix: <fix>. <why>``; the evidence alone where no cause reads it."""
    cause = cause_of(x, f)
    if cause is None:
        return x.evidence
    k = str(f.rank_backwards)
    fix = cause.fix.replace("loss / k", f"loss / {k}").replace("the k micro", f"the {k} micro")
    why = cause.why.replace("k means", f"{k} means")
    what = cause.what + (f" ({x.names[0]})" if x.signal in ("hyper", "grads-precision") and x.names else "")
    at, evidence = located(x, f), x.evidence
    if cause.when is loss_calls or cause.when is later_step:  # the first call that differs: its words and line
        words, line = loss_ops.difference(f, x.step) or ("", "")
        evidence, at = (f"{evidence}; {words}", f"at {line} (the loss)" if line else at) if words else (evidence, at)
    evidence = evidence if not at or len(evidence) <= EVIDENCE else evidence[:EVIDENCE - 3].rstrip() + "..."
    if cause.when is scaled:
        what = f"{what} ({scaler_order(f, x.step)})"
    elif cause.when is micro_steps:
        what = f"{what} ({passes_words(f, x.step)})"
    detail = "" if cause.when is micro_steps else x.detail  # the batch-size advice is not this cause's
    return " ".join(p for p in (f"{what} ({evidence}){' ' + at if at else ''}. Fix: {fix}.", why, detail) if p)


def localise(report: Report) -> List[Finding]:
    """Every finding of the phase modules, earliest first (by step, then phase)."""
    f = report.facts
    if not isinstance(f, UserFacts):
        return []
    first = report.first_divergence
    while first is not None and first < len(report.records) - 1 and loss.counted_otherwise(report, f, first):
        first += 1  # a loss counted otherwise beside the same gradients: training diverges later
    found = state.findings(report, f) + conduct.findings(report, f, first) + inputs.findings(f) + \
        loss_ops.sharpened(outputs.findings(report, f), f) + loss.findings(report, f) + gradients.findings(report, f) + \
        update.findings(report, f)
    if first is not None:
        found = [x for x in found if x.step <= first]
    found.sort(key=lambda x: (x.signal in PASSES_ON or cause_of(x, f) is None, x.order))
    return found


def likely_causes(report: Report) -> List[str]:
    """The lead cause from the first phase that differs, the other findings after it, then what is
    possible without evidence; ``[NO_CAUSE]`` where nothing is."""
    f = report.facts
    if not isinstance(f, UserFacts):
        return possible_causes(report) or [NO_CAUSE]
    found = localise(report)
    lines = list(dict.fromkeys(said(x, f) for x in found))
    maybe = [f"possible: {h}" for h in possible_causes(report) if h]
    return (lines + maybe or [NO_CAUSE]) + skipped(f)


def skipped(f: UserFacts) -> List[str]:
    """What the evidence could not read, said after the causes."""
    raw = [x for per_rank in f.rank_raw for x in per_rank]
    if raw and not any(math.isfinite(x) for x in raw):
        return ["skipped: the gradients as backward left them, before clipping (sharded: DTensor or FSDP1 flat "
                "parameters); the gradients the optimizer was given were read"]
    return []
