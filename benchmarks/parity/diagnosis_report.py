"""The printed report of ``benchmarks/parity/parity_diagnosis.py``: per family false alarms, bugs caught and
right first causes, the overall rates, crashes, and every wrong or missing cause with the first lines
of its message. Prints; asserts nothing."""
from __future__ import annotations

from tabulate import tabulate


def _frac(n: int, d: int) -> str:
    return f"{n}/{d}" if d else "-"


def _family_table(rows: list[dict]) -> list[list]:
    """One row per family: correct passing, bugs caught, right first cause, seconds."""
    table = []
    for fam in sorted({r["family"] for r in rows}, key=[r["family"] for r in rows].index):
        ok = [r for r in rows if r["family"] == fam and r["kind"] == "correct"]
        bugs = [r for r in rows if r["family"] == fam and r["kind"] == "bug"]
        table.append([fam, _frac(sum(r["outcome"] == "passed" for r in ok), len(ok)),
                      _frac(sum(r["caught"] for r in bugs), len(bugs)),
                      _frac(sum(r["right"] for r in bugs), len(bugs)),
                      _frac(sum(r["right_cause_only"] for r in bugs), len(bugs)),
                      str(sum(r["plugin_crash"] for r in ok + bugs)), f"{sum(r['s'] for r in ok + bugs):.0f}"])
    return table


def _head(message: str, n: int = 3) -> str:
    return "\n".join("      " + line[:220] for line in message.splitlines()[:n])


def report(rows: list[dict], wall: float | None, missing: list[str] = ()) -> None:
    """Print the report of judged ``rows`` (see parity_diagnosis.judge); ``wall`` the session's seconds."""
    ok = [r for r in rows if r["kind"] == "correct"]
    bugs = [r for r in rows if r["kind"] == "bug"]
    table = _family_table(rows)
    table.append(["all", _frac(sum(r["outcome"] == "passed" for r in ok), len(ok)),
                  _frac(sum(r["caught"] for r in bugs), len(bugs)), _frac(sum(r["right"] for r in bugs), len(bugs)),
                  _frac(sum(r["right_cause_only"] for r in bugs), len(bugs)), str(sum(r["plugin_crash"] for r in rows)),
                  f"{sum(r['s'] for r in rows):.0f}"])
    print(tabulate(table, headers=["family", "correct passing", "bugs caught", "right first cause",
                                   "(cause part only)", "plugin crashes", "s"]))
    if bugs:
        print(f"\nright first cause: {sum(r['right'] for r in bugs) / len(bugs):.0%} of {len(bugs)} bugs "
              f"({sum(r['right_cause_only'] for r in bugs) / len(bugs):.0%} judged on the cause part only); "
              f"caught: {sum(r['caught'] for r in bugs) / len(bugs):.0%}")
    if wall is not None:
        print(f"wall time: {wall:.0f} s for {len(rows)} cases")
    for name in missing:
        print(f"NO RESULT: {name} (pytest's output above says why)")
    _listing("FALSE ALARMS (correct code failed)", [r for r in ok if r["outcome"] != "passed"])
    _listing("PLUGIN CRASHES on correct code", [r for r in ok if r["plugin_crash"]], lines=0)
    _listing("CRASHES on bugs (not a ParityError / StepCountError)", [r for r in bugs if r["crash"]])
    _listing("MISSED bugs (passed)", [r for r in bugs if r["outcome"] == "passed"])
    _listing("WRONG first cause", [r for r in bugs if r["caught"] and not r["right"]])
    _listing("RUBRIC MATCH ONLY WITH / ONLY WITHOUT the Fix text (settle by reading)",
             [r for r in bugs if r["right"] != r["right_cause_only"]], lines=0)


def _listing(title: str, rows: list[dict], lines: int = 3) -> None:
    if not rows:
        return
    print(f"\n{title}: {len(rows)}")
    for r in rows:
        print(f"  - {r['name']} [{r['outcome']}, {r['s']:.1f} s]")
        if r.get("cause"):
            print(f"      first cause: {r['cause'][:300]}")
        if r["message"] and lines:
            print(_head(r["message"], lines))
