"""Run a command beside N CPU-burning processes, as on a shared CI runner, and say how loaded it was.

    python benchmarks/load.py --procs 6 -- python -m pytest tests/test_timeouts.py -p no:cacheprovider
    python benchmarks/load.py --procs 6 --seconds 60          # only burn, for 60 s

Each burner is a Python process spinning in a loop (one core's worth of runnable work each: 6 burners on
2 cores put the load average near 8 with the command's own processes). Their lifetime is bounded twice:
each ends itself at its deadline (``--max-seconds``), and each dies with this script (PR_SET_PDEATHSIG),
which also kills them on exit, Ctrl-C or SIGTERM. The command's exit code is this script's; the load
average seen during the run (1-minute figure, sampled every 5 s) is printed to stderr at the end.

Prints; asserts nothing.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

BURN = """
import sys, time
end = float(sys.argv[1])
x = 0
while time.time() < end:
    for _ in range(100000):
        x += 1
"""


def _die_with_parent() -> None:
    """In the burner, before exec: SIGKILL when this script is gone, however it ended (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def start_burners(n: int, max_seconds: float) -> list:
    end = time.time() + max_seconds
    return [subprocess.Popen([sys.executable, "-c", BURN, str(end)], preexec_fn=_die_with_parent,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(n)]


def stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass


class LoadSampler(threading.Thread):
    """The 1-minute load average every ``every`` seconds, while the command runs."""

    def __init__(self, every: float = 5.0):
        super().__init__(daemon=True, name="load-sampler")
        self.every, self.samples = every, []
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def finish(self) -> str:
        self._stop.set()
        s = self.samples or [os.getloadavg()[0]]
        return f"load average (1 min) min {min(s):.1f}, median {statistics.median(s):.1f}, max {max(s):.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=6, help="CPU-burning processes (default 6)")
    ap.add_argument("--max-seconds", type=float, default=3600.0,
                    help="no burner outlives this, whatever happens to this script (default 3600)")
    ap.add_argument("--seconds", type=float, default=None, help="without a command: burn this long")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run under load")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command and args.seconds is None:
        ap.error("give a command after --, or --seconds")
    burners = start_burners(args.procs, args.max_seconds if command else min(args.max_seconds, args.seconds))
    sampler = LoadSampler()
    sampler.start()
    child = None

    def forward(signum, frame):
        if child is not None and child.poll() is None:
            child.send_signal(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, forward)
    t0 = time.monotonic()
    rc = 0
    try:
        if command:
            child = subprocess.Popen(command)
            rc = child.wait()
        else:
            time.sleep(args.seconds)
    except KeyboardInterrupt:
        rc = 130
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
    finally:
        stop(burners)
    what = f"command exited {rc}" if command else "burned"
    print(f"load.py: {args.procs} burner(s); {what} after {time.monotonic() - t0:.1f} s; {sampler.finish()}",
          file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
