"""The report after a run: one row per measurement and lane, with speed-up over the group's one-device row.

One row type for both lanes: a "history" row judges the measurement against the stored launches of
this machine (``rule``), a "revision" row judges the head against REV measured beside it
(``--mgpu-against``, ``pairing``). Both have a median (this run's, or the head's), a baseline (the
history's median of medians, or the base's median), a change and a verdict; ``lane`` says which
judged it. A measurement with a revision lane and no recorded launch gets only its revision row.

Bookkeeping (``build_rows``) is kept apart from rendering (tabulate for the terminal and Markdown,
json and csv for files), as in torch.utils.benchmark's Compare.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, Iterable, List, Literal, Optional, Sequence, Tuple

from . import messages
from .structure.report import markdown as structure_markdown
from .units import fmt_bytes, fmt_time
from .rule import Status

Lane = Literal["history", "revision"]

REPORT_FORMAT = "pytest-mgpu timing report 2"
TERMINAL_WIDTH = 120

REFERENCE_STRATEGIES = ("single", "whole", "baseline")  # preferred one-device rows of a group


@dataclass
class Row:
    key: str
    test: str
    name: str
    strategy: str
    group: str
    params: Dict[str, object]
    world_size: int
    device_type: str
    emulated: bool
    batch_size: Optional[int]
    median_s: float
    iqr_s: float
    q1_s: float
    q3_s: float
    n: int
    throughput: Optional[float]
    slowest_rank: int
    skew: float
    ranks: int
    peak_mem_bytes: Optional[int]  # largest over ranks
    outcome: str  # the test's: passed, failed, skipped
    verdict: Optional[dict]
    gate_mode: str
    fingerprint: str
    measurement: Dict[str, object]  # the judged measurement dict the row came from
    unstable: str = ""
    speedup: Optional[float] = None
    efficiency: Optional[float] = None
    reference: str = ""  # the row the speed-up is relative to
    lane: Lane = "history"
    base_s: Optional[float] = None  # history: its median of medians; revision: the base's median
    against: str = ""  # revision: REV@short
    head: str = ""  # revision: what the head side measured (the working tree, clean or not)
    batch_keyword: str = ""  # how the test gave the global batch: "global_batch", or the older "batch_size"

    @property
    def revision(self) -> Optional[dict]:
        return self.measurement.get("revision") if self.lane == "revision" else None  # type: ignore[return-value]

    @property
    def label(self) -> str:
        """Strategy with its varying parameters, e.g. ``pipeline split_size=8``."""
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.strategy} {extra}".strip()



def _row(test: str, outcome: str, d: dict) -> Row:
    t = d["task"]
    mems = [m for m in d.get("peak_mem_bytes", []) if m is not None]
    return Row(
        key=d["key"], test=test, name=t["name"], strategy=t["strategy"], group=t["group"],
        params=dict(t.get("params") or {}), world_size=t["world_size"], device_type=t["device_type"],
        emulated=t["emulated"], batch_size=t.get("batch_size"), median_s=d["median_s"], iqr_s=d["iqr_s"],
        q1_s=d.get("q1_s", d["median_s"]), q3_s=d.get("q3_s", d["median_s"]), n=len(d["samples_s"]),
        throughput=d.get("throughput"), slowest_rank=d["slowest_rank"],
        skew=d["skew"], ranks=len(d["rank_samples_s"]), peak_mem_bytes=max(mems) if mems else None,
        outcome=outcome, verdict=d.get("verdict"), gate_mode=d.get("gate_mode", ""),
        fingerprint=d.get("fingerprint_key", ""), measurement=d, unstable=d.get("unstable", ""),
        base_s=d.get("history_median_s"), batch_keyword=t.get("batch_keyword", ""),
    )


def _revision_row(history: Row, r: dict) -> Row:
    """The same measurement as its revision lane saw it: head vs base, from the pairs."""
    heads: List[float] = sorted(r.get("pairs_head") or [])
    q1, q3 = (heads[len(heads) // 4], heads[(3 * len(heads)) // 4]) if heads else (math.nan, math.nan)
    head_median = r.get("head_median_s")
    return replace(
        history, lane="revision", verdict=r["verdict"], base_s=r.get("base_median_s"), n=len(heads),
        median_s=head_median if head_median is not None else math.nan,
        iqr_s=q3 - q1, q1_s=q1, q3_s=q3,  # nan without pairs
        throughput=(history.batch_size / head_median) if history.batch_size and head_median else None,
        against=f"{r['rev']}@{r['short']}", head=messages.head_words(r), unstable="",
    )


def _lanes(test: str, outcome: str, d: dict) -> List[Row]:
    row = _row(test, outcome, d)
    r = d.get("revision")
    if not r:
        return [row]
    rows = [_revision_row(row, r)]
    timed_nothing = not r.get("pairs_head")  # new at REV, or REV failed: the measurement is the history's
    if timed_nothing or (d.get("verdict") or {}).get("status") != Status.NEW.value:  # the history lane says something
        rows.insert(0, row)
    return rows


def _sort_key(r: Row):
    nums = tuple(v if isinstance(v, (int, float)) else math.inf for _, v in sorted(r.params.items()))
    return (r.world_size, r.strategy not in REFERENCE_STRATEGIES, r.strategy, nums, r.name)


def build_rows(measurements: Iterable[Tuple[str, str, dict]]) -> List[Row]:
    """Rows from (test id, outcome, measurement dict), grouped, with speed-up and scaling efficiency.

    Within a group (and device type), the reference is the row with the fewest devices, preferring
    the strategy "single". Speed-up compares throughput when both rows know their batch size (so
    weak scaling counts), step time otherwise; efficiency divides it by the ratio of devices.
    """
    rows = [r for test, outcome, d in measurements for r in _lanes(test, outcome, d)]
    groups: Dict[Tuple[str, str, str], List[Row]] = {}
    for r in rows:
        groups.setdefault((r.group, r.device_type, r.lane), []).append(r)
    ordered: List[Row] = []
    for members in groups.values():
        members.sort(key=_sort_key)
        ref = members[0]
        for r in members if len(members) > 1 else ():  # a row alone has nothing to be faster than
            if ref.throughput and r.throughput:
                r.speedup = r.throughput / ref.throughput
            elif r.median_s > 0 and ref.median_s > 0:
                r.speedup = ref.median_s / r.median_s
            r.efficiency = r.speedup / (r.world_size / ref.world_size) if r.speedup is not None else None
            r.reference = f"{ref.label} ({ref.world_size} dev)"
        ordered.extend(members)
    return ordered


# -- rendering ----------------------------------------------------------------------------------
HEADERS = ["group", "strategy", "W", "emulated", "global batch", "median", "IQR", "samples/s", "speed-up",
           "efficiency", "slowest rank", "peak mem", "baseline", "median change", "judged change", "lane", "verdict"]
# "raw change": this median against the history's median of medians, as the two read on screen;
# "normalised": the figure the gate judges (``messages.delta_cell``), with the launches it has
TERMINAL = ["group", "strategy", "W", "median", "IQR", "speed-up", "eff.", "raw change", "normalised", "verdict"]
# with a revision lane: the same width, the lane's columns instead of IQR, speed-up and efficiency
TERMINAL_LANES = ["group", "strategy", "W", "median", "baseline", "change", "lane", "verdict"]


def _efficiency(r: Row) -> str:
    """Over 100% is flagged: more than linear scaling usually means the one-device row was slowed."""
    if r.efficiency is None:
        return "-"
    return f"{r.efficiency * 100:.0f}%" + ("(!)" if r.efficiency > 1.0 + 1e-9 else "")


def _speedup(r: Row) -> str:
    return f"{r.speedup:.2f}x" if r.speedup is not None else "-"


def raw_change_cell(r: Row) -> str:
    """This median against the history's median of medians (``-12.0%``); "-" without a history, and
    in a revision row (its change is the pairs' own)."""
    if r.lane != "history" or not r.base_s or not r.median_s or not math.isfinite(r.median_s):
        return "-"
    return f"{messages.percent_change(r.median_s / r.base_s)}%"


def change_cell(r: Row) -> str:
    rev = r.revision
    return messages.revision_change_cell(rev) if rev else messages.delta_cell(r.measurement)


def verdict_cell(r: Row, width: Optional[int] = None) -> str:
    rev = r.revision
    if rev:
        return messages.revision_status_cell(rev, r.gate_mode, r.outcome, width)
    return messages.status_cell(r.measurement, r.outcome, width)


def _cells(r: Row) -> List[str]:
    slow = f"{r.slowest_rank} (+{r.skew * 100:.0f}%)" if r.ranks > 1 else "-"
    return [
        r.group, r.label, str(r.world_size), "yes" if r.emulated else "no", str(r.batch_size or "-"),
        fmt_time(r.median_s), fmt_time(r.iqr_s), f"{r.throughput:.1f}" if r.throughput else "-", _speedup(r),
        _efficiency(r), slow, fmt_bytes(r.peak_mem_bytes), fmt_time(r.base_s), raw_change_cell(r), change_cell(r),
        messages.lane_cell(r.revision, 40), verdict_cell(r),
    ]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def _terminal_cells(r: Row, lanes: bool) -> List[str]:
    if lanes:
        return [_clip(r.group, 11), _clip(r.label, 10), str(r.world_size), fmt_time(r.median_s), fmt_time(r.base_s),
                _clip(change_cell(r), 21), messages.lane_cell(r.revision, 29), _clip(verdict_cell(r, 15), 15)]
    return [_clip(r.group, 16), _clip(r.label, 22), str(r.world_size), fmt_time(r.median_s), fmt_time(r.iqr_s),
            _speedup(r), _efficiency(r), raw_change_cell(r), messages.delta_cell(r.measurement),
            _clip(verdict_cell(r, 19), 19)]


def table(rows: Sequence[Row], tablefmt: str = "simple") -> str:
    """The full table (Markdown, files); the terminal gets ``terminal_table``."""
    from tabulate import tabulate

    return tabulate([_cells(r) for r in rows], headers=HEADERS, tablefmt=tablefmt, disable_numparse=True)


def terminal_table(rows: Sequence[Row]) -> str:
    """At most TERMINAL_WIDTH columns: the details (memory, throughput, ranks) are in the reports. With
    a revision lane, its columns (baseline, change with interval, lane) replace IQR and scaling."""
    from tabulate import tabulate

    lanes = any(r.lane == "revision" for r in rows)
    return tabulate([_terminal_cells(r, lanes) for r in rows], headers=TERMINAL_LANES if lanes else TERMINAL,
                    tablefmt="simple", disable_numparse=True)


def column_notes(rows: Sequence[Row]) -> List[str]:
    """Under the terminal table, where a row has a history: what its two change columns measure."""
    if not any(raw_change_cell(r) != "-" for r in rows):
        return []
    return ["raw change: this median against the history's median of medians, as both read above; normalised: "
            "what the gate judges, the step's median over the in-run reference's (on a GPU: the step's own) against "
            "the history's, which cancels changes of the runner's own speed; n = recorded launches"]


def lane_details(rows: Sequence[Row]) -> List[str]:
    """Under the terminal table: why a revision row was not judged (new, base failed, unstable)."""
    out = []
    for r in rows:
        v = (r.revision or {}).get("verdict") or {}
        if v.get("note"):
            out.append(f"{r.key} vs {r.against}: {v['status']}: {v['note']}")
    return out


def markdown(rows: Sequence[Row], notes: Sequence[str] = (), structure: Sequence[dict] = ()) -> str:
    """A Markdown document that fits a CI job summary ($GITHUB_STEP_SUMMARY): the timings, then the
    structure verdicts (``structure``: ``Verdict.to_dict()`` of each judged call)."""
    if not rows and structure:  # a session with structure verdicts and no timings
        return structure_markdown(structure)
    out = ["## pytest-mgpu timing", ""]
    out += [f"- {n.strip()}" for n in notes]
    out += ["", table(rows, "github"), ""]
    out.append("Speed-up is over the group's one-device row (throughput when the global batch is known); "
               "efficiency is speed-up / devices, (!) over 100%. Median change: this median against the "
               "baseline, as both read. Lane \"history\": this launch's "
               "ln(step/reference) (on a GPU: ln(step median)) against the recorded launches' (one-sided t "
               "prediction interval and the "
               "effect size); baseline is their median of medians. Lane \"vs REV\": the head against REV "
               "measured beside it in interleaved pairs (--mgpu-against); change is head/base with its 99% "
               "bootstrap interval; baseline is the base's median.")
    judged = [r for r in rows if r.verdict and (r.lane == "revision" or r.verdict["status"] != Status.NEW.value)]
    if judged:
        out += ["", "### Verdicts", ""]
        for r in judged:
            text = messages.revision_line(r.revision) if r.revision else messages.describe(r.measurement)
            out.append(f"- `{r.key}` {text}")
    return "\n".join(out) + "\n" + ("\n" + structure_markdown(structure) if structure else "")


CSV_FIELDS = ["key", "test", "name", "group", "strategy", "params", "world_size", "device_type", "emulated",
              "global_batch", "median_s", "iqr_s", "n", "throughput", "speedup", "efficiency", "slowest_rank",
              "skew", "peak_mem_bytes", "lane", "baseline_median_s", "ratio", "ci_low", "ci_high", "p_value",
              "verdict", "gate_mode", "against", "head", "outcome", "fingerprint"]


def to_csv(rows: Sequence[Row]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        d = asdict(r)
        d.update(params=json.dumps(r.params, sort_keys=True), baseline_median_s=r.base_s, global_batch=r.batch_size)
        if r.revision:
            v = r.revision["verdict"]
            d.update(ratio=v.get("ratio"), ci_low=v.get("low"), ci_high=v.get("high"), verdict=v["status"])
        else:
            hv = messages.verdict_of(r.measurement)
            d.update(ratio=hv and hv.ratio, p_value=hv and hv.p_value, verdict=hv and hv.status.value)
        w.writerow({k: d.get(k) for k in CSV_FIELDS})
    return buf.getvalue()


def to_json(rows: Sequence[Row], measurements: Sequence[Tuple[str, str, dict]], notes: Sequence[str],
            meta: Optional[Dict[str, object]] = None, structure: Sequence[dict] = ()) -> str:
    """Rows plus every measurement's raw samples, fingerprint and verdict; ``meta``: plugin version,
    commit, fingerprints (``compare`` reads these files back)."""
    doc = {
        "format": REPORT_FORMAT,
        **(meta or {}),
        "notes": list(notes),
        "rows": [{k: v for k, v in dict(asdict(r), label=r.label, change=change_cell(r), verdict_text=verdict_cell(r)).items()
                  if k != "measurement"} for r in rows],
        "measurements": [dict(d, test=test, outcome=outcome) for test, outcome, d in measurements],
        "structure": list(structure),
    }
    return json.dumps(_finite(doc), indent=1, sort_keys=True, default=str, allow_nan=False) + "\n"


def _finite(value):
    """NaN and infinities as null: JSON has no such numbers (``json`` would write ``NaN``, which
    strict parsers such as JavaScript's refuse)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write(path: Path, rows: Sequence[Row], measurements: Sequence[Tuple[str, str, dict]],
          notes: Sequence[str] = (), meta: Optional[Dict[str, object]] = None, structure: Sequence[dict] = ()) -> Path:
    """Write the report as Markdown, JSON or CSV, by the file's extension. Without an extension it
    is Markdown APPENDED to the file, so that ``--mgpu-report=$GITHUB_STEP_SUMMARY`` adds to a CI
    job's summary instead of replacing what earlier steps wrote."""
    suffix = path.suffix.lower()
    if suffix == "":
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(markdown(rows, notes, structure))
        return path
    if suffix == ".md":
        text = markdown(rows, notes, structure)
    elif suffix == ".json":
        text = to_json(rows, measurements, notes, meta, structure)
    elif suffix == ".csv":
        text = to_csv(rows)
    else:
        raise ValueError(f"--mgpu-report writes .md, .json or .csv, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
