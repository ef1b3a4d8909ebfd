"""The simulated tier inside pytest sessions: the marker, the limits a simulate() call inherits (as a
dist.run does), a hang ended with nothing left running, the seed option, the session's table."""
import pytest

from tests.ahead import ahead
from tests.conftest import Subpytest, run_together, wait_for_no_processes

pytestmark = pytest.mark.simulate

FNS = """
import time, pytest, torch, torch.distributed as tdist
from pytest_mgpu import simulate

def world():
    return tdist.get_world_size(), torch.randn(2)

def hang():
    tdist.all_reduce(torch.ones(4))  # returns at once: the fake group never blocks
    while True:
        time.sleep(0.05)
"""


def test_the_simulate_marker_selects_and_deselects(pytester):
    pytester.makepyfile(FNS + """
@pytest.mark.simulate
def test_sim():
    assert simulate(world, world_size=1024).value[0] == 1024

def test_plain():
    pass
""")
    selected = pytester.runpytest("--strict-markers", "-m", "simulate", "-v")
    selected.assert_outcomes(passed=1, deselected=1)
    selected.stdout.fnmatch_lines(["*test_sim PASSED*"])
    kept_out = pytester.runpytest("--strict-markers", "-m", "not simulate", "-v")
    kept_out.assert_outcomes(passed=1, deselected=1)
    kept_out.stdout.fnmatch_lines(["*test_plain PASSED*"])
    assert "pytest-mgpu simulations" not in kept_out.stdout.str()


def test_a_gpu_marker_beyond_16_is_still_an_error(pytester):
    pytester.makepyfile("""
import pytest

@pytest.mark.gpu1024
def test_t(dist):
    pass
""")
    by_expression = pytester.runpytest("-m", "simulate or gpu1024")
    assert by_expression.ret == pytest.ExitCode.USAGE_ERROR
    by_expression.stderr.fnmatch_lines(["*gpu1024 is not a world size pytest-mgpu knows*"])
    by_marker = pytester.runpytest("--mgpu-fallback=cpu")
    by_marker.assert_outcomes(errors=1)
    by_marker.stdout.fnmatch_lines(["*gpu1024 is not a world size pytest-mgpu knows; its markers are gpu1, gpu2*"])


def test_the_session_table_and_the_seed_option(pytester):
    pytester.makepyfile(FNS + """
def test_sim():
    sim = simulate(world, world_size=64, rank=63)
    assert torch.equal(sim.value[1], torch.randn(2, generator=torch.Generator().manual_seed(7)))
""")
    result = pytester.runpytest("--mgpu-seed=7")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= pytest-mgpu simulations =*", "*test_sim*world*64*63*",
                                 "*per simulated rank: sent = bytes it sends*"])


HANGS = """
@pytest.mark.mgpu_timeout(2)
def test_marker():
    simulate(hang, world_size=512, rank=9)

@pytest.mark.simulate
def test_option():
    simulate(hang, world_size=512, rank=9)

@pytest.mark.simulate
@pytest.mark.mgpu_timeout(300)
def test_argument():
    simulate(hang, world_size=512, rank=9, timeout=2)

@pytest.mark.mgpu_timeout(2)
def test_slow_import():
    import slowstart
    assert simulate(slowstart.quick, world_size=8).value == 8
"""
SLOW_IMPORT = """
import time, torch.distributed as tdist

if tdist.is_initialized():  # in the simulated rank, whose fake group is up before this module is imported
    time.sleep(2.5)

def quick():
    return tdist.get_world_size()
"""
OUTER = """
@pytest.mark.simulate
def test_pytest_timeout():
    simulate(hang, world_size=512, rank=9)
"""


class _Dir:
    def __init__(self, path):
        self.path = path


@ahead("hangs")
def hang_sessions(tmp_path_factory):
    """Two sessions at once (their hangs wait side by side): the limits of pytest-mgpu, where a marker
    (2 s) and a call's argument (2 s, under a marker of 300 s) each beat the option (3 s) that the
    third test gets; and pytest-timeout's limit (6 s) with none of ours. Each session's output, and
    the processes its token finds once it ended."""
    runs = []
    for name, tests, args in [("limits", HANGS, ("--mgpu-timeout=3",)), ("outer", OUTER, ("--timeout=6",))]:
        sp = Subpytest(_Dir(tmp_path_factory.mktemp(name)))
        (sp.pytester.path / f"test_{name}.py").write_text(FNS + tests)
        (sp.pytester.path / "slowstart.py").write_text(SLOW_IMPORT)
        runs.append((sp, ("-p", "no:randomly", "-rA", *args)))
    done = run_together(runs, timeout=300)
    return {name: (e.rc, e.out, wait_for_no_processes(sp.token))
            for name, (sp, _), e in zip(["limits", "outer"], runs, done)}


@pytest.fixture(scope="module")
def hangs(lane):
    """The module's sessions (above), run ahead of its tests."""
    yield from lane.take(hang_sessions)


def section(out: str, test: str) -> str:
    """One test's failure section of a ``-rA`` report."""
    head = f"_ {test} _"
    start = out.index(head)
    nxt = out.find("\n___", start + len(head))
    return out[start: nxt if nxt != -1 else len(out)]


@pytest.mark.parametrize("session, test, said", [
    ("limits", "marker", "within 2s (hung; the limit set by @pytest.mark.mgpu_timeout(2))"),
    ("limits", "option", "within 3s (hung; the limit set by --mgpu-timeout=3)"),
    ("limits", "argument", "within 2s (hung; the limit set by simulate(timeout=2))"),
    ("outer", "pytest_timeout", "(hung; stopped before pytest-timeout's limit of 6s (--timeout / ini"),
])
def test_a_hang_ends_at_the_limit_dist_run_would_get_with_nothing_left(hangs, session, test, said):
    code, out, left = hangs[session]
    assert code == 1 and f"{3 if session == 'limits' else 1} failed" in out, out
    sec = section(out, f"test_{test}")
    assert f"1 rank(s) failed (hung) in test_{session}.py::test_{test} " in sec and "[simulated rank 9 of 512, fake process group on cpu]" in sec
    assert "rank 9 did not finish " in sec and said in sec, sec
    assert "in hang" in sec, f"the hung rank's Python stack:\n{sec}"
    assert "the fake process group's collectives return at once" in sec
    assert left == []


def test_a_slow_import_in_the_rank_is_not_charged_to_the_limit(hangs):
    code, out, left = hangs["limits"]
    assert "PASSED test_limits.py::test_slow_import" in out, out


def test_a_malformed_timeout_marker_is_said_by_simulate(pytester):
    pytester.makepyfile(FNS + """
@pytest.mark.mgpu_timeout("5")
def test_t():
    simulate(world, world_size=2)
""")
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.mgpu_timeout must be a positive, finite number of seconds, got str '5'*"])
