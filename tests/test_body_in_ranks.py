"""world_sizes(..., body="ranks"): the test function itself runs in each rank, with pytest's assertion
rewriting, its picklable fixtures, and failures that name the rank. One pytester session (warm ranks)."""
import pytest

from pytest_mgpu import world_sizes
from pytest_mgpu.markers import MarkerError

TESTS = """
import threading
import pytest
import torch
import torch.distributed as td
from pytest_mgpu import rank_context, world_sizes

@pytest.fixture
def config():
    return {"width": 3}

@pytest.fixture
def lock():
    return threading.Lock()

def expected(n):
    return n * (n + 1) / 2

@world_sizes(2, body="ranks")
@pytest.mark.parametrize("scale", [2.0])
def test_fixtures_arrive(tmp_path, scale, config):
    (tmp_path / f"rank{td.get_rank()}").write_text("x" * config["width"])
    td.barrier()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    t = torch.full((2,), scale * (td.get_rank() + 1))
    td.all_reduce(t)
    assert t.tolist() == [scale * expected(td.get_world_size())] * 2

class TestInClass:
    @world_sizes(2, body="ranks")
    def test_method(self):
        assert rank_context().world_size == td.get_world_size() == 2

@world_sizes(2, body="ranks")
def test_skips_in_every_rank():
    pytest.skip("not on this backend")

@world_sizes(2, body="ranks")
def test_rank_one_is_wrong():
    assert expected(td.get_rank()) == 0

@world_sizes(2, body="ranks")
def test_unpicklable_fixture(lock):
    pass

@world_sizes(2, body="ranks")
def test_takes_dist(dist):
    pass
"""


def test_the_body_runs_in_every_rank(pytester):
    pytester.makepyfile(TESTS)
    result = pytester.runpytest("--mgpu-fallback=cpu", "-rs")
    result.assert_outcomes(passed=2, failed=3, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * not on this backend"])
    out = result.stdout.str()
    # the failing rank, named, with pytest's rewritten comparison from inside the rank
    result.stdout.fnmatch_lines(["*1 rank(s) failed (raised) in *test_rank_one_is_wrong[[]gpu2[]]*rank(s) 1",
                                 "rank 1 raised AssertionError: assert 1.0 == 0",
                                 "*|  +  where 1.0 = expected(1)"])
    assert "rank 0 raised" not in out
    result.stdout.fnmatch_lines(["*test_unpicklable_fixture[[]gpu2[]]: the fixture `lock` (_thread.lock) cannot be "
                                 "sent to the ranks*"])
    result.stdout.fnmatch_lines(["*test_takes_dist[[]gpu2[]]: a test whose body runs in the ranks cannot take the "
                                 "`dist` fixture*"])


def test_body_is_test_or_ranks():
    with pytest.raises(MarkerError, match='body is "test"'):
        world_sizes(2, body="rank")  # type: ignore[arg-type]
