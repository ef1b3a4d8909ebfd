"""The simulated tier inside pytest sessions: the marker, the limits a simulate() call inherits (as a
dist.run does), a hang ended with nothing left running, the seed option, the session's table."""
import pytest

from tests.conftest import Subpytest, wait_for_no_processes

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


@pytest.mark.parametrize("how, args, said", [
    ("marker", (), "within 2s (hung; the limit set by @pytest.mark.mgpu_timeout(2))"),
    ("option", ("--mgpu-timeout=2",), "within 2s (hung; the limit set by --mgpu-timeout=2)"),
    ("argument", ("--mgpu-timeout=300",), "within 2s (hung; the limit set by simulate(timeout=2))"),
    ("pytest-timeout", ("--timeout=6",), "(hung; stopped before pytest-timeout's limit of 6s (--timeout / ini"),
])
def test_a_hang_ends_at_the_limit_dist_run_would_get_with_nothing_left(pytester, how, args, said):
    call = "simulate(hang, world_size=512, rank=9" + (", timeout=2)" if how == "argument" else ")")
    marker = "@pytest.mark.mgpu_timeout(2)\n" if how == "marker" else "@pytest.mark.simulate\n"
    pytester.makepyfile(FNS + f"""
{marker}def test_hang():
    {call}
""")
    run = Subpytest(pytester)
    code, out = run.run(*args)
    assert code == 1, out
    assert "1 rank(s) failed (hung) in test_" in out and "[simulated rank 9 of 512, fake process group on cpu]" in out
    assert "rank 9 did not finish " in out and said in out, out
    assert "in hang" in out, "the hung rank's Python stack"
    assert "the fake process group's collectives return at once" in out
    assert wait_for_no_processes(run.token) == []


def test_a_malformed_timeout_marker_is_said_by_simulate(pytester):
    pytester.makepyfile(FNS + """
@pytest.mark.mgpu_timeout("5")
def test_t():
    simulate(world, world_size=2)
""")
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.mgpu_timeout must be a positive, finite number of seconds, got str '5'*"])
