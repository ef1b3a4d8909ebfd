import torch
import torch.distributed as tdist

from pytest_mgpu import rank_device, world_sizes


def allreduce():  # runs in every rank, process group already up
    t = torch.ones(2, device=rank_device()) * (tdist.get_rank() + 1)
    tdist.all_reduce(t)
    return t  # comes back to the test, on CPU


@world_sizes(1, 2, 4)  # three tests: [gpu1], [gpu2], [gpu4]
def test_allreduce(dist):
    n = dist.world_size
    for t in dist.run(allreduce):
        assert torch.equal(t, torch.full((2,), n * (n + 1) / 2))
