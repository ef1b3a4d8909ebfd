"""Turning a parity run into words: the per-step summary, the divergence table, and the likely
causes (``evidence.causes``: the first phase that differs, then the cause it points to)."""
from __future__ import annotations

import math
from typing import List

from tabulate import tabulate

from ..brief import cited, fit, sentence
from .evidence.causes import NO_CAUSE, likely_causes
from .evidence.facts import UserFacts
from .evidence.finding import Report
from .records import KINDS

WORST_ROWS = 10


def _names(names: List[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _e(x: float) -> str:
    if x == 0:
        return "0"
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.2e}"


def summary_table(report: Report) -> str:
    """One row per step: the worst norm-wise relative error of each kind, the float64 floor, the
    line, and how far along it the step's worst tensor is (what is judged)."""
    kinds = [k for k in KINDS if any(e.kind == k for r in report.records for e in r.errors)]
    measured = report.tolerance.rule == "measured"
    rows = []
    bad_steps = {s for s, _, _ in report.failures()}
    for rec, line in zip(report.records, report.lines()):
        row = [rec.step]
        for k in kinds:
            errs = [e for e in rec.errors if e.kind == k]
            row.append(_e(max(e.rel for e in errs)) if errs else "-")
        if measured:
            row.append(_e(line.floor) if line.floor is not None else "-")
        worst = f"{line.ratio:.3g}" if math.isfinite(line.ratio) else "inf"
        if line.worst is not None and line.ratio > 0:
            worst += f" ({line.worst.kind} {line.worst.name})"
        row += [_e(line.line), worst, "DIVERGED" if rec.step in bad_steps else "ok"]
        rows.append(row)
    headers = ["step"] + [f"{k} rel err" for k in kinds] + (["floor"] if measured else [])
    headers += ["line", "worst / line", ""]
    return tabulate(rows, headers=headers, tablefmt="simple")


def divergence_table(report: Report) -> str:
    """The first diverging step's worst tensors, worst first (by error / tolerance)."""
    failures = report.failures()
    if not failures:
        return ""
    first = failures[0][0]
    rows = [(e, bound) for s, e, bound in failures if s == first]
    rows.sort(key=lambda r: report.tolerance.ratio(r[0], first), reverse=True)
    table = []
    for e, bound in rows[:WORST_ROWS]:
        name = e.name + (f" (the strategy's has {e.missing})" if e.missing.startswith("shape")
                         else f" (missing in {e.missing})" if e.missing else "")
        tol = bound / e.norm_ref if e.norm_ref > 0 else bound
        table.append([first, e.kind, name, "x".join(map(str, e.shape)) or "scalar", _e(e.max_abs),
                      _e(e.max_rel), _e(e.rel), _e(tol), f"{report.tolerance.ratio(e, first):.3g}"])
    more = f"\n... and {len(rows) - WORST_ROWS} more tensor(s) over tolerance at step {first}" \
        if len(rows) > WORST_ROWS else ""
    return tabulate(table, headers=["step", "kind", "name", "shape", "max abs err", "max rel err",
                                    "norm rel err", "tolerance", "err / line"], tablefmt="simple") + more


def failure_message(report: Report) -> str:
    failures = report.failures()
    first = failures[0][0]
    n_bad = len({(e.kind, e.name) for s, e, _ in failures if s == first})
    n_all = len(report.records[first].errors) if first < len(report.records) else 0
    causes = likely_causes(report)
    lines = fit([
        f"{report.describe()} diverges from one device at step {first} (of {len(report.records)}): "
        f"{n_bad} of {n_all} tensors exceed the tolerance",
        f"likely cause: {lead(report, causes[0])}" if causes[0] is not NO_CAUSE else "likely cause: none known (below)",
    ]) + [
        f"tolerance: {report.tolerance.describe()}",
        *[f"note: {n}" for n in report.notes],
        "",
        divergence_table(report),
        "",
        "max rel err = max |strategy - reference| / max |reference|; norm rel err = ||strategy - "
        "reference|| / ||reference||, judged against the tolerance",
        "",
        "per step: the worst norm rel err of each kind; the floor and line of the worst tensor's kind; "
        "worst / line (> 1 fails):",
        summary_table(report),
        "",
        "likely causes:",
    ]
    lines += [f"  - {h}" for h in causes]
    return "\n".join(lines)


def lead(report: Report, cause: str) -> str:
    """The first cause as its line: ``<what> (<evidence>). Fix: <the fix's first sentence>``."""
    if not isinstance(report.facts, UserFacts):
        return cited(cause)
    if ". Fix: " not in cause:
        return cause if len(cause) <= 300 else cause[:297] + "..."
    what, fix = cause.split(". Fix: ", 1)
    line = f"{what}. Fix: {sentence(fix)}"
    return line if len(line) <= 400 else line[:397] + "..."
