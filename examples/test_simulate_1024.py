"""A sharding plan at 1,024 ranks, on this CPU: one rank of the job under PyTorch's fake process
group. Counts and bytes are real; the numbers the collectives return are not (no data moves).
"""
import pytest
import torch
import torch.distributed as tdist
from torch import nn

from pytest_mgpu import simulate

WORLD = 1024


def fsdp_step(width=256, layers=4):
    """Build on meta, shard with FSDP2 over all ranks, materialize this rank's shards, train one step."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    mesh = init_device_mesh("cpu", (tdist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    for layer in model:
        layer.reset_parameters()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    return sum(p.numel() for p in model.parameters())


@pytest.mark.simulate
def test_fsdp2_plan_at_1024_ranks():
    sim = simulate(fsdp_step, world_size=WORLD, rank=0)
    print(sim.format())
    # forward: one all-gather per layer, backward: each layer gathered again; one reduce-scatter of
    # gradients per layer
    assert sim.collectives == {"all_gather_into_tensor": 8, "reduce_scatter_tensor": 4}
    full_bytes = 4 * (256 * 256 + 256)
    assert sim.memory.params < full_bytes  # this rank holds shards only, never a whole layer
