"""The tables of ``benchmarks/parity/parity_power.py`` from its JSON lines (one row per check run).

A row: family, steps, kind (a bug kind, or ``correct``), eps, at, seed, burners, caught (True: the
check raised ParityError; False: it passed; None: it failed otherwise, ``error`` names how), ratio
(the report's worst_ratio, worst error / line, > 1 fails), first (the message's first lines, or the
report's first notes), s (seconds). Cells not run are inferred under the assumption that a bug
caught at eps is caught at every larger eps, and one passed at eps passes at every smaller one.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from tabulate import tabulate


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x) or x >= 1e300:
        return "inf"
    return f"{x:.3g}"


def _cell(runs: dict, eps: float) -> str:
    """'caught 2.1e+03' / 'passed 0.41' where run; '(caught)' / '(passed)' where inferred; '?' else."""
    row = runs.get(eps)
    if row is not None:
        if row["caught"] is None:
            return f"error ({row['error']})"
        return f"{'caught' if row['caught'] else 'passed'} {_fmt(row['ratio'])}"
    if any(r["caught"] for e, r in runs.items() if e < eps):
        return "(caught)"
    if any(r["caught"] is False for e, r in runs.items() if e > eps):
        return "(passed)"
    return "?"


def smallest_caught(runs: dict) -> str:
    """The smallest eps caught of one bug kind ('> largest' where none was; 'caught'/'passed' if no eps)."""
    if set(runs) == {0.0}:
        r = runs[0.0]
        return "error" if r["caught"] is None else "caught" if r["caught"] else "PASSED"
    caught = [e for e, r in runs.items() if r["caught"]]
    return f"{min(caught):g}" if caught else f"> {max(runs):g}"


def _bug_tables(rows: list) -> list:
    groups = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        if r["kind"] != "correct":
            groups[(r["family"], r["steps"], r["at"], r["burners"], r.get("attn_bias", True))][r["kind"]][r["eps"]] = r
    summary = []
    for (family, steps, at, burners, bias), kinds in groups.items():
        eps = sorted({e for runs in kinds.values() for e in runs}, reverse=True)  # 0.0: a bug with no size
        table = [[kind] + ["" if (e == 0.0) != (0.0 in runs) else _cell(runs, e) for e in eps]
                 + [smallest_caught(runs)] for kind, runs in kinds.items()]
        print(f"\n{family}{'' if bias else ' (no attention biases)'}, {steps} steps, bug from step {at}"
              f"{f', {burners} burners' if burners else ''} "
              f"(cell: verdict and worst error / line):")
        print(tabulate(table, headers=["bug"] + [f"eps {e:g}" if e else "no eps" for e in eps] + ["smallest caught"]))
        summary.append((family if bias else f"{family} (no biases)", steps, {kind: smallest_caught(runs) for kind, runs in kinds.items()}))
    return summary


def _false_alarms(rows: list) -> None:
    ok = [r for r in rows if r["kind"] == "correct"]
    if not ok:
        return
    groups = defaultdict(list)
    for r in ok:
        groups[(r["family"], r["steps"], r["burners"])].append(r)
    table = []
    for (family, steps, burners), rs in groups.items():
        ratios = [r["ratio"] for r in rs if r["ratio"] is not None]
        table.append([family, steps, burners, len(rs), sum(r["caught"] is True for r in rs),
                      sum(r["caught"] is None for r in rs), _fmt(max(ratios) if ratios else None)])
    print("\nfalse alarms (correct runs, seeds 100, 101, ...):")
    print(tabulate(table, headers=["family", "steps", "burners", "runs", "failed", "errors", "worst ratio"]))
    quiet, loaded = [r for r in ok if not r["burners"]], [r for r in ok if r["burners"]]
    for name, rs in (("quiet", quiet), ("beside burners", loaded)):
        if rs:
            print(f"false alarms {name}: {sum(r['caught'] is True for r in rs)} of {len(rs)} correct runs failed "
                  f"({sum(r['caught'] is None for r in rs)} errors)")


def analyze(path: Path) -> None:
    """Print the per-family tables, the summary of the smallest eps caught, and the false alarms."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    summary = _bug_tables(rows)
    if summary:
        kinds = list(dict.fromkeys(k for _, _, ks in summary for k in ks))
        print("\nsmallest eps caught (> e: passed at every eps tried, e the largest):")
        print(tabulate([[f, s] + [ks.get(k, "") for k in kinds] for f, s, ks in summary],
                       headers=["family", "steps"] + kinds))
    _false_alarms(rows)
    bad = [r for r in rows if (r["kind"] == "correct" and r["caught"] is not False) or r["caught"] is None]
    for r in bad:
        what = "ERROR" if r["caught"] is None else "FALSE ALARM"
        print(f"\n{what}: {r['family']} {r['steps']} steps {r['kind']} eps {r['eps']:g} seed {r['seed']} "
              f"ratio {_fmt(r['ratio'])} {r['error']}")
        for line in r["first"]:
            print(f"    {line[:300]}")
    print(f"\n{len(rows)} checks, {sum(r['s'] for r in rows):.0f} s in the checks")
