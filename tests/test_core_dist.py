"""dist.run: values in rank order, tensors on CPU, rank_device, seeding, output capture, bad input."""
import pytest

BODY = """
import os, random, pytest, torch, torch.distributed as tdist
from pytest_mgpu import rank_device, rank_context

def allreduce(scale):
    t = torch.full((3,), float(tdist.get_rank() + 1)) * scale
    tdist.all_reduce(t)
    print(f"reduced {t.tolist()}")
    return {"rank": tdist.get_rank(), "sum": t, "device": str(rank_device())}

def draws():
    return torch.rand(4), random.random(), rank_context().seed

def env():
    return {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}

def nothing():
    return None
"""


def test_four_rank_allreduce_values_in_rank_order(pytester):
    pytester.makepyfile(
        BODY
        + """
@pytest.mark.gpu4
def test_it(dist):
    out = dist.run(allreduce, 2.0)
    assert [o["rank"] for o in out] == [0, 1, 2, 3]
    for o in out:
        assert o["sum"].device.type == "cpu"
        assert torch.equal(o["sum"], torch.full((3,), 20.0))
        assert o["device"] == ("cpu" if dist.emulated else f"cuda:{o['rank']}")
"""
    )
    result = pytester.runpytest("--mgpu-fallback=cpu", "-rP")
    result.assert_outcomes(passed=1)
    # each rank's output is captured and shown under its name
    result.stdout.fnmatch_lines(["*[[]rank 0[]] reduced [[]20.0, 20.0, 20.0[]]*", "*[[]rank 3[]] reduced*"])


def test_ranks_are_seeded_alike_unless_asked(pytester):
    pytester.makepyfile(
        BODY
        + """
@pytest.mark.gpu2
def test_same(dist):
    (a, ra, sa), (b, rb, sb) = dist.run(draws)
    assert torch.equal(a, b) and ra == rb and sa == sb == 0

@pytest.mark.gpu2
def test_seed_option(dist):
    first = dist.run(draws)[0]
    dist.seed = 1234
    again = dist.run(draws)[0]
    assert not torch.equal(first[0], again[0]) and again[2] == 1234

@pytest.mark.gpu2
def test_per_rank(dist):
    dist.per_rank_seed = True
    (a, ra, _), (b, rb, _) = dist.run(draws)
    assert not torch.equal(a, b) and ra != rb
"""
    )
    pytester.runpytest("--mgpu-fallback=cpu").assert_outcomes(passed=3)


def test_global_seed_option(pytester):
    pytester.makepyfile(
        BODY
        + """
@pytest.mark.gpu1
def test_seed(dist):
    assert dist.run(draws)[0][2] == 77
"""
    )
    pytester.runpytest("--mgpu-fallback=cpu", "--mgpu-seed=77").assert_outcomes(passed=1)


def test_torchrun_style_environment_and_no_fixed_port(pytester):
    pytester.makepyfile(
        BODY
        + """
@pytest.mark.gpu2
def test_env(dist):
    a, b = dist.run(env)
    assert (a["RANK"], b["RANK"]) == ("0", "1") and a["WORLD_SIZE"] == "2"
    assert a["MASTER_PORT"] == b["MASTER_PORT"] and a["MASTER_PORT"] not in ("29500", "12355")
"""
    )
    pytester.runpytest("--mgpu-fallback=cpu").assert_outcomes(passed=1)


def test_importlib_mode_and_none_results(pytester):
    pytester.makepyfile(
        BODY
        + """
@pytest.mark.gpu2
def test_none(dist):
    assert dist.run(nothing) == [None, None]
"""
    )
    pytester.runpytest("--mgpu-fallback=cpu", "--import-mode=importlib").assert_outcomes(passed=1)


def test_closures_travel_by_value_and_what_cannot_is_named(pytester):
    """Nested functions, lambdas and partials of them reach warm ranks with what they capture (the
    module-level helper they call by reference); a capture that cannot be pickled is named."""
    pytester.makepyfile(
        """
import functools, threading
import pytest
import torch.distributed as td

def helper(x):
    return 10 * x

@pytest.mark.gpu2
def test_closures(dist):
    k = 3
    def inner(y):
        return helper(y) + k + td.get_rank()
    assert dist.run(inner, 1) == [13, 14]
    assert dist.run(lambda: k * td.get_world_size()) == [6, 6]
    assert dist.run(functools.partial(inner, 2)) == [23, 24]
    assert dist.run(print, "plain builtins still travel by name") == [None, None]

@pytest.mark.gpu2
def test_lock(dist):
    lock = threading.Lock()
    def step():
        with lock:
            return 1
    dist.run(lambda: step())
"""
    )
    result = pytester.runpytest("--mgpu-fallback=cpu")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*dist.run cannot send 'test_lock.<locals>.<lambda>' to the ranks: it captures `step.lock`*"
         "(_thread.lock), which cannot be pickled*"])


def test_unpicklable_argument_is_named(pytester):
    pytester.makepyfile(
        """
import threading, pytest

def work(x, lock=None):
    return x

@pytest.mark.gpu2
def test_lock(dist):
    dist.run(work, 1, lock=threading.Lock())
"""
    )
    result = pytester.runpytest("--mgpu-fallback=cpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot send keyword argument 'lock' (lock) of work to the ranks*"])


def test_unpicklable_return_value_names_the_rank(pytester):
    pytester.makepyfile(
        """
import threading, pytest

def give_lock():
    return threading.Lock()

@pytest.mark.gpu2
def test_ret(dist):
    dist.run(give_lock)
"""
    )
    result = pytester.runpytest("--mgpu-fallback=cpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the value returned by rank 0 (_thread.lock) cannot be pickled*"])


def test_rank_device_outside_a_rank_says_where_it_works():
    from pytest_mgpu import rank_device

    with pytest.raises(RuntimeError, match="only work inside a function run by dist.run"):
        rank_device()


def test_summary_reports_startup_cost(pytester):
    pytester.makepyfile(
        BODY
        + """
@pytest.mark.gpu2
def test_a(dist):
    dist.run(nothing); dist.run(nothing)
"""
    )
    result = pytester.runpytest("--mgpu-fallback=cpu")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*pytest-mgpu*", "*1 distributed test(s), 2 call(s)*rank start-up per call: median * ms*"])
