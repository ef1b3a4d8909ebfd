"""Milliseconds per ``dist.run`` call with and without ``pytest --cov``, in warm ranks and in fresh ones
(--mgpu-isolate): what measuring coverage inside ranks (``launch/rank_coverage.py``) costs a call.

    python benchmarks/launch/coverage_cost.py                  # 2 ranks, 3 runs x 40 calls per configuration
    python benchmarks/launch/coverage_cost.py --calls 100 --ranks 4

The measured function runs ~40 lines of a small package (the one --cov names) per call. The first call
of each run (pool start-up) is left out. Prints; asserts nothing. Needs pytest-cov.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

WORK = '''
def work(i):
    total = 0
    for k in range(20):
        if (i + k) % 3 == 0:
            total += k
        elif (i + k) % 3 == 1:
            total -= 1
        else:
            total += helper(k)
    return total


def helper(k):
    return k * 2
'''

TEST = '''
import os, time, pytest
from covbench.work import work

@pytest.mark.gpu{ranks}
def test_calls(dist):
    times = []
    for i in range({calls} + 1):
        t0 = time.perf_counter()
        dist.run(work, i)
        times.append(time.perf_counter() - t0)
    with open(os.environ["TIMES_OUT"], "w") as f:
        f.write("\\n".join(str(t) for t in times[1:]))
'''


CONFTEST = """
import os
import pytest_mgpu.dist

if os.environ.get("BENCH_RANKS_UNMEASURED"):  # --cov measures the test process only, as before
    pytest_mgpu.dist.ranks_env = lambda start_dir: {}
"""


def run(folder: Path, extra: list, env: dict) -> list:
    out = folder / "times.txt"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--mgpu-fallback=cpu", *extra,
           "test_calls.py"]
    proc = subprocess.run(cmd, cwd=folder, env=dict(env, TIMES_OUT=str(out)), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return [float(x) * 1000 for x in out.read_text().split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--ranks", type=int, default=2, choices=(1, 2, 4, 8))
    parser.add_argument("--rounds", type=int, default=3, help="pytest runs per configuration")
    args = parser.parse_args()
    repo = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="mgpu-covcost-") as tmp:
        folder = Path(tmp)
        (folder / "covbench").mkdir()
        (folder / "covbench" / "__init__.py").write_text("")
        (folder / "covbench" / "work.py").write_text(WORK)
        (folder / "test_calls.py").write_text(TEST.format(ranks=args.ranks, calls=args.calls))
        (folder / "conftest.py").write_text(CONFTEST)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), str(folder),
                                                           os.environ.get("PYTHONPATH", "")]))
        rows = []
        for ranks in ("warm", "fresh (--mgpu-isolate)"):
            mode = [] if ranks == "warm" else ["--mgpu-isolate"]
            base, parent, cov = [], [], []
            cov_args = mode + ["--cov=covbench", "--cov-report="]
            for _ in range(args.rounds):  # alternated, so that a change in the machine's load hits all
                base += run(folder, mode, env)
                parent += run(folder, cov_args, dict(env, BENCH_RANKS_UNMEASURED="1"))
                cov += run(folder, cov_args, env)
            b, p, c = (statistics.median(x) for x in (base, parent, cov))
            rows.append([ranks, len(base), f"{b:.1f}", f"{p:.1f}", f"{c:.1f}", f"{c - p:+.1f}", f"{c - b:+.1f}"])
    print(f"{args.ranks} rank(s), ms per dist.run call (median)")
    print(tabulate(rows, headers=["ranks", "calls", "no --cov", "--cov, ranks unmeasured", "--cov", "ranks' cost",
                                  "--cov's cost"]))


if __name__ == "__main__":
    main()
