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


def _what_torch_sees():
    import os

    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available(), torch.cuda.device_count()


@world_sizes(2)
def test_emulated_ranks_see_no_gpu_even_on_a_gpu_machine(dist):
    """On a machine with fewer GPUs than the test needs, emulated CPU ranks must not see the GPU it
    has: fully_shard's default mesh (and any code asking torch for its accelerator) then picked
    ``cuda:<rank>`` on a 1-GPU machine and rank 1 failed with "invalid device ordinal"."""
    if dist.device_type != "cpu":
        import pytest

        pytest.skip("this machine has the GPUs the test needs: its ranks are not emulated")
    assert dist.run(_what_torch_sees) == [("", False, 0)] * dist.world_size
    assert dist.run_single(_what_torch_sees) == ("", False, 0)
