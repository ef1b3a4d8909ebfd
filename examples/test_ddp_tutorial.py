"""The DDP tutorial's ``mp.spawn`` trainer, unchanged, under ``dist.spawn``.

Where the script says ``mp.spawn(main, args=(world_size, epochs, batch_size), nprocs=world_size)``,
the test says ``dist.spawn(main, dist.world_size, epochs, batch_size)``. The script's own
``init_process_group`` with its fixed ``MASTER_PORT`` joins the test's process group instead, so
tests never collide on the port, also under ``pytest -n 2``.
"""
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import destroy_process_group, get_rank, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from pytest_mgpu import rank_device, world_sizes


# ---- the script under test (multigpu.py, small) ----------------------------------------------------
def ddp_setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"  # fixed, as tutorials write it
    init_process_group(backend="gloo", rank=rank, world_size=world_size)


def main(rank, world_size, total_epochs, batch_size):
    ddp_setup(rank, world_size)
    device = rank_device()  # cuda:<rank> on GPUs, cpu on emulated ranks
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.rand(128, 20, generator=g), torch.rand(128, 1, generator=g))
    loader = DataLoader(data, batch_size=batch_size, sampler=DistributedSampler(data))
    model = DDP(nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    for epoch in range(total_epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
    rank_seen = get_rank()
    destroy_process_group()
    return rank_seen, loss.item()


# ---- the test --------------------------------------------------------------------------------------
@world_sizes(2, 4)
def test_main_runs_in_every_rank(dist):
    results = dist.spawn(main, dist.world_size, 2, 16)  # was: mp.spawn(main, args=(...), nprocs=...)
    assert [rank for rank, _ in results] == list(range(dist.world_size))
    assert all(loss == loss for _, loss in results)  # finite
