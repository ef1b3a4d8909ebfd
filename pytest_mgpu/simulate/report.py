"""The session's table of simulations: one row per ``simulate()`` call, in the timing report's style
(tabulate's "simple" table, at most ~120 columns; the full figures are in each ``Simulation``)."""
from __future__ import annotations

from typing import List, Sequence

from ..timing.measure import fmt_time
from .result import ABBREVIATIONS, fmt_bytes, fmt_collectives

HEADERS = ["test", "fn", "W", "rank", "collectives", "sent", "peak", "params", "grads", "optimizer", "wall"]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else "~" + text[-(width - 1):]


def _cells(row: dict) -> List[str]:
    memory = row.get("memory", {})
    return [_clip(row.get("test", ""), 34), _clip(row.get("fn", ""), 18), str(row["world_size"]), str(row["rank"]),
            fmt_collectives(row.get("collectives", {})), fmt_bytes(row["comm_bytes"]), fmt_bytes(row["peak_bytes"]),
            fmt_bytes(memory.get("params", 0)), fmt_bytes(memory.get("grads", 0)),
            fmt_bytes(memory.get("optimizer", 0)), fmt_time(row["wall_s"])]


def summary_table(rows: Sequence[dict]) -> str:
    """The table and a legend of the collectives' short names that appear in it."""
    from tabulate import tabulate

    table = tabulate([_cells(r) for r in rows], headers=HEADERS, tablefmt="simple", disable_numparse=True)
    used = sorted({k for r in rows for k in r.get("collectives", {}) if k in ABBREVIATIONS})
    legend = ", ".join(f"{ABBREVIATIONS[k]} = {k}" for k in used)
    note = ("per simulated rank: sent = bytes it sends (ring algorithms), peak = most tensor memory alive at once,\n"
            "params/grads/optimizer = its shards at the end of the last step, wall = fn in the rank")
    return table + "\n" + (f"{legend}\n" if legend else "") + note
