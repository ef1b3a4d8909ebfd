"""Warm ranks: reused across tests, yet every test starts as a fresh rank would; any failure
rebuilds the pool; the opt-out gives fresh processes."""
import os

import pytest

from pytest_mgpu import world_sizes
from tests.ahead import ahead
from tests.conftest import Subpytest, one_session

STATE = """
import os, random, pytest, torch, torch.distributed as tdist

def pid():
    return os.getpid()

def dirty():
    drawn = torch.rand(3)
    torch.set_default_dtype(torch.float64)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True)
    torch.set_float32_matmul_precision("medium")
    torch.set_grad_enabled(False)
    os.environ["LEFT_BEHIND"] = "1"
    os.chdir("/")
    sub = tdist.new_group([0])
    return os.getpid(), drawn

def look():
    return dict(
        pid=os.getpid(),
        dtype=str(torch.get_default_dtype()),
        benchmark=torch.backends.cudnn.benchmark,
        deterministic=torch.backends.cudnn.deterministic,
        algos=torch.are_deterministic_algorithms_enabled(),
        precision=torch.get_float32_matmul_precision(),
        grad=torch.is_grad_enabled(),
        env=os.environ.get("LEFT_BEHIND"),
        cwd=os.getcwd(),
        groups=len(tdist.distributed_c10d._world.pg_map),
        rand=torch.rand(3),
        pyrand=random.random(),
        world=tdist.get_world_size(),
    )

def destroy():
    tdist.destroy_process_group()
    return os.getpid()

def allreduce():
    t = torch.ones(1)
    tdist.all_reduce(t)
    return os.getpid(), t.item()
"""


def test_warm_ranks_are_reused_and_start_clean(pytester):
    pytester.makepyfile(
        STATE
        + """
FIRST = {}

@pytest.mark.gpu2
def test_a_dirty(dist):
    out = dist.run(dirty)
    FIRST["pids"] = [p for p, _ in out]
    FIRST["rand"] = out[0][1]

@pytest.mark.gpu2
def test_b_clean(dist):
    out = dist.run(look)
    assert [o["pid"] for o in out] == FIRST["pids"], "the same warm ranks ran both tests"
    cwd = os.getcwd()
    for o in out:
        assert o["dtype"] == "torch.float32" and o["grad"] is True
        assert not o["benchmark"] and not o["deterministic"] and not o["algos"]
        assert o["precision"] == "highest" and o["env"] is None and o["cwd"] == cwd
        assert o["groups"] == 1, "the subgroup made by the last test is gone"
        assert torch.equal(o["rand"], FIRST["rand"]), "seeded as a fresh rank: the same draws"
        assert o["world"] == 2

@pytest.mark.gpu2
def test_c_destroyed_group_is_rebuilt(dist):
    first = dist.run(destroy)
    pids, values = zip(*dist.run(allreduce))
    assert list(pids) == first and values == (2.0, 2.0)
"""
    )
    result = pytester.runpytest("--mgpu-fallback=cpu", "-v")
    result.assert_outcomes(passed=3)


RECOVER = """
import os, time, pytest, torch, torch.distributed as tdist

def pid_sum():
    t = torch.ones(1)
    tdist.all_reduce(t)
    return os.getpid(), t.item()

def fail_rank1():
    if tdist.get_rank() == 1:
        raise RuntimeError("rank 1 breaks")
    tdist.barrier()

def hang_rank0():
    if tdist.get_rank() == 0:
        time.sleep(300)
    tdist.barrier()

def die_rank1():
    if tdist.get_rank() == 1:
        os._exit(9)
    tdist.barrier()

PIDS = []

@pytest.mark.gpu4
@pytest.mark.parametrize("breaker", ["fail_rank1", "hang_rank0", "die_rank1"])
def test_break_then_recover(dist, breaker):
    before = [p for p, _ in dist.run(pid_sum)]
    with pytest.raises(Exception) as info:
        dist.run(globals()[breaker], timeout=5)
    assert "rank" in str(info.value)
    after = dist.run(pid_sum)
    assert [v for _, v in after] == [4.0] * 4
    assert set(p for p, _ in after).isdisjoint(before), "a broken pool is never reused"
    PIDS.extend(before)
"""


@ahead("recovered")
def recover_session(tmp_path_factory):
    """The session of RECOVER (run ahead of the test): how it ended, and what it left."""
    sp = Subpytest(path=tmp_path_factory.mktemp("recover"))
    (sp.path / "test_recover.py").write_text(RECOVER)
    return one_session(sp, ("--mgpu-fallback=cpu", "-q"), timeout=240)


@pytest.fixture(scope="module")
def recovered(lane):
    yield from lane.take(recover_session)


def test_failure_hang_and_death_rebuild_the_pool(recovered):
    ended, left = recovered
    assert ended.rc == 0, ended.out
    assert "3 passed" in ended.out
    assert left == []


ISOLATE = STATE + """
@pytest.mark.gpu2
@pytest.mark.mgpu_isolate
def test_marker(dist):
    assert dist.run(pid) != dist.run(pid)

@pytest.mark.gpu2
def test_plain(dist):
    assert dist.run(pid) == dist.run(pid)
"""


def test_isolate_marker_gives_fresh_processes(pytester):
    pytester.makepyfile(ISOLATE)
    pytester.runpytest("--mgpu-fallback=cpu").assert_outcomes(passed=2)


def test_isolate_option_gives_fresh_processes_everywhere(pytester):
    pytester.makepyfile(ISOLATE)
    result = pytester.runpytest("--mgpu-fallback=cpu", "--mgpu-isolate")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_plain*"])


def _pid() -> int:
    return os.getpid()


@world_sizes(2)
def test_an_inner_session_leaves_the_outer_warm_ranks_working(dist, pytester):
    """A session run in-process inside this one (pytester's runpytest, as plugin authors test)
    shares this process's forkserver; its end must not stop it under our warm ranks, whose exit
    status comes through it (they all read as "died: exit code 255" in the next call)."""
    before = dist.run(_pid)
    pytester.makepyfile("import os\nfrom pytest_mgpu import world_sizes\n\n"
                        "@world_sizes(2)\ndef test_inner(dist):\n    assert len(set(dist.run(os.getpid))) == 2\n")
    pytester.runpytest("--mgpu-fallback=cpu").assert_outcomes(passed=1)
    assert dist.run(_pid) == before  # the same warm ranks serve the next call
