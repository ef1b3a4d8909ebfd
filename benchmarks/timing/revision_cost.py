"""What the revision lane costs: wall time of the timing suites without and with ``--mgpu-against``.

Runs ``pytest suites/test_timing_*.py --mgpu-fallback=cpu`` alternately without and with
``--mgpu-against=REV`` (default: ``main``), each in a fresh process, and prints the wall times, the
ratio per round and the rows of the last lane run's report (for README's pull-request example).

    python benchmarks/timing/revision_cost.py --rounds 3 [--against main] [--suites suites/test_timing_dp_ddp.py]

Prints; asserts nothing. The load average is printed with every run: figures taken on a loaded
machine are not a quiet machine's.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(suites, against, report) -> dict:
    cmd = [sys.executable, "-m", "pytest", *suites, "--mgpu-fallback=cpu", "-p", "no:cacheprovider", "-q",
           f"--mgpu-report={report}"]
    if against:
        cmd.append(f"--mgpu-against={against}")
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=7200)
    wall = time.perf_counter() - t0
    tail = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]
    return {"against": against, "wall_s": wall, "load": load, "rc": out.returncode, "tail": tail,
            "stdout": out.stdout}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", default="main", help="the REV of the lane runs")
    ap.add_argument("--suites", nargs="+", default=sorted(glob.glob(os.path.join(ROOT, "suites", "test_timing_*.py"))))
    args = ap.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="revision-cost-")
    runs = []
    for r in range(args.rounds):
        for against in ((None, args.against) if r % 2 == 0 else (args.against, None)):
            got = run(args.suites, against, os.path.join(folder, "lane.json" if against else "plain.json"))
            runs.append(dict(got, round=r))
            print(f"round {r + 1}: {'with --mgpu-against=' + against if against else 'without the lane':<28} "
                  f"{got['wall_s']:7.1f} s (load {got['load']:.1f}; exit {got['rc']}): {got['tail']}", flush=True)
    plain = [x["wall_s"] for x in runs if not x["against"]]
    lane = [x["wall_s"] for x in runs if x["against"]]
    print(f"\nwithout the lane: median {statistics.median(plain):.1f} s; with it: median {statistics.median(lane):.1f} s; "
          f"ratio {statistics.median(lane) / statistics.median(plain):.2f}x ({len(plain)} + {len(lane)} runs)")
    last = next(x for x in reversed(runs) if x["against"])
    after = last["stdout"].split("pytest-mgpu timing", 1)[-1]
    table = after.split("\n", 1)[-1].split("=====", 1)[0]  # from the line after the header to the next one
    print("\nthe last lane run's timing section:" + table)
    with open(os.path.join(folder, "lane.json")) as f:
        doc = json.load(f)
    lanes = [m["revision"] for m in doc["measurements"] if m.get("revision")]
    print(f"lane wall per benchmark: median {statistics.median(x['wall_s'] for x in lanes):.1f} s over {len(lanes)} "
          f"(budget {statistics.median(x['budget_s'] for x in lanes):.1f} s); pairs: median "
          f"{statistics.median(len(x['pairs_head']) for x in lanes)}")
    print(f"\n{'benchmark':<58} {'wall':>6} {'blocks':>6} {'pairs':>5} {'iters':>5} {'log sd':>6}  verdict")
    for m in doc["measurements"]:
        x = m.get("revision")
        if not x:
            continue
        logs = [math.log(h / b) for h, b in zip(x["pairs_head"], x["pairs_base"]) if h > 0 and b > 0]
        sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
        print(f"{(m['key'] + ' ' + m['task']['strategy'])[-58:]:<58} {x['wall_s']:6.1f} {len(set(x['pairs_block'] or [0])):6d} {len(logs):5d} "
              f"{x['iterations']:5d} {sd:6.3f}  {x['verdict']['status']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
