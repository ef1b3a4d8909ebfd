"""Many distributed tests under pytest-xdist: rendezvous never collides, results stay per test."""
import re

from tests import xdist_together as together

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
FILE = together.register("test_many.py", BODY)  # run in the session shared with the other xdist tests


def test_xdist_two_workers_many_distributed_tests(xdist_together):
    run = xdist_together
    assert run.outcomes(FILE) == {f"test_many[{k}-gpu{w}]": "passed" for w in (1, 2, 4) for k in range(4)}, run.out
    assert all(run.case(FILE, name).properties["mgpu_calls"] == "1" for name in run.outcomes(FILE))
    # the controller saw every worker's records: its summary counts each distributed test of the session
    recorded = [c for c in run.cases.values() if "mgpu_calls" in c.properties and c.outcome != "skipped"]
    calls = sum(int(c.properties["mgpu_calls"]) for c in recorded)
    assert re.search(rf"^{len(recorded)} distributed test\(s\), {calls} call\(s\)", run.out, re.M), run.out
    assert run.left == []
