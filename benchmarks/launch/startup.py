"""Seconds per distributed test (one all_reduce) for: pytest-mgpu with warm ranks, pytest-mgpu with
fresh processes (--mgpu-isolate), a plain torch.multiprocessing.spawn per test, and PyTorch's own
MultiProcessTestCase. Also the RSS of warm ranks after 10 and after N tests, and what the flight
recorder (on in ranks unless TORCH_FR_BUFFER_SIZE is set) costs a warm call: sessions with it on and
off alternate until a time budget is spent; the ratio of their median call times is printed. And what
one warm call costs (``--only warmcall``): ``dist.run`` of one all_reduce, timed 200 times in a row
after a first call, its median, p10 and p90 in milliseconds, with the CPU time each call cost the test
process and the ranks (the figure the machine's load moves least) and the load average around it.

    python benchmarks/launch/startup.py                 # the tables (a few minutes on 2 cores)
    python benchmarks/launch/startup.py --tests 50 --slow-tests 5 --rss-tests 300
    python benchmarks/launch/startup.py --only recorder --recorder-budget 120
    python benchmarks/launch/startup.py --only warmcall --calls 200 --rounds 3   # ~2 min

Prints; asserts nothing. Run it on a quiet machine: other load shows up in every figure.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from tabulate import tabulate

PLUGIN_TEST = """
import os, resource, pytest, torch, torch.distributed as tdist

def allreduce():
    t = torch.ones(1)
    tdist.all_reduce(t)
    return t.item()

def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024

@pytest.mark.gpu{n}
@pytest.mark.parametrize("i", range({tests}))
def test_allreduce(dist, i):
    assert dist.run(allreduce) == [{n}.0] * {n}
    if os.environ.get("RSS_OUT") and i in (9, {tests} - 1):
        with open(os.environ["RSS_OUT"], "a") as f:
            f.write(f"{{i + 1}} {{max(dist.run(rss_mb)):.0f}}\\n")
"""

RECORDER_TEST = """
import os, time, pytest, torch, torch.distributed as tdist

def collectives(k):
    t = torch.ones(1)
    for _ in range(k):
        tdist.all_reduce(t)
    return t.item()

@pytest.mark.gpu{n}
@pytest.mark.parametrize("k", {ks})
@pytest.mark.parametrize("i", range({tests}))
def test_call(dist, i, k):
    t0 = time.perf_counter()
    dist.run(collectives, k)
    dt = time.perf_counter() - t0
    if i:  # the first call of a k also imports this module in the ranks
        with open(os.environ["CALLS_OUT"], "a") as f:
            f.write(f"{{k}} {{dt}}\\n")
"""

SPAWN = """
import os, sys, time, socket, torch, torch.distributed as tdist, torch.multiprocessing as mp

def work(rank, n, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tdist.init_process_group("gloo", rank=rank, world_size=n)
    t = torch.ones(1)
    tdist.all_reduce(t)
    assert t.item() == n
    tdist.destroy_process_group()

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

if __name__ == "__main__":
    n, tests = int(sys.argv[1]), int(sys.argv[2])
    times = []
    for _ in range(tests):
        t0 = time.perf_counter()
        mp.spawn(work, args=(n, free_port()), nprocs=n)
        times.append(time.perf_counter() - t0)
    print(" ".join(f"{t:.4f}" for t in times))
"""

MPTC = """
import torch, torch.distributed as tdist
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import run_tests

class AllReduce(MultiProcessTestCase):
    @property
    def world_size(self):
        return {n}

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _one(self):
        store = tdist.FileStore(self.file_name, self.world_size)
        tdist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        t = torch.ones(1)
        tdist.all_reduce(t)
        assert t.item() == self.world_size
        tdist.destroy_process_group()

{methods}

if __name__ == "__main__":
    run_tests()
"""


WARMCALL_TEST = """
import os, time, pytest, torch, torch.distributed as tdist

def allreduce():
    t = torch.ones(1)
    tdist.all_reduce(t)
    return t.item()

def cpu_s():
    t = os.times()
    return t.user + t.system

@pytest.mark.gpu{n}
def test_warm_calls(dist):
    dist.run(allreduce)  # starts the pool and imports this module in the ranks: not a warm call
    ranks0, here0 = dist.run(cpu_s), cpu_s()
    walls = []
    for _ in range({calls}):
        t0 = time.perf_counter()
        dist.run(allreduce)
        walls.append(time.perf_counter() - t0)
    here, ranks = cpu_s() - here0, [b - a for a, b in zip(ranks0, dist.run(cpu_s))]
    with open(os.environ["WARMCALL_OUT"], "w") as f:
        f.write(" ".join(map(str, walls)) + "\\n" + f"{{here}} {{sum(ranks)}}\\n")
"""


def warm_calls(n: int, calls: int) -> tuple:
    """One session: the wall seconds of ``calls`` warm calls, and the CPU seconds the test process and
    the ranks (together) spent over them."""
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "test_warmcall.py").write_text(WARMCALL_TEST.format(n=n, calls=calls))
        env = {**os.environ, "WARMCALL_OUT": str(d / "calls.txt")}
        run_pytest(d, "--mgpu-fallback=cpu", "-p", "no:randomly", env=env)
        walls, cpu = (d / "calls.txt").read_text().split("\n")[:2]
    here, ranks = map(float, cpu.split())
    return [float(x) for x in walls.split()], here, ranks


def load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def warmcall_table(sizes: list, calls: int, rounds: int) -> str:
    """Per world size: median, p10, p90 of all rounds' warm calls (ms), and CPU ms per call."""
    rows = []
    for n in sizes:
        walls, here, ranks, loads = [], 0.0, 0.0, [load()]
        for _ in range(rounds):
            w, h, r = warm_calls(n, calls)
            walls += w
            here, ranks = here + h, ranks + r
            loads.append(load())
        q = statistics.quantiles(walls, n=10)
        per = 1000 / (rounds * calls)
        rows.append([n, len(walls), f"{statistics.median(walls) * 1000:.2f}", f"{q[0] * 1000:.2f}",
                     f"{q[-1] * 1000:.2f}", f"{here * per:.2f}", f"{ranks * per:.2f}",
                     f"{min(loads):.1f}-{max(loads):.1f}"])
    return tabulate(rows, headers=["world size", "calls", "median ms", "p10 ms", "p90 ms", "CPU ms/call test process",
                                   "CPU ms/call ranks", "load"], tablefmt="github")


def junit_times(xml: Path) -> list[float]:
    return [float(tc.get("time")) for tc in ET.parse(xml).getroot().iter("testcase")]


def run_pytest(directory: Path, *args: str, env: dict | None = None) -> list[float]:
    xml = directory / "out.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *args]
    proc = subprocess.run(cmd, cwd=directory, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return junit_times(xml)


def plugin(n: int, tests: int, isolate: bool, rss_out: str | None = None) -> list[float]:
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "test_bench.py").write_text(PLUGIN_TEST.format(n=n, tests=tests))
        env = dict(os.environ)
        if rss_out:
            env["RSS_OUT"] = rss_out
        args = ["--mgpu-fallback=cpu"] + (["--mgpu-isolate"] if isolate else [])
        times = run_pytest(d, *args, env=env)
    return times[1:]  # the first test also starts the forkserver / the pool: a once-per-session cost


def spawn(n: int, tests: int) -> list[float]:
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "spawn_bench.py"
        script.write_text(SPAWN)
        out = subprocess.run([sys.executable, str(script), str(n), str(tests)], capture_output=True,
                             text=True, timeout=3600, check=True)
    return [float(x) for x in out.stdout.split()]


def mptc(n: int, tests: int) -> list[float]:
    methods = "\n".join(f"    def test_{i}(self):\n        self._one()\n" for i in range(tests))
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "test_mptc.py").write_text(MPTC.format(n=n, methods=methods))
        return run_pytest(d, "test_mptc.py")


def recorder_cost(n: int, tests: int, ks: tuple, budget_s: float) -> list:
    """Median warm-call seconds with the flight recorder off and on, per collectives per call; sessions
    alternate (off, on, off, on, ...) so that both see the same drift of a shared machine."""
    calls = {(k, on): [] for k in ks for on in (False, True)}
    end, rounds = time.monotonic() + budget_s, 0
    while rounds < 1 or time.monotonic() < end:
        for on in (False, True):
            with tempfile.TemporaryDirectory() as d:
                d = Path(d)
                (d / "test_recorder.py").write_text(RECORDER_TEST.format(n=n, tests=tests, ks=list(ks)))
                env = {**os.environ, "CALLS_OUT": str(d / "calls.txt")}
                env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
                if on:
                    env.pop("TORCH_FR_BUFFER_SIZE", None)  # the plugin's default: on
                else:
                    env["TORCH_FR_BUFFER_SIZE"] = "0"  # the user's setting wins: off
                run_pytest(d, "--mgpu-fallback=cpu", "-p", "no:randomly", env=env)
                for row in (d / "calls.txt").read_text().split("\n"):
                    if row:
                        k, dt = row.split()
                        calls[(int(k), on)].append(float(dt))
        rounds += 1
    rows = []
    for k in ks:
        off, on = statistics.median(calls[(k, False)]), statistics.median(calls[(k, True)])
        rows.append([n, k, rounds, f"{off * 1000:.2f}", f"{on * 1000:.2f}", f"{on / off:.3f}"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", type=int, default=50, help="tests per world size for pytest-mgpu modes")
    ap.add_argument("--slow-tests", type=int, default=5,
                    help="tests per world size for mp.spawn and MultiProcessTestCase (seconds each)")
    ap.add_argument("--rss-tests", type=int, default=300, help="tests in the warm-rank memory run (0: skip)")
    ap.add_argument("--sizes", default="2,4")
    ap.add_argument("--only", choices=["startup", "recorder", "warmcall"], default=None)
    ap.add_argument("--calls", type=int, default=200, help="timed warm calls per session (--only warmcall)")
    ap.add_argument("--rounds", type=int, default=3, help="sessions per world size (--only warmcall)")
    ap.add_argument("--recorder-budget", type=float, default=120.0,
                    help="seconds of alternating recorder on/off sessions (at least one round)")
    ap.add_argument("--recorder-tests", type=int, default=40, help="calls per collectives count per session")
    args = ap.parse_args()
    if args.only == "warmcall":
        print(warmcall_table([int(x) for x in args.sizes.split(",")], args.calls, args.rounds))
        return
    if args.only != "recorder":
        startup_tables(args)
    if args.only != "startup":
        rows = [row for n in [int(x) for x in args.sizes.split(",")]
                for row in recorder_cost(n, args.recorder_tests, (1, 100), args.recorder_budget / 2)]
        print()
        print(tabulate(rows, headers=["world size", "collectives per call", "rounds", "ms/call recorder off",
                                      "ms/call recorder on", "on / off"], tablefmt="github"))


def startup_tables(args) -> None:
    rows, per = [], {}
    for n in [int(x) for x in args.sizes.split(",")]:
        modes = [
            ("pytest-mgpu warm", lambda: plugin(n, args.tests, False)),
            ("pytest-mgpu fresh (--mgpu-isolate)", lambda: plugin(n, args.tests, True)),
            ("torch.multiprocessing.spawn", lambda: spawn(n, args.slow_tests)),
            ("MultiProcessTestCase", lambda: mptc(n, args.slow_tests)),
        ]
        for name, fn in modes:
            t0 = time.perf_counter()
            times = fn()
            per[(name, n)] = statistics.median(times)
            print(f"  {name:<36} world {n}: {len(times)} tests, median {per[(name, n)]*1000:.1f} ms "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        base = per[("torch.multiprocessing.spawn", n)]
        for name, _ in modes:
            s = per[(name, n)]
            rows.append([name, n, f"{s:.4f}", f"{base / s:.1f}x"])
    print(tabulate(rows, headers=["mode", "world size", "s/test (median)", "faster than mp.spawn"],
                   tablefmt="github"))

    if args.rss_tests:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "rss.txt"
            plugin(4, args.rss_tests, False, rss_out=str(out))
            marks = [line.split() for line in out.read_text().split("\n") if line]
        print()
        print(tabulate([[int(a), f"{float(b):.0f}"] for a, b in marks],
                       headers=["tests run on the warm 4-rank pool", "max rank RSS (MB)"], tablefmt="github"))


if __name__ == "__main__":
    main()
