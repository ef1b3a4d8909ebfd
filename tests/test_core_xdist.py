"""Many distributed tests under pytest-xdist: rendezvous never collides, results stay per test."""

BODY = """
import pytest, torch, torch.distributed as tdist
from pytest_mgpu import rank_device, world_sizes

def total(k):
    t = torch.tensor([float(k)], device=rank_device())  # NCCL carries no CPU tensors
    tdist.all_reduce(t)
    return t.item()

@world_sizes(1, 2, 4)
@pytest.mark.parametrize("k", range(4))
def test_many(dist, k):
    assert dist.run(total, k) == [k * dist.world_size] * dist.world_size
"""


def test_xdist_two_workers_many_distributed_tests(subpytest):
    subpytest.pytester.makepyfile(test_many=BODY)
    rc, out = subpytest.run("-n", "2", "--mgpu-fallback=cpu", "-q", timeout=300)
    assert rc == 0, out
    assert "12 passed" in out
    assert "12 distributed test(s), 12 call(s)" in out  # the controller saw every worker's records
    assert subpytest.leftovers() == []
