"""Your own FSDP2 (``fully_shard``) training loop, judged against the same loop on one device.

``record="optimizer"``: the loops run unchanged; a step is one ``optimizer.step()``. The sharded
parameters are gathered and compared by the model's own names.
"""
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from pytest_mgpu import world_sizes


def model():
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def data(n=64):
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g))


def train(net, loader):
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()


def fsdp_train(world_size, batch=8):
    """Runs in every rank, process group already up."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    net = model()
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    ds = data()
    train(net, DataLoader(ds, batch_size=batch, sampler=DistributedSampler(ds, shuffle=False)))


def one_device(world_size, batch=8):
    train(model(), DataLoader(data(), batch_size=batch * world_size, shuffle=False))


@world_sizes(2)
def test_fsdp2_loop_trains_like_one_device(dist):
    report = dist.assert_same_training(fsdp_train, one_device, dist.world_size, steps=3, record="optimizer")
    assert report.passed


@world_sizes(2)
def test_fsdp_wrapper_trains_like_one_device(dist):
    """The plugin's own FSDP2 wrapper on a model factory and a batch function: no loop to write."""
    dist.assert_parity("fsdp", model, batch_of_step, steps=2)


def batch_of_step(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 16, generator=g), torch.randint(0, 4, (16,), generator=g)
