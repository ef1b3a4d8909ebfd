"""Fault injection: is the dead rank blamed as the cause, every time? Prints, never asserts.

1. Rank 0 SIGKILLs itself (or segfaults: ctypes.string_at(0)) while the other ranks wait in
   all_reduce; warm ranks and --mgpu-isolate. Counts the runs whose report names rank 0 as the only
   cause ("cause: rank(s) 0", its death not marked a consequence).
2. A SIGKILLed pytest whose rank started children (a DataLoader with 2 workers, a plain
   subprocess.Popen): processes left 10 s later, over R runs, while another suite loads the machine.
3. The margin a hung call needs between our cut and pytest-timeout's limit: how long after the cut
   our report was out (REPORT_MARGIN_S in launch/collect.py must exceed it).

    PYTHONPATH=. python benchmarks/launch/attribution.py [--sigkill 50] [--segfault 20] [--leak-runs 20]
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DIE = """
import ctypes, os, signal, pytest, torch, torch.distributed as tdist

def die(how):
    if tdist.get_rank() == 0:
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        ctypes.string_at(0)
    t = torch.ones(1)
    tdist.all_reduce(t)
    return t

@pytest.mark.gpu4
@pytest.mark.parametrize("i", range({n}))
def test_die(dist, i):
    dist.run(die, "{how}")
"""

LEAK = """
import os, subprocess, time, pytest, torch, torch.distributed as tdist
from torch.utils.data import DataLoader

def spawn_children(ready):
    it = iter(DataLoader(list(range(100)), batch_size=1, num_workers=2))
    next(it)
    subprocess.Popen(["sleep", "600"])
    tdist.barrier()
    if tdist.get_rank() == 0:
        open(ready, "w").close()
    time.sleep(600)

@pytest.mark.gpu2
def test_children(dist):
    dist.run(spawn_children, {ready!r})
"""

HANG = """
import time, pytest, torch.distributed as tdist

def hang():
    if tdist.get_rank() == 0:
        time.sleep(600)
    tdist.barrier()

@pytest.mark.gpu4
def test_hang(dist):
    dist.run(hang)
"""


def env(token: str) -> dict:
    e = dict(os.environ, PYTHONPATH=ROOT, MGPU_BENCH_TOKEN=token, PYTHONUNBUFFERED="1")
    e.pop("PYTEST_XDIST_WORKER", None)
    return e


def pytest_cmd(*args: str) -> list:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
            "--mgpu-fallback=cpu", *args]


def attribution(how: str, n: int, isolate: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "test_die.py"), "w") as f:
            f.write(DIE.replace("{n}", str(n)).replace("{how}", how))
        xml = os.path.join(d, "junit.xml")
        args = pytest_cmd("-q", f"--junitxml={xml}", *(["--mgpu-isolate"] if isolate else []))
        subprocess.run(args, cwd=d, env=env(uuid.uuid4().hex), capture_output=True, timeout=3600)
        right = total = 0
        wrong = []
        for case in ET.parse(xml).getroot().iter("testcase"):
            failure = case.find("failure")
            total += 1
            text = (failure.get("message", "") + (failure.text or "")) if failure is not None else ""
            died = re.search(r"^E?\s*rank 0 died: .*$", text, re.M)
            head = text.splitlines()[0] if text else ""
            ok = head.rstrip().endswith("cause: rank(s) 0") and died is not None and "consequence" not in died.group(0)
            right += ok
            if not ok:
                wrong.append(text.splitlines()[0] if text else "(passed?)")
        mode = "isolate" if isolate else "warm"
        print(f"{how:8s} {mode:7s}: rank 0 blamed as the cause in {right} of {total} runs", flush=True)
        for line in wrong[:3]:
            print("    not attributed:", line[:300], flush=True)


def leak(runs: int) -> None:
    """SIGKILL pytest while its ranks hold DataLoader workers and a Popen child; count leftovers."""
    load = subprocess.Popen(pytest_cmd("-q", os.path.join(ROOT, "tests", "test_core_dist.py")), cwd=ROOT,
                            env=env("load"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    left_total = []
    try:
        for i in range(runs):
            with tempfile.TemporaryDirectory() as d:
                ready = os.path.join(d, "ready")
                with open(os.path.join(d, "test_leak.py"), "w") as f:
                    f.write(LEAK.replace("{ready!r}", repr(ready)))
                token = uuid.uuid4().hex
                p = subprocess.Popen(pytest_cmd("-q", "-s"), cwd=d, env=env(token), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
                end = time.monotonic() + 180
                while not os.path.exists(ready) and time.monotonic() < end and p.poll() is None:
                    time.sleep(0.1)
                started = len(with_token(token))
                os.kill(p.pid, signal.SIGKILL)  # the pytest process only, not its group
                p.wait()
                time.sleep(10)
                left = with_token(token)
                left_total.append(len(left))
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                print(f"  run {i}: {started} processes before the kill, {len(left)} left 10 s after", flush=True)
    finally:
        os.killpg(load.pid, signal.SIGKILL)
    print(f"SIGKILLed pytest with rank children: {sum(1 for n in left_total if n)} of {runs} runs left "
          f"processes ({sum(left_total)} in all)", flush=True)


def with_token(token: str) -> list:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if token.encode() not in f.read():
                        continue
                with open(f"/proc/{entry}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        found.append(int(entry))
            except OSError:
                pass
    return found


def margin(runs: int, timeout: float) -> None:
    """How long after the cut (REPORT_MARGIN_S before pytest-timeout's limit) our report is out: the
    test's duration minus (limit - margin), from junit XML, --timeout-method=thread."""
    sys.path.insert(0, ROOT)
    from pytest_mgpu.launch.collect import REPORT_MARGIN_S

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "test_hang.py"), "w") as f:
            f.write(HANG)
        used = []
        for _ in range(runs):
            xml = os.path.join(d, "junit.xml")
            out = subprocess.run(pytest_cmd("-q", f"--timeout={timeout:g}", "--timeout-method=thread",
                                            f"--junitxml={xml}"), cwd=d, env=env("m"), capture_output=True,
                                 text=True, timeout=600).stdout
            case = next(ET.parse(xml).getroot().iter("testcase"))
            ours = "stopped before pytest-timeout" in out and "+ Timeout +" not in out
            used.append(float(case.get("time")) - (timeout - REPORT_MARGIN_S))
            print(f"  our report first: {ours}; report out {used[-1]:.2f}s after the cut", flush=True)
        print(f"report after the cut: max {max(used):.2f}s over {runs} runs (margin {REPORT_MARGIN_S}s)",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sigkill", type=int, default=50)
    ap.add_argument("--segfault", type=int, default=20)
    ap.add_argument("--leak-runs", type=int, default=20)
    ap.add_argument("--margin-runs", type=int, default=5)
    ap.add_argument("--only", choices=("attribution", "leak", "margin"), default=None)
    a = ap.parse_args()
    if a.only in (None, "attribution"):
        for isolate in (False, True):
            attribution("sigkill", a.sigkill, isolate)
            attribution("segfault", a.segfault, isolate)
    if a.only in (None, "leak"):
        leak(a.leak_runs)
    if a.only in (None, "margin"):
        margin(a.margin_runs, 6.0)


if __name__ == "__main__":
    main()
