"""full_tensor: DTensor.full_tensor(), or (gloo ranks sharing a GPU) the shards gathered through host
memory; both must give the same whole tensor, also for shards of uneven size."""
import torch

from pytest_mgpu import world_sizes
from pytest_mgpu.parity import gather


def _both_ways():
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (tdist.get_world_size(),))
    whole = torch.arange(5 * 3, dtype=torch.float32).reshape(5, 3)  # 5 rows: uneven on 2 and 4 ranks
    rows, cols = distribute_tensor(whole, mesh, [Shard(0)]), distribute_tensor(whole, mesh, [Shard(1)])
    same = distribute_tensor(whole, mesh, [Replicate()])
    torch_way = [x.full_tensor() for x in (rows, cols, same)]
    real = gather._gloo_on_cuda
    gather._gloo_on_cuda = lambda t: True  # as on ranks sharing a GPU, whose gloo carries CUDA tensors
    try:
        host_way = [gather.full_tensor(x) for x in (rows, cols, same)]
    finally:
        gather._gloo_on_cuda = real  # a warm rank runs later tests
    return [torch.equal(a, b) and torch.equal(a, whole) for a, b in zip(torch_way, host_way)]


@world_sizes(2, 4)
def test_shards_gathered_through_host_memory_equal_full_tensor(dist):
    assert dist.run(_both_ways) == [[True, True, True]] * dist.world_size
    assert gather.full_tensor(3.0) == 3.0  # not a DTensor: as it is


def _together():
    """Several DTensors (rows and columns of uneven size, a replicated one, another dtype, a 1-D
    tensor): gathered together, each equals its own full_tensor()."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (tdist.get_world_size(),))
    torch.manual_seed(0)
    wholes = [torch.randn(5, 3), torch.randn(7, 6), torch.randn(5), torch.randn(4, 4, dtype=torch.float64),
              torch.randn(3, 2)]
    placements = [Shard(0), Shard(1), Shard(0), Shard(0), Replicate()]
    ts = [distribute_tensor(w, mesh, [p]) for w, p in zip(wholes, placements)] + [None, 2.5, torch.ones(2)]
    from pytest_mgpu.timing.structure.counter import CollectiveCounter

    with CollectiveCounter() as together:
        got = gather.full_tensors(ts)
    with CollectiveCounter() as alone:
        want = [t.full_tensor() for t in ts[:5]]
    same = [torch.equal(a, b) and torch.equal(a, w) for a, b, w in zip(got, want, wholes)]
    return same + got[5:7] + [sum(together.counts.values()), sum(alone.counts.values())]


@world_sizes(2, 4)
def test_shards_gathered_together_equal_full_tensor(dist):
    """The three float32 shards in two collectives (their sizes, then their values), the float64 one
    alone, the replicated one in none: 3, where one full_tensor() each takes 4."""
    assert dist.run(_together) == [[True] * 5 + [None, 2.5, 3, 4]] * dist.world_size
