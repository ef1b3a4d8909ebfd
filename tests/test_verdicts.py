"""Slow is not hung, and desynchronized collectives are named (issue 18 items 1 and 2), on 4 real gloo
ranks: a rank still computing at its limit, a rank blocked, a pool still starting, and ranks whose
collectives disagree (another collective, one never reached, other sizes), warm and fresh.

The warm cases run in two pytest subprocesses and the fresh ones in a third, all at once (most of
their time is waiting out limits); the tests read their reports. The margins hold on a loaded
2-core machine: each call gets 5 s and the evidence is read over its last 2 s, while the ranks reach the
test's function within a fraction of a second (the pool is started before the call's clock, pytest is
preloaded in the forkserver, the functions live in a module that imports nothing slow); a computing rank
gets at least a fifth of a core at load 8 (0.4 s of CPU in 2 s) against a line of 0.05 s, and the computing
ranks here use a quarter of a core (10 ms of every 40 ms: 0.5 s in 2 s quiet; what their verdicts read is the
same, at a quarter of the CPU); a blocked one uses none.
"""
import os
import signal

import pytest

from tests.ahead import ahead
from tests.conftest import Subpytest, run_together

FNS = """
import time, torch, torch.distributed as tdist

def compute(seconds):                # a quarter of a core: computing, as a rank on a busy machine gets
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        burst = time.monotonic() + 0.01
        while time.monotonic() < burst:
            pass
        time.sleep(0.03)

def spin():                          # rank 0 computes in Python past the limit; the others wait for it
    if tdist.get_rank() == 0:
        compute(600)
    tdist.barrier()

def block():                         # rank 0 blocks outside any collective; the others wait for it
    if tdist.get_rank() == 0:
        time.sleep(600)
    tdist.barrier()

def other_collective():              # collective #4: rank 1 broadcasts, the others all-gather
    t = torch.ones(4)
    for _ in range(3):
        tdist.all_reduce(t)
    if tdist.get_rank() == 1:
        tdist.broadcast(t, 0)
    else:
        tdist.all_gather([torch.empty(4) for _ in range(4)], t)

def never_reached():                 # rank 3 leaves after 6 collectives; ranks 0-2 enter a 7th
    t = torch.ones(4)
    for _ in range(6):
        tdist.all_reduce(t)
    if tdist.get_rank() != 3:
        tdist.all_reduce(t)

def other_sizes():                   # collective #4: rank 2 all-reduces 3 numbers, the others 4
    t = torch.ones(4)
    for _ in range(3):
        tdist.all_reduce(t)
    tdist.all_reduce(torch.ones(3 if tdist.get_rank() == 2 else 4))

def ranks():
    return tdist.get_rank()

def five():                          # a call before: the recorder keeps its entries, numbers restart per call
    for _ in range(5):
        tdist.all_reduce(torch.ones(2))

def backward_forever():              # one process training past its limit, as a slow pipeline benchmark did
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    x = torch.randn(64, 256)
    while True:
        model(x).sum().backward()
"""

SLOW_IMPORT = """
import time
from pytest_mgpu import in_rank

if in_rank():                        # a module whose import never finishes in a rank
    time.sleep(600)

def noop():
    return 1
"""

LATE_START = """
import time
from pytest_mgpu import in_rank

if in_rank():                        # a module whose import computes for 3.5 s in a rank: into the last 2 s
    end = time.monotonic() + 3.5     # (a quarter of a core, as a rank on a busy machine gets)
    while time.monotonic() < end:
        burst = time.monotonic() + 0.01
        while time.monotonic() < burst:
            pass
        time.sleep(0.03)

def block():
    time.sleep(600)
"""

TESTS = """
import pytest
import verdict_fns as F
import slow_import
import late_start

@pytest.mark.gpu4
@pytest.mark.mgpu_timeout(5)
def test_computing(dist):
    dist.run(F.spin)

@pytest.mark.gpu4
def test_blocked(dist):
    dist.run(F.block, timeout=5)

@pytest.mark.gpu4
def test_starting(dist):
    dist.run(slow_import.noop, timeout=5)

@pytest.mark.gpu2
def test_late_start(dist):
    dist.run(late_start.block, timeout=5)

@pytest.mark.gpu2
def test_single_process(dist):
    dist.run_single(F.backward_forever, timeout=5)

@pytest.mark.gpu4
@pytest.mark.parametrize("case", ["other_collective", "never_reached", "other_sizes"])
def test_desync(dist, case):
    dist.run(F.five)
    dist.run(getattr(F, case), timeout=5)

@pytest.mark.gpu4
def test_after(dist):
    assert dist.run(F.ranks) == [0, 1, 2, 3]
"""


class _Dir:
    def __init__(self, path):
        self.path = path


def _prepare(tmp_path_factory, *extra) -> tuple:
    sp = Subpytest(_Dir(tmp_path_factory.mktemp("verdicts")))
    for name, text in [("verdict_fns", FNS), ("slow_import", SLOW_IMPORT), ("late_start", LATE_START),
                       ("test_verdicts_inner", TESTS)]:
        (sp.pytester.path / f"{name}.py").write_text(text)
    return sp, ("--mgpu-fallback=cpu", "-p", "no:randomly", "-rA", *extra)


# the warm cases in two sessions, each ending with test_after (its pool still serves): the cases that
# compute (a spinning rank, backward, a computing import) fall at different times in the two
WARM = ("computing or starting or single_process or other_collective or after",
        "blocked or late_start or never_reached or other_sizes or after")
NEXT_SESSION = "\n___ (the next session) ___\n"  # ends the last section of a session (see section())


@ahead("sessions")
def verdict_sessions(tmp_path_factory):
    """Both modes at once, the warm one in two sessions (the fresh session's few cases run while the warm
    ones wait out their limits); fresh ranks that return exit at once: their records come back with
    their results."""
    runs = [*(_prepare(tmp_path_factory, "-k", selected) for selected in WARM),
            _prepare(tmp_path_factory, "--mgpu-isolate", "-k", "desync or after")]
    try:
        return run_together(runs, timeout=400)
    finally:
        for sp, _ in runs:
            for p in sp.leftovers(timeout=10):
                os.kill(p, signal.SIGKILL)


@pytest.fixture(scope="module")
def sessions(lane):
    """The module's sessions (above), run ahead of its tests."""
    yield from lane.take(verdict_sessions)


@pytest.fixture(scope="module")
def warm(sessions):
    return [s.rc for s in sessions[:2]], NEXT_SESSION.join(s.out for s in sessions[:2])


@pytest.fixture(scope="module")
def fresh(sessions):
    return sessions[2].rc, sessions[2].out


def section(out: str, test: str) -> str:
    head = f"_ {test} _"
    start = out.index(head)
    nxt = out.find("\n___", start + len(head))
    return out[start: nxt if nxt != -1 else len(out)]


def line(sec: str, start: str) -> str:
    """The report line of one rank (``E   rank 0 ...``), without pytest's prefix."""
    for row in sec.splitlines():
        text = row[1:].strip() if row.startswith("E ") else row.strip()
        if text.startswith(start):
            return text
    raise AssertionError(f"no line starting {start!r} in:\n{sec}")


def test_every_case_fails_and_the_pool_serves_the_next_test(sessions, fresh):
    for s in sessions[:2]:  # the warm cases: 8 between the two sessions
        assert s.rc == 1 and "4 failed, 1 passed" in s.out, s.out
    assert fresh[0] == 1 and "3 failed, 1 passed" in fresh[1], fresh[1]


def test_a_rank_computing_past_its_limit_is_still_computing_not_hung(warm):
    sec = section(warm[1], "test_computing")
    rank0 = line(sec, "rank 0 ")
    assert rank0.startswith("rank 0 is still computing after 5s (the limit set by @pytest.mark.mgpu_timeout(5)): "
                            "it used "), rank0
    assert "s of CPU in the last " in rank0 and "so it is slow, not hung" in rank0 and "(hung;" not in rank0
    assert "failed (still computing)" in sec and "cause: rank(s) 0" in sec
    # the hint names the setting that gave the limit, and says nothing about a deadlock
    assert "raise the limit where it was set: @pytest.mark.mgpu_timeout(5) on the test" in sec
    assert "Hint: rank 0 was still computing when the limit came" in sec
    assert "Hint: a rank blocked in a collective" not in sec and "disagree (flight recorder)" not in sec
    for r in (1, 2, 3):  # they wait for rank 0 in the barrier: consequences
        assert "blocked in collective #1 (barrier)" in line(sec, f"rank {r} "), sec


def test_one_process_computing_in_backward_is_still_computing(warm):
    sec = section(warm[1], "test_single_process")
    assert line(sec, "rank 0 ").startswith(
        "rank 0 is still computing after 5s (the limit set by dist.run(timeout=5)): it used "), sec
    assert "in backward" in sec and "(hung;" not in sec
    assert "raise the limit where it was set: dist.run(timeout=5) in the test" in sec


def test_a_blocked_rank_is_hung_and_its_peers_wait_in_a_named_collective(warm):
    sec = section(warm[1], "test_blocked")
    assert line(sec, "rank 0 ").startswith(
        "rank 0 did not finish within 5s (hung; the limit set by dist.run(timeout=5)): blocked outside any "
        "collective, "), sec
    for r in (1, 2, 3):
        assert line(sec, f"rank {r} ").startswith(
            f"rank {r} did not finish within 5s (hung; the limit set by dist.run(timeout=5)): blocked in "
            "collective #1 (barrier), "), sec
    assert "Hint: a rank blocked in a collective usually means the ranks disagree" in sec
    assert "If the work is just slow, raise the limit where it was set: dist.run(timeout=5) in the test" in sec
    assert "still computing" not in sec


def test_a_rank_that_computed_while_starting_then_blocks_is_hung(warm):
    """Its module's import computed into the last 2 s before the limit: that CPU was start-up, not the
    function's, so the window is taken again from the dump on (the function began inside it)."""
    sec = section(warm[1], "test_late_start")
    for r in (0, 1):
        assert line(sec, f"rank {r} ").startswith(
            f"rank {r} did not finish within 5s (hung; the limit set by dist.run(timeout=5)): blocked outside any "
            "collective, "), sec
    assert "still computing" not in sec and "still starting" not in sec


def test_a_pool_that_never_finishes_starting_is_still_starting(warm):
    sec = section(warm[1], "test_starting")
    for r in range(4):
        assert line(sec, f"rank {r} ").startswith(
            f"rank {r} was still starting after 5s (the limit set by dist.run(timeout=5)): it had not begun the "
            "test's function (still importing its module)"), sec
    assert "failed (still starting)" in sec and "nothing hung" in sec and "(hung;" not in sec
    assert "Hint: a rank blocked in a collective" not in sec


DESYNC = {
    "other_collective": "collective #4: rank 1 entered broadcast, ranks 0, 2, 3 entered all_gather",
    "never_reached": "rank 3 never reached collective #7 (all_reduce) that ranks 0-2 entered; its last was #6",
    "other_sizes": "collective #4: rank 2 entered all_reduce with sizes [[3]], ranks 0, 1, 3 entered all_reduce "
                   "with sizes [[4]]",
}


@pytest.mark.parametrize("mode", ["warm", "fresh"])
@pytest.mark.parametrize("case", sorted(DESYNC))
def test_the_first_collective_the_ranks_disagree_on_is_named(request, mode, case):
    sec = section(request.getfixturevalue(mode)[1], f"test_desync[{case}]")
    assert f"the ranks' collectives disagree (flight recorder): {DESYNC[case]}\n" in sec, sec
