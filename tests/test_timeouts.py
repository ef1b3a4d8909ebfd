"""Limits: every source of a limit is validated and named; pytest-mgpu's report beats pytest-timeout,
also on a cold pool and with --timeout-method=thread (which would end the whole session).

Margins that hold at load 8 on 2 cores: the ranks start before the call's clock (and before
pytest-timeout's), pytest is preloaded in the forkserver, and the functions live in a module that imports
nothing slow, so every rank is inside its function within a fraction of a second; the limits (3 and
3.5 s) leave seconds for that, and stay under the cut that pytest-timeout's 8 s forces (5 s)."""
import os
import signal

import pytest

from tests.ahead import ahead
from tests.conftest import Subpytest, run_together

BAD = ["'x'", "'5'", "float('nan')", "float('inf')", "0", "-1"]


@pytest.mark.parametrize("value", BAD)
def test_bad_dist_run_timeout_is_refused_naming_its_source(pytester, value):
    pytester.makepyfile(f"""
import pytest

def noop():
    return 1

@pytest.mark.gpu2
def test_t(dist):
    dist.run(noop, timeout={value})
""")
    result = pytester.runpytest("--mgpu-fallback=cpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*dist.run(timeout=...) must be a * number of seconds, got *"])
    assert "OverflowError" not in result.stdout.str() and "while joining" not in result.stdout.str()


@pytest.mark.parametrize("value", ["x", "nan", "inf", "0", "-1"])
def test_bad_mgpu_timeout_option_is_a_usage_error(pytester, value):
    pytester.makepyfile("def test_t():\n    pass\n")
    result = pytester.runpytest(f"--mgpu-timeout={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mgpu-timeout must be a * number of seconds, got*"])


@pytest.mark.parametrize("value", ["x", "nan", "inf", "0"])
def test_bad_ini_mgpu_timeout_is_a_usage_error_naming_the_ini(pytester, value):
    pytester.makeini(f"[pytest]\nmgpu_timeout = {value}\n")
    pytester.makepyfile("def test_t():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini mgpu_timeout must be a * number of seconds, got*"])


def test_bad_mgpu_timeout_marker_fails_the_test_naming_the_marker(pytester):
    pytester.makepyfile("""
import pytest

@pytest.mark.gpu2
@pytest.mark.mgpu_timeout("5")
def test_t(dist):
    pass
""")
    result = pytester.runpytest("--mgpu-fallback=cpu", "--strict-markers")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.mgpu_timeout must be a positive, finite number of seconds, got str '5'*"])


HANG_FNS = """
import time, torch.distributed as tdist

def hang():
    if tdist.get_rank() == 0:
        time.sleep(600)
    tdist.barrier()

def ok():
    return tdist.get_rank()
"""

HANGS = """
import pytest
from hang_fns import hang, ok

@pytest.mark.gpu2
@pytest.mark.mgpu_timeout(3)
def test_marker(dist):
    dist.run(hang)

@pytest.mark.gpu2
@pytest.mark.mgpu_timeout(60)
def test_call_beats_marker(dist):
    dist.run(hang, timeout=3.5)

@pytest.mark.gpu4
def test_cold_pool(dist):
    dist.run(hang, timeout=60)

@pytest.mark.gpu4
def test_after(dist):
    assert dist.run(ok) == [0, 1, 2, 3]
"""


class _Dir:
    def __init__(self, path):
        self.path = path


METHODS = ["thread", "signal"]


@ahead("hangs")
def hang_sessions(tmp_path_factory):
    """One session per --timeout-method, both at once (their hangs wait side by side). The 4-rank pool
    is cold when test_cold_pool starts, and pytest-timeout's limit (8 s) is short."""
    runs = []
    for method in METHODS:
        sp = Subpytest(_Dir(tmp_path_factory.mktemp(f"hangs-{method}")))
        (sp.pytester.path / "test_hangs.py").write_text(HANGS)
        (sp.pytester.path / "hang_fns.py").write_text(HANG_FNS)
        runs.append((sp, ("--mgpu-fallback=cpu", "-p", "no:randomly", "-rA", "--timeout=8",
                          f"--timeout-method={method}")))
    try:
        return dict(zip(METHODS, run_together(runs, timeout=300)))
    finally:
        for sp, _ in runs:
            for p in sp.leftovers(timeout=10):
                os.kill(p, signal.SIGKILL)


@pytest.fixture(scope="module")
def hangs(lane):
    """The module's sessions (above), run ahead of its tests."""
    yield from lane.take(hang_sessions)


@pytest.fixture(params=METHODS)
def hung(request, hangs):
    return hangs[request.param].rc, hangs[request.param].out


def test_the_limit_that_fired_is_named_marker_then_call(hung):
    rc, out = hung
    assert "rank 0 did not finish within 3s (hung; the limit set by @pytest.mark.mgpu_timeout(3))" in out
    assert "rank 0 did not finish within 3.5s (hung; the limit set by dist.run(timeout=3.5))" in out


def test_our_report_beats_pytest_timeout_on_a_cold_pool_and_the_session_goes_on(hung):
    rc, out = hung
    assert "+ Timeout +" not in out and "Failed: Timeout" not in out, out
    assert "stopped before pytest-timeout's limit of 8s (--timeout / ini timeout)" in out, out
    assert "raise pytest-timeout's limit (--timeout, or @pytest.mark.timeout)" in out
    assert "3 failed, 1 passed" in out, out  # --timeout-method=thread did not end the session
