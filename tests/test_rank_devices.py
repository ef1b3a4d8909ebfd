"""rank_context().devices: the torch.device of every device the process may use; on emulated
ranks ``cpu`` once per device of the test (it was ``()`` there, so ``devs[0], devs[-1]`` in a
model-parallel class raised IndexError)."""
import torch

from pytest_mgpu import rank_context, world_sizes


def _devices():
    ctx = rank_context()
    devs = ctx.devices
    first, last = devs[0], devs[-1]  # what a two-stage model-parallel class does
    return [str(d) for d in devs], all(isinstance(d, torch.device) for d in devs), str(first), str(last), \
        ctx.device_indices


@world_sizes(2, 4)
def test_devices_on_emulated_ranks_are_cpu_once_per_device(dist):
    w = dist.world_size
    assert dist.run(_devices) == [(["cpu"], True, "cpu", "cpu", ())] * w  # each rank holds one device
    assert dist.run_single(_devices) == (["cpu"] * w, True, "cpu", "cpu", ())  # one process, all w
