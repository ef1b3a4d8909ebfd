"""Warm ranks put back what a call changed: the default device; the call's child processes are
ended and reported; threads it left are reported and their output kept out of later tests. No child
of a rank outlives a SIGKILLed pytest."""
import os
import re
import signal
import subprocess
import time

import pytest

from tests.ahead import ahead
from tests.conftest import Subpytest, processes_with_token

CASES = """
import os, subprocess, sys, threading, time, pytest, torch, torch.distributed as tdist

def set_meta():
    torch.set_default_device("meta")

def default_device():
    return str(torch.empty(1).device)

def start_children():
    if tdist.get_rank() != 1:
        return []
    a = subprocess.Popen(["sleep", "600"])
    b = subprocess.Popen(["sleep", "601"], start_new_session=True)   # left the rank's process group
    return [a.pid, b.pid]

def alive(pids):
    return [p for p in pids if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"]

COUNT = [0]

def chatter():
    while True:
        COUNT[0] += 1
        print("LEAKED-LINE", flush=True)
        time.sleep(0.01)

def start_thread():
    if tdist.get_rank() == 0:
        threading.Thread(target=chatter, name="chatter", daemon=True).start()

def wait_for_chatter():
    if tdist.get_rank() == 0:
        seen = COUNT[0]
        end = time.monotonic() + 30
        while COUNT[0] < seen + 5 and time.monotonic() < end:   # the thread printed 5 more lines
            time.sleep(0.01)
        return COUNT[0] - seen
    return 5

@pytest.mark.gpu2
def test_a_meta(dist):
    dist.run(set_meta)

@pytest.mark.gpu2
def test_b_device_is_back(dist):
    assert dist.run(default_device) == ["cpu", "cpu"]

@pytest.mark.gpu2
def test_c_children(dist):
    PIDS[:] = dist.run(start_children)[1]

PIDS = []

@pytest.mark.gpu2
def test_d_children_ended(dist):
    assert PIDS and dist.run(alive, PIDS) == [[], []]

@pytest.mark.gpu2
def test_e_thread(dist):
    dist.run(start_thread)

@pytest.mark.gpu2
def test_f_no_leaked_output(dist, capsys):
    assert min(dist.run(wait_for_chatter)) >= 5
    out = capsys.readouterr().out
    assert "LEAKED-LINE" not in out
"""


class _Dir:
    def __init__(self, path):
        self.path = path


@pytest.fixture(scope="module")
def sessions(lane):
    """The module's sessions (above), run ahead of its tests."""
    yield from lane.take(hygiene_sessions)


@pytest.fixture(scope="module")
def report(sessions):
    return sessions[0]


def outcome(out: str, test: str) -> str:
    return re.search(rf"^(PASSED|FAILED)\S* .*test_cases.py::{test}\b", out, re.M).group(1)


def test_default_device_is_put_back(report):
    assert outcome(report[1], "test_b_device_is_back") == "PASSED", report[1]


def test_children_are_ended_and_reported(report):
    out = report[1]
    assert outcome(out, "test_d_children_ended") == "PASSED", out
    assert "rank 1 left 2 child processes running: sleep 600; sleep 601; ended" in out


def test_leftover_thread_is_reported_and_its_output_kept_out(report):
    out = report[1]
    assert "rank 0 left 1 thread running: chatter (daemon)" in out
    assert outcome(out, "test_f_no_leaked_output") == "PASSED", out


LEAK = """
import os, subprocess, time, pytest, torch, torch.distributed as tdist
from torch.utils.data import DataLoader

def spawn_children(ready):
    it = iter(DataLoader(list(range(100)), batch_size=1, num_workers=2))
    next(it)
    subprocess.Popen(["sleep", "600"])
    subprocess.Popen(["sleep", "601"], start_new_session=True)
    tdist.barrier()
    if tdist.get_rank() == 0:
        open(ready, "w").close()
    time.sleep(600)

@pytest.mark.gpu2
def test_children(dist):
    dist.run(spawn_children, READY)
"""


MODES = {"warm": (), "isolate": ("--mgpu-isolate",)}


@ahead("sessions")
def hygiene_sessions(tmp_path_factory):
    """The session of CASES and the two killed ones (warm and fresh ranks), all three at once: the first
    runs to its end while each of the others is SIGKILLed once its ranks' children run. Returns the
    first's exit code and output, and what each killed one left running afterwards (or why it never
    got ready)."""
    cases = Subpytest(_Dir(tmp_path_factory.mktemp("hygiene")))
    (cases.pytester.path / "test_cases.py").write_text(CASES)
    first = cases.popen("--mgpu-fallback=cpu", "-p", "no:randomly", "-rA")
    started = {}
    for mode, extra in MODES.items():
        sp = Subpytest(_Dir(tmp_path_factory.mktemp(f"leak-{mode}")))
        ready = sp.pytester.path / "ready"
        (sp.pytester.path / "test_leak.py").write_text(LEAK.replace("READY", repr(str(ready))))
        started[mode] = (sp, ready, sp.popen("--mgpu-fallback=cpu", "-s", *extra))
    found = {}
    try:
        end = time.monotonic() + 180
        for mode, (sp, ready, p) in started.items():
            while not ready.exists() and p.poll() is None and time.monotonic() < end:
                time.sleep(0.1)
            if not ready.exists():
                found[mode] = p.communicate()[0] if p.poll() is not None else "the ranks never got ready"
                continue
            os.kill(p.pid, signal.SIGKILL)  # pytest alone: its ranks and their children must end themselves
            p.communicate()
        for mode, (sp, ready, p) in started.items():
            found.setdefault(mode, sp.leftovers(timeout=10))
        try:
            out, _ = first.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            raise AssertionError("the session of CASES did not end within 300s")
        return (first.returncode, out), found
    finally:
        for sp, _, p in [(cases, None, first), *started.values()]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
            for pid in processes_with_token(sp.token):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def killed(sessions):
    return sessions[1]


@pytest.mark.parametrize("mode", list(MODES))
def test_no_rank_child_outlives_a_killed_pytest(killed, mode):
    assert killed[mode] == []
