"""What the gate says about one judged measurement: the report's short cells and the failure text.

Rendering only; the decision is ``rule``'s. Works on the plain dicts that travel between xdist
workers, the controller and report files (``TimingState.judge``)."""
from __future__ import annotations

import math
from typing import Dict, Final, Mapping, Optional, Tuple

from .units import fmt_time
from .pairing import RevisionStatus, RevisionVerdict
from .reference import UNNORMALIZED_HASH
from .rule import MIN_HISTORY, HistoryVerdict, Status, detectable_change, percent, saves, visible_with


def verdict_of(d: dict) -> Optional[HistoryVerdict]:
    v = d.get("verdict")
    return HistoryVerdict.from_dict(v) if v else None


def delta_cell(d: dict) -> str:
    """The report's "vs history" cell: ``+23.1% (n=20)``; the ratio is reference-normalized on CPU ranks,
    the step's own on a GPU."""
    v = verdict_of(d)
    if v is None or v.ratio is None:
        return "-"
    return f"{(v.ratio - 1) * 100:+.1f}% (n={v.n_history})"


# The words of a status where its identifier is not what a reader should see.
LABELS: Final[Mapping[Status, str]] = {Status.UNCONFIRMED: "same (re-measured)",
                                       Status.UNREADABLE: "baseline unreadable"}


def _with_outcome(text: str, outcome: str, width: Optional[int]) -> str:
    """The verdict, and the test's outcome where it was not "passed" (pytest's summary also says it);
    the outcome is left out rather than the verdict cut where ``width`` is too narrow for both."""
    if outcome in ("passed", "") or text.startswith("SLOWER"):
        return text
    both = f"{text} (test {outcome})"
    return both if width is None or len(both) <= width else text


def status_cell(d: dict, outcome: str = "", width: Optional[int] = None) -> str:
    v = verdict_of(d)
    if v is None:
        return "-"
    text = LABELS.get(v.status, v.status.value)
    if v.status == Status.SLOWER:
        text = "SLOWER (failed)" if d.get("gate_mode") == "fail" else "slower (warned)"
    elif v.status == Status.LEARNING:
        text = f"learning {v.n_history}/{MIN_HISTORY}"
    elif v.status == Status.NEW and d.get("x") is not None:
        text = f"new 0/{MIN_HISTORY}"
    return _with_outcome(text, outcome, width)


def describe(d: dict) -> str:
    """One paragraph: what was compared (history median of medians and spread, the new figure,
    ratio, confidence), where the baseline is, and what to do."""
    v = verdict_of(d)
    new = fmt_time(d.get("median_s"))
    source = d.get("baseline_source") or "-"
    if v is None or v.status == Status.NEW:
        return f"no recorded launch (median {new}): recorded; save it with --mgpu-save-timing"
    if v.status == Status.UNSTABLE:
        return f"unstable measurement ({d.get('unstable')}), even after re-measuring: not judged, not saved"
    if v.status == Status.UNREADABLE:
        return f"baseline unreadable: measured (median {new}) as if no baseline existed"
    hist = fmt_time(d.get("history_median_s"))
    one = v.n_history < 2  # one launch has no spread between launches (its stored figure is the floor)
    spread = f"{(math.exp(v.spread) - 1) * 100:.1f}%" if v.spread is not None and not one else "-"
    ratio = f"x{v.ratio:.3f} ({(v.ratio - 1) * 100:+.1f}%)" if v.ratio is not None else "-"
    raw = d.get("reference_hash") == UNNORMALIZED_HASH  # a GPU: the step's own median is judged
    stat, kind = ("ln(step median)", "ratio") if raw else ("ln(step/reference)", "reference-normalized ratio")
    text = (f"median {new} vs history median of medians {hist} over {v.n_history} launch(es) "
            f"(spread {spread} sd of {stat}); {kind} {ratio}, threshold +{v.threshold * 100:.0f}%")
    if v.status == Status.NOISY:
        kept = "saved to the history by --mgpu-save-timing" if saves(v, d.get("runner_load") or "") else \
            "not saved to the history"
        return f"{noisy_line(d)}. Compared: {text}; baseline: {source}; {kept}"
    if v.status == Status.LEARNING:
        return (text + f"; {v.n_history} of {MIN_HISTORY} launches recorded: the gate decides from "
                f"{MIN_HISTORY} ({_learning_sees(v)}; baseline {source}). Record more with "
                "--mgpu-save-timing")
    text += f", confidence {percent(v.confidence)} (one-sided t prediction interval, alpha {v.alpha:g})"
    if v.x_again is not None and v.ratio is not None:
        again = math.exp(v.x_again - v.center) if v.center is not None else None
        text += f"; re-measured: {(again - 1) * 100:+.1f}%" if again is not None else ""
    text += f"; baseline: {source}"
    if d.get("mann_whitney_p") is not None:
        text += f"; Mann-Whitney vs the latest launch p={d['mann_whitney_p']:.2g} (information only)"
    recording = d.get("saving") and (v.status == Status.FASTER or d.get("gate_mode") == "warn")
    if v.status in (Status.SLOWER, Status.FASTER) and recording:
        text += ". This run records it as the new speed (--mgpu-save-timing): its history starts again from it"
    elif v.status == Status.SLOWER:
        text += (". If the slowdown is expected, record it as the new speed: --mgpu-save-timing "
                 "--mgpu-gate=warn (its history starts again from this launch); to only warn, use --mgpu-gate=warn")
    elif v.status == Status.FASTER:
        text += (". Faster than its history: if that is the new speed, record it with --mgpu-save-timing (its "
                 "history starts again from this launch)")
    return text


def _learning_sees(v: HistoryVerdict) -> str:
    """What a history still learning can see, at its own spread (the one quoted before it)."""
    if v.n_history < 2 or v.spread is None:
        return visible_with(v.n_history, v.threshold)
    seen = detectable_change(v.spread, v.n_history, v.threshold, v.alpha)
    return f"at this spread {v.n_history} launches see only slowdowns above +{seen * 100:.0f}%"


def noisy_line(d: dict) -> str:
    """Why a NOISY launch was not judged: the history's spread, the smallest slowdown it can see,
    what explains the noise when the runner's load does, and what to use instead."""
    v = verdict_of(d)
    assert v is not None and v.spread is not None and v.detectable is not None  # judged from a history
    text = (f"history spread {math.expm1(v.spread) * 100:.0f}%: only slowdowns above +{v.detectable * 100:.0f}% "
            f"can be seen here (threshold +{v.threshold * 100:.0f}%, {v.n_history} launches)")
    if d.get("runner_load"):
        text += f"; {d['runner_load']}"
    elif v.needed is not None:  # a short history, not a noisy runner: it grows into a gate
        return text + (f"; at this spread {v.needed} launches see +{v.threshold * 100:.0f}%: record more with "
                       "--mgpu-save-timing (this one included), or gate now with --mgpu-against")
    elif d.get("runner_load") == "":  # read, and the runner was quiet: the history itself may mix two speeds
        text += ("; the runner was not loaded: if the step's speed changed on purpose, its history mixes the two "
                 "speeds: delete its entry from the baseline file and record again")
    return text + "; for a gate on this runner use --mgpu-against"


def _history_stalls(d: dict) -> bool:
    """An unstable launch of a history still short that is being recorded (or was begun): it is not
    saved, so the history stays short. A project that records nothing is not told about histories."""
    n = d["verdict"].get("n_history") or 0
    return n < MIN_HISTORY and (n > 0 or bool(d.get("saving")))


def learning_line(d: dict) -> str:
    """Why a LEARNING launch beyond the threshold is not warned: how far it is from the few launches
    recorded, and that they cannot tell such a change from the runner's noise."""
    v = verdict_of(d)
    assert v is not None and v.ratio is not None  # judged against a history of at least one launch
    return (f"learning ({v.n_history} of {MIN_HISTORY} launches): {(v.ratio - 1) * 100:+.1f}% against them, not "
            f"judged and not warned: {visible_with(v.n_history, v.threshold)}. Record more with --mgpu-save-timing, "
            "or gate now with --mgpu-against")


def noisy_lines(measurements) -> list:
    """Under the terminal table: one line per measurement its history could not judge (NOISY), per
    learning one beyond the threshold (too few launches to tell a change from noise: no warning), and
    per unstable one whose history is still short: an unstable launch is never saved, so on a runner
    where launches keep coming out unstable the history never fills."""
    out = []
    for d in measurements:
        status = (d.get("verdict") or {}).get("status")
        v = verdict_of(d)
        if status == Status.LEARNING.value and v is not None and v.ratio is not None and v.ratio > 1 + v.threshold:
            out.append(f"{d['key']}: {learning_line(d)}")
        elif status == Status.NOISY.value:
            out.append(f"{d['key']}: noisy: {noisy_line(d)}")
        elif status == Status.UNSTABLE.value and _history_stalls(d):
            out.append(f"{d['key']}: unstable ({d.get('unstable') or 'its iterations vary too much'}): not saved, so "
                       f"its history ({d['verdict'].get('n_history') or 0} of {MIN_HISTORY} launches) does not grow "
                       "on this runner while its launches come out so; for a gate on this runner use --mgpu-against")
    return out


# -- the revision lane (--mgpu-against) -------------------------------------------------------------
def revision_of(d: dict) -> Optional[RevisionVerdict]:
    r = d.get("revision")
    return RevisionVerdict.from_dict(r["verdict"]) if r else None


def percent_change(ratio: float) -> str:
    """A change in percent: one decimal below 100%, none from there (a cell keeps its width)."""
    change = (ratio - 1) * 100
    return f"{change:+.1f}" if abs(change) < 99.95 else f"{change:+.0f}"


def revision_change_cell(r: dict) -> str:
    """``+23.1% [+18.0,+28.4]``: head/base and the interval's ends, as changes."""
    v = RevisionVerdict.from_dict(r["verdict"])
    if v.ratio is None:
        return "-"
    if v.low is None or v.high is None:
        return f"{percent_change(v.ratio)}% (n={v.pairs})"
    return f"{percent_change(v.ratio)}% [{percent_change(v.low)},{percent_change(v.high)}]"


def revision_status_cell(r: dict, gate_mode: str, outcome: str = "", width: Optional[int] = None) -> str:
    v = RevisionVerdict.from_dict(r["verdict"])
    text = v.status.value
    if v.status == RevisionStatus.SLOWER:
        text = "SLOWER (failed)" if gate_mode == "fail" else "slower (warned)"
    return _with_outcome(text, outcome, width)


def lane_cell(r: Optional[dict], width: int = 26) -> str:
    """Which lane judged the row: ``history``, or ``vs REV@short`` (``+dirty``: the head side measured
    a working tree with uncommitted changes, not a commit)."""
    if not r:
        return "history"
    tail = f"@{r['short']}" + (" +dirty" if r.get("dirty") else "")
    room = max(4, width - len(tail) - 3)
    rev = r["rev"] if len(r["rev"]) <= room else r["rev"][: room - 1] + "~"
    return f"vs {rev}{tail}"


def head_words(r: dict) -> str:
    return f"the working tree with {r['dirty']}" if r.get("dirty") else "the working tree, clean"


def revision_line(r: dict) -> str:
    """One paragraph: what was compared with what, the pairs, the verdict, and what to do."""
    v = RevisionVerdict.from_dict(r["verdict"])
    against = f"against {r['rev']} ({r['short']})"
    if v.status in (RevisionStatus.NEW, RevisionStatus.BASE_FAILED):
        return f"{against}: {v.status.value}: {v.note}; not judged"
    if v.status == RevisionStatus.UNCHANGED:
        return (f"{against}: unchanged code: {v.note}; head {fmt_time(r.get('head_median_s'))} over {v.pairs} "
                "pair(s), not measured further, not judged")
    text = (f"{against}: base {fmt_time(r.get('base_median_s'))}, head {fmt_time(r.get('head_median_s'))} "
            f"({head_words(r)}); head/base")
    if v.ratio is not None:
        text += f" x{v.ratio:.3f}"
    if v.low is not None and v.high is not None:
        text += f" [{v.low:.3f}, {v.high:.3f}] ({v.level:.0%} bootstrap interval)"
    text += (f" over {v.pairs} interleaved pair(s) of {r.get('iterations', 1)} iteration(s); "
             f"threshold +/-{v.threshold * 100:.0f}%: {v.status.value}")
    if v.note:
        text += f" ({v.note})"
    if v.status == RevisionStatus.SLOWER:
        text += (f". The whole interval lies above +{v.threshold * 100:.0f}%: this change makes the step slower "
                 f"than {r['rev']}. If that is expected, raise --mgpu-regression or use --mgpu-gate=warn")
    return text


def lane_notes(measurements) -> list:
    """One line per REV the run was measured against: what the head side was, and the rule."""
    seen: Dict[Tuple[str, str], dict] = {}
    for d in measurements:
        r = d.get("revision")
        if r:
            seen.setdefault((r["rev"], r["short"]), r)
    lines = []
    for (rev, short), r in sorted(seen.items()):
        v = RevisionVerdict.from_dict(r["verdict"])
        lines.append(f"revision lane: vs {rev} ({short}); head: {head_words(r)}; head/base of interleaved pairs with "
                     f"its {v.level:.0%} bootstrap interval: slower above +{v.threshold * 100:g}%, faster below "
                     f"-{v.threshold * 100:g}%, unstable when wider than that band")
    return lines


class TimingRegressionWarning(UserWarning):
    """A measurement the gate judged slower (its history could see the change and the re-measurement
    agreed, or the revision lane's interval lies above the threshold), where that only warns
    (``--mgpu-gate=warn``). A learning, noisy or unstable row never warns: the report says what it is."""


def regression_headline(fails: list, against: str = "") -> str:
    """The first line of a timing failure (a CI page shows the first 500 characters): which
    measurements, against what, and what to do; each failure's own line follows. ``against``: the
    revision lane's REV@commit where the lane found the slowdown (its fix is not a baseline)."""
    names = ", ".join(f.split(" ", 1)[0] for f in fails[:3]) + (f" and {len(fails) - 3} more" if len(fails) > 3 else "")
    if against:
        return (f"timing regression: {names} slower than {against} beyond the threshold (the revision lane). Fix: "
                "find what in this change made the step slower; if it is intended, merge it knowing the cost (the "
                "next change is measured against its own base) or raise --mgpu-regression (or --mgpu-gate=warn). "
                "Details:")
    return (f"timing regression: {names} slower than the baseline beyond the threshold. Fix: find what made "
            "the step slower; if it is intended, record the new speed (--mgpu-save-timing --mgpu-gate=warn) "
            "or raise --mgpu-regression (or --mgpu-gate=warn). Details:")
