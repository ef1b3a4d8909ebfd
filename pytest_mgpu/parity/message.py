"""Turning a parity run into words: the per-step summary, the divergence table, and the likely
causes (``evidence.causes``: the first phase that differs, then the cause it points to)."""
from __future__ import annotations

import math
import re
from typing import List

from tabulate import tabulate

from ..brief import HEAD_BUDGET, cited, fit, sentence
from .evidence.causes import NO_CAUSE, likely_causes
from .evidence.facts import UserFacts
from .evidence.finding import Report
from .judge.options import shown
from .records import KINDS

WORST_ROWS = 10
# A cause's location, as evidence.located says it, at the end of its what: " at f.py:84 (scheduler.step)"
AT = re.compile(r" at [^ ()]+:\d+(?:, [^ ()]*:\d+)? \([^)]*\)(?: to [^ ()]*:\d+(?:, [^ ()]*:\d+)? \([^)]*\))?$")
FIX_LEAST = 40  # fewer characters of the fix than this: the line points to the list of causes instead
FIX_BELOW = "see below"
OPTIONS_NOTE = ("the optimizer's options (lr at every step, weight decay, momentum, betas, eps) are judged exactly, "
                "beyond float rounding; where they differ on purpose, pass optimizer_options='ignore', or the names "
                "to leave out, e.g. optimizer_options=['lr']")


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


def headline(report: Report) -> str:
    """The first line: what diverged (the function and its devices, with the world size), at which step,
    and how (the tensors over the line, or the optimizer option that differs)."""
    failures = report.failures()
    first = report.first_divergence
    options = report.option_differences
    n_all = len(report.records[first].errors) if first < len(report.records) else 0
    said = []
    if failures:
        at = failures[0][0]
        n_bad = len({(e.kind, e.name) for s, e, _ in failures if s == at})
        said.append(f"{n_bad} of {n_all} tensors exceed the tolerance" + (f" from step {at}" if at != first else ""))
    if options and not failures:
        said.append(options[0].words(brief=True) + (f" (and {len(options) - 1} more option(s))" if len(options) > 1 else ""))
        said.append(f"every tensor is within the line (at most {report.worst_ratio:.2g} of it)")
    elif options and options[0].step < failures[0][0]:
        said.append(f"the optimizer's {shown(options[0].option)} differs from step {options[0].step}")
    # the user's loops: "2 x cpu", the backend in a note (their cause line needs the room)
    where = report.where.split(" (", 1)[0] if isinstance(report.facts, UserFacts) else report.where
    strategy = report.facts.strategy.replace(" (your training loop)", "")  # the function's name: room for the cause
    return (f"{strategy} on {where} diverges from one device at step {first} (of {len(report.records)}): "
            + "; ".join(said))


def failure_message(report: Report) -> str:
    causes = likely_causes(report)
    options = report.option_differences
    head = headline(report)
    room = min(400, HEAD_BUDGET - len(head) - 1 - len("likely cause: ") - 1)
    lines = fit([
        head,
        f"likely cause: {lead(report, causes[0], room)}" if causes[0] is not NO_CAUSE else "likely cause: none known (below)",
    ]) + [
        f"tolerance: {report.tolerance.describe()}",
        *([f"note: ran on {report.where}"] if " (" in report.where and isinstance(report.facts, UserFacts) else []),
        *[f"note: {d.words()}" for d in options],
        *([f"note: {OPTIONS_NOTE}"] if options else []),
        *([f"note: {report.keywords}"] if report.keywords else []),
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


def lead(report: Report, cause: str, room: int = 400) -> str:
    """The first cause as its line, within ``room`` characters: ``<what> (<evidence>) at <file:line>
    (<call>). Fix: <the fix's first sentence>``. Too long, the fix is cut first, then said to be below,
    then the location is said shorter (``at f.py:85-87``), then without the fix (the list below has it);
    the evidence is never cut for the location (where none fits, the line is said without it, cut at its
    end)."""
    if not isinstance(report.facts, UserFacts):
        return cited(cause)
    if ". Fix: " not in cause:
        return cause if len(cause) <= room else cause[:room - 3] + "..."
    what, fix = cause.split(". Fix: ", 1)
    fix = sentence(fix)
    at = AT.search(what)
    body = what[:at.start()] if at else what
    for where in ([at.group(0), compact(at.group(0))] if at else []):  # the evidence whole, then the location
        line = f"{body}{where}. Fix: {fix}"
        space = room - len(body) - len(where) - len(". Fix: ")
        if len(line) <= room:
            return line
        if space >= FIX_LEAST:  # the fix as far as it goes
            return f"{body}{where}. Fix: {fix[:space - 3].rstrip()}..."
        if space >= len(FIX_BELOW):  # no room for the fix's words: they are in the list below
            return f"{body}{where}. Fix: {FIX_BELOW}"
    if at and len(f"{body}{compact(at.group(0))}.") <= room:  # the place before the fix: the fix is in the list
        return f"{body}{compact(at.group(0))}."
    line = f"{body}. Fix: {fix}"  # no room for the location without cutting the evidence: as before it
    return line if len(line) <= room else line[:room - 3] + "..."


def compact(where: str) -> str:
    """A location in fewer characters: " at f.py:85 (backward) to :87 (optimizer.step)" -> " at f.py:85-87"."""
    plain = re.sub(r", [^ ()]*:\d+", "", re.sub(r" \([^)]*\)", "", where))  # the first of several, no calls
    return plain.replace(" to :", "-")
