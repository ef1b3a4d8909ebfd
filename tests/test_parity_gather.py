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
