"""The report after a run: one row per measurement, with speed-up over the group's one-device row.

Bookkeeping (``build_rows``) is kept apart from rendering (tabulate for the terminal and Markdown,
json and csv for files), as in torch.utils.benchmark's Compare.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from . import messages
from .measure import fmt_bytes, fmt_time
from .rule import Status

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
        q1_s=d.get("q1_s", d["median_s"]), q3_s=d.get("q3_s", d["median_s"]), n=len(d["samples_s"]), throughput=d.get("throughput"), slowest_rank=d["slowest_rank"],
        skew=d["skew"], ranks=len(d["rank_samples_s"]), peak_mem_bytes=max(mems) if mems else None,
        outcome=outcome, verdict=d.get("verdict"), gate_mode=d.get("gate_mode", ""),
        fingerprint=d.get("fingerprint_key", ""), measurement=d, unstable=d.get("unstable", ""),
    )


def _sort_key(r: Row):
    nums = tuple(v if isinstance(v, (int, float)) else math.inf for _, v in sorted(r.params.items()))
    return (r.world_size, r.strategy not in REFERENCE_STRATEGIES, r.strategy, nums, r.name)


def build_rows(measurements: Iterable[Tuple[str, str, dict]]) -> List[Row]:
    """Rows from (test id, outcome, measurement dict), grouped, with speed-up and scaling efficiency.

    Within a group (and device type), the reference is the row with the fewest devices, preferring
    the strategy "single". Speed-up compares throughput when both rows know their batch size (so
    weak scaling counts), step time otherwise; efficiency divides it by the ratio of devices.
    """
    rows = [_row(test, outcome, d) for test, outcome, d in measurements]
    groups: Dict[Tuple[str, str], List[Row]] = {}
    for r in rows:
        groups.setdefault((r.group, r.device_type), []).append(r)
    ordered: List[Row] = []
    for (group, _), members in groups.items():
        members.sort(key=_sort_key)
        ref = members[0]
        for r in members:
            if ref.throughput and r.throughput:
                r.speedup = r.throughput / ref.throughput
            elif r.median_s > 0:
                r.speedup = ref.median_s / r.median_s
            r.efficiency = r.speedup / (r.world_size / ref.world_size) if r.speedup is not None else None
            r.reference = f"{ref.label} ({ref.world_size} dev)"
        ordered.extend(members)
    return ordered


# -- rendering ----------------------------------------------------------------------------------
HEADERS = ["group", "strategy", "W", "emulated", "median", "IQR", "samples/s", "speed-up", "efficiency",
           "slowest rank", "peak mem", "vs history", "verdict"]
TERMINAL = ["group", "strategy", "W", "median", "IQR", "speed-up", "eff.", "vs history", "verdict"]


def _efficiency(r: Row) -> str:
    """Over 100% is flagged: more than linear scaling usually means the one-device row was slowed."""
    if r.efficiency is None:
        return "-"
    return f"{r.efficiency * 100:.0f}%" + ("(!)" if r.efficiency > 1.0 + 1e-9 else "")


def _speedup(r: Row) -> str:
    return f"{r.speedup:.2f}x" if r.speedup is not None else "-"


def _cells(r: Row) -> List[str]:
    slow = f"{r.slowest_rank} (+{r.skew * 100:.0f}%)" if r.ranks > 1 else "-"
    return [
        r.group, r.label, str(r.world_size), "yes" if r.emulated else "no", fmt_time(r.median_s),
        fmt_time(r.iqr_s), f"{r.throughput:.1f}" if r.throughput else "-", _speedup(r), _efficiency(r), slow,
        fmt_bytes(r.peak_mem_bytes), messages.delta_cell(r.measurement),
        messages.status_cell(r.measurement, r.outcome),
    ]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def _terminal_cells(r: Row) -> List[str]:
    return [_clip(r.group, 26), _clip(r.label, 22), str(r.world_size), fmt_time(r.median_s), fmt_time(r.iqr_s),
            _speedup(r), _efficiency(r), messages.delta_cell(r.measurement),
            _clip(messages.status_cell(r.measurement, r.outcome), 24)]


def table(rows: Sequence[Row], tablefmt: str = "simple") -> str:
    """The full table (Markdown, files); the terminal gets ``terminal_table``."""
    from tabulate import tabulate

    return tabulate([_cells(r) for r in rows], headers=HEADERS, tablefmt=tablefmt, disable_numparse=True)


def terminal_table(rows: Sequence[Row]) -> str:
    """At most TERMINAL_WIDTH columns: the details (memory, throughput, ranks) are in the reports."""
    from tabulate import tabulate

    return tabulate([_terminal_cells(r) for r in rows], headers=TERMINAL, tablefmt="simple",
                    disable_numparse=True)


def markdown(rows: Sequence[Row], notes: Sequence[str] = ()) -> str:
    """A Markdown document that fits a CI job summary ($GITHUB_STEP_SUMMARY)."""
    out = ["## pytest-mgpu timing", ""]
    out += [f"- {n.strip()}" for n in notes]
    out += ["", table(rows, "github"), ""]
    out.append("Speed-up is over the group's one-device row (throughput when the batch size is known); "
               "efficiency is speed-up / devices, (!) over 100%. vs history: this launch's ln(step/reference) "
               "against the recorded launches' (one-sided t prediction interval and the effect size).")
    judged = [r for r in rows if r.verdict and r.verdict["status"] not in (Status.NEW.value,)]
    if judged:
        out += ["", "### Verdicts", ""]
        for r in judged:
            out.append(f"- `{r.key}` {messages.describe(r.measurement)}")
    return "\n".join(out) + "\n"


CSV_FIELDS = ["key", "test", "name", "group", "strategy", "params", "world_size", "device_type", "emulated",
              "batch_size", "median_s", "iqr_s", "n", "throughput", "speedup", "efficiency", "slowest_rank",
              "skew", "peak_mem_bytes", "baseline_median_s", "ratio", "p_value", "verdict", "gate_mode",
              "outcome", "fingerprint"]


def to_csv(rows: Sequence[Row]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        d = asdict(r)
        v = messages.verdict_of(r.measurement)
        d.update(params=json.dumps(r.params, sort_keys=True), baseline_median_s=r.measurement.get("history_median_s"),
                 ratio=v and v.ratio, p_value=v and v.p_value, verdict=v and v.status.value)
        w.writerow({k: d.get(k) for k in CSV_FIELDS})
    return buf.getvalue()


def to_json(rows: Sequence[Row], measurements: Sequence[Tuple[str, str, dict]], notes: Sequence[str],
            meta: Optional[Dict[str, object]] = None) -> str:
    """Rows plus every measurement's raw samples, fingerprint and verdict; ``meta``: plugin version,
    commit, fingerprints (``compare`` reads these files back)."""
    doc = {
        "format": REPORT_FORMAT,
        **(meta or {}),
        "notes": list(notes),
        "rows": [{k: v for k, v in dict(asdict(r), label=r.label).items() if k != "measurement"} for r in rows],
        "measurements": [dict(d, test=test, outcome=outcome) for test, outcome, d in measurements],
    }
    return json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n"


def write(path: Path, rows: Sequence[Row], measurements: Sequence[Tuple[str, str, dict]],
          notes: Sequence[str] = (), meta: Optional[Dict[str, object]] = None) -> Path:
    """Write the report as Markdown, JSON or CSV, by the file's extension. Without an extension it
    is Markdown APPENDED to the file, so that ``--mgpu-report=$GITHUB_STEP_SUMMARY`` adds to a CI
    job's summary instead of replacing what earlier steps wrote."""
    suffix = path.suffix.lower()
    if suffix == "":
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(markdown(rows, notes))
        return path
    if suffix == ".md":
        text = markdown(rows, notes)
    elif suffix == ".json":
        text = to_json(rows, measurements, notes, meta)
    elif suffix == ".csv":
        text = to_csv(rows)
    else:
        raise ValueError(f"--mgpu-report writes .md, .json or .csv, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
