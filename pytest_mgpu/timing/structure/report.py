"""The structure verdicts in the session's Markdown and JSON reports (``--mgpu-report``): one row per
judged call (test id, call, verdict) and what changed or why it was not judged."""
from __future__ import annotations

from typing import List, Sequence


def markdown(verdicts: Sequence[dict]) -> str:
    """A ``## pytest-mgpu structure`` section ('' when no call was judged)."""
    if not verdicts:
        return ""
    out: List[str] = ["## pytest-mgpu structure", "", "| test | call | verdict |", "| --- | --- | --- |"]
    out += [f"| `{v['test']}` | {v['call']} | {v['status']} |" for v in verdicts]
    details = [f"- `{v['test']}` {v['call']}: {line}" for v in verdicts if v["status"] in ("changed", "other torch", "other device")
               for line in v.get("lines", [])]
    if details:
        out += ["", *details]
    out.append("")
    out.append("Counts must be equal; bytes sent and peak memory within --mgpu-structure-tolerance. "
               "Goldens: baselines/structure.json, recorded with --mgpu-save-structure (--mgpu-save-baselines "
               "records them and the timings).")
    return "\n".join(out) + "\n"
