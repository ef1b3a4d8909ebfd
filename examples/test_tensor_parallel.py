"""Tensor parallel (``parallelize_module``) on a 1-D mesh, judged against one device.

Every rank feeds the same batch (tensor parallel splits the weights, not the data); the DTensor
parameters are gathered and compared by name with the one-device model's.
"""
import torch
import torch.nn.functional as F
from torch import nn

from pytest_mgpu import world_sizes


class FeedForward(nn.Module):
    def __init__(self, dim=16, hidden=64):
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)


def train(model, steps):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        x, y = batch(step)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()


def tp_train(world_size, steps):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world_size,))
    train(parallelize_module(FeedForward(), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()}), steps)


def one_device(world_size, steps):
    train(FeedForward(), steps)


@world_sizes(2)
def test_tensor_parallel_block_trains_like_one_device(dist):
    report = dist.assert_same_training(tp_train, one_device, dist.world_size, 4, steps=4, record="optimizer")
    assert report.passed
