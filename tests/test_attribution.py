"""Which rank is to blame, decided by evidence (launch/attribution.py), the same with warm ranks and
with --mgpu-isolate; values and exceptions that cannot cross back are reported, never a death.

Each mode runs the cases in one pytest subprocess session, both at once and ahead of the tests
(tests/ahead.py); the tests read its report."""
import os
import re
import signal

import pytest

from tests.ahead import ahead
from tests.conftest import Subpytest, processes_with_token, run_together

CASES = """
import ctypes, os, signal, pytest, torch, torch.distributed as tdist

def die(how):
    if tdist.get_rank() == 0:
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        ctypes.string_at(0)
    t = torch.ones(1)
    tdist.all_reduce(t)          # ranks 1-3 wait here for rank 0
    return t

def return_early():
    if tdist.get_rank() == 0:
        return "skipped the collective"
    t = torch.ones(1)
    tdist.all_reduce(t)
    return t

class NeedsArg(Exception):
    def __init__(self, code, why):   # pickles (args=(why,)), cannot unpickle: __init__ needs two
        super().__init__(why)

class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")

def give_unreadable():
    return NeedsArg(3, "x") if tdist.get_rank() == 1 else "fine"

def raise_bad_str():
    if tdist.get_rank() == 1:
        raise BadStr()
    return "fine"

def give_meta():
    return torch.empty(3, device="meta")

def pid():
    return os.getpid()

PIDS = {}

@pytest.mark.gpu4
@pytest.mark.parametrize("how", ["sigkill", "segfault"])
def test_die(dist, how):
    dist.run(die, how)

@pytest.mark.gpu2
def test_return_early(dist):
    dist.run(return_early, timeout=5)  # seconds to spare for rank 1 to reach its collective at load 8

@pytest.mark.gpu2
def test_unreadable(dist):
    PIDS["before"] = dist.run(pid)
    dist.run(give_unreadable)

@pytest.mark.gpu2
def test_same_ranks_after_unreadable(dist):
    assert dist.run(pid) == PIDS["before"]

@pytest.mark.gpu2
def test_bad_str(dist):
    dist.run(raise_bad_str)

@pytest.mark.gpu2
def test_meta(dist):
    dist.run(give_meta)
"""


MODES = {"warm": (), "isolate": ("--mgpu-isolate",)}


@ahead("reports")
def mode_sessions(tmp_path_factory):
    """Each mode's session, both at once (run ahead of the tests): mode -> its output."""
    runs = []
    for mode, extra in MODES.items():
        sp = Subpytest(path=tmp_path_factory.mktemp(f"attribution-{mode}"))
        (sp.path / "test_cases.py").write_text(CASES)
        runs.append((sp, ("--mgpu-fallback=cpu", "-p", "no:randomly", "-rA", *extra)))
    try:
        return {mode: ended.out for mode, ended in zip(MODES, run_together(runs, timeout=300))}
    finally:
        for sp, _ in runs:
            for pid in processes_with_token(sp.token):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def reports(lane):
    yield from lane.take(mode_sessions)


@pytest.fixture(params=list(MODES))
def report(request, reports):
    """The session of one mode, with its own warm or fresh ranks (not this session's)."""
    return request.param, reports[request.param]


def section(out: str, test: str) -> str:
    """One test's failure section: up to the next test's header or the next summary banner (with
    CI=true pytest prints whole messages, of every test, in the short summary that follows)."""
    head = f"_ {test} _"
    start = out.index(head)
    ends = [i for i in (out.find("\n___", start + len(head)), out.find("\n===", start)) if i != -1]
    return out[start: min(ends, default=len(out))]


def headline(sec: str) -> str:
    return next(ln for ln in sec.splitlines() if "RankFailure:" in ln)


@pytest.mark.parametrize("how, signame", [("sigkill", "SIGKILL"), ("segfault", "SIGSEGV")])
def test_dead_rank_is_the_cause_and_peers_are_consequences(report, how, signame):
    mode, out = report
    sec = section(out, f"test_die[{how}]")
    head = headline(sec)
    assert head.endswith("rank(s) 0, 1, 2, 3; cause: rank(s) 0"), head  # rank order, one cause  # rank order, one cause
    died = re.search(r"rank 0 died: killed by " + signame + r".*", sec).group(0)
    assert "consequence" not in died
    for r in (1, 2, 3):  # each peer failed in the collective, or was stopped waiting in it
        line = re.search(rf"^E\s+rank {r} .*$", sec, re.M).group(0)
        assert "a consequence of another rank's failure" in line, line


def test_rank_that_returned_without_the_collective_is_named(report):
    mode, out = report
    sec = section(out, "test_return_early")
    assert headline(sec).endswith("cause: rank(s) 0")
    assert "rank 0 returned while rank(s) 1 were still inside a collective" in sec
    line = re.search(r"^E\s+rank 1 .*$", sec, re.M).group(0)
    assert "a consequence" in line, line


def test_unreadable_value_names_rank_and_type_and_keeps_the_ranks(report):
    mode, out = report
    sec = section(out, "test_unreadable")
    assert "rank 1 returned a test_cases.NeedsArg that cannot be rebuilt in the test process" in sec
    assert "TypeError" in sec and "died" not in sec and "collect.py" not in sec
    if mode == "warm":  # the ranks are fine: the same warm ranks serve the next test
        assert re.search(r"PASSED.* test_cases.py::test_same_ranks_after_unreadable", out)


def test_exception_whose_str_raises_is_reported_by_type_not_as_a_death(report):
    mode, out = report
    sec = section(out, "test_bad_str")
    assert "rank 1 raised test_cases.BadStr: <BadStr object: its __str__ raised RuntimeError: no str for you>" in sec
    assert "died" not in sec
    assert "in raise_bad_str" in sec  # its traceback


def test_meta_tensor_value_is_reported_without_the_plugins_frames(report):
    mode, out = report
    sec = section(out, "test_meta")
    assert "could not be copied to the CPU" in sec and "meta" in sec
    assert "pytest_mgpu/" not in sec and "_to_cpu" not in sec and "_pytree" not in sec  # no frames of ours
