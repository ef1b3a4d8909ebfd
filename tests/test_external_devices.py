"""Which device a rank started by torchrun/srun takes, from the node's GPU count: decided alike by every
rank of a node, so that a 1-GPU node running two ranks does not start NCCL twice on one GPU (NCCL
refuses it: "Duplicate GPU detected", seen on a real 1-GPU machine)."""
import pytest

from pytest_mgpu.launch.external import LaunchedWorld, choose_device
from pytest_mgpu.launch.external.detect import external_plan


def world(local_rank: int, local_world_size: int) -> LaunchedWorld:
    return LaunchedWorld(local_rank, local_world_size, local_rank, local_world_size, 0, "127.0.0.1", 1,
                         "torchrun", "job")


@pytest.mark.parametrize("local_rank", [0, 1])
def test_a_node_with_fewer_gpus_than_ranks_runs_every_rank_on_cpu(local_rank):
    device = choose_device(world(local_rank, 2), cuda_count=1, visible="")
    assert (device.device_type, device.backend) == ("cpu", "gloo")
    assert "starts 2 rank(s) and shows 1 GPU(s)" in device.short_of_gpus
    assert "--nproc_per_node=1" in device.short_of_gpus


def test_a_task_given_its_own_gpu_uses_it():
    device = choose_device(world(1, 2), cuda_count=1, visible="3")  # srun --gpus-per-task=1
    assert (device.device_type, device.device_index, device.backend) == ("cuda", 0, "nccl")


@pytest.mark.parametrize("local_rank", [0, 1])
def test_enough_gpus_give_each_rank_its_local_one(local_rank):
    device = choose_device(world(local_rank, 2), cuda_count=2, visible="")
    assert (device.device_type, device.device_index, device.backend) == ("cuda", local_rank, "nccl")


def test_no_gpu_is_cpu_with_nothing_to_explain():
    device = choose_device(world(0, 2), cuda_count=0)
    assert (device.device_type, device.short_of_gpus) == ("cpu", "")


def test_the_skip_says_why_the_gpu_was_not_used_and_both_fixes():
    w = world(0, 2)
    plan = external_plan(2, w, choose_device(w, cuda_count=1, visible=""), "skip")
    assert plan.skip_reason.startswith("needs 2 GPU(s): this node starts 2 rank(s) and shows 1 GPU(s)")
    assert "--mgpu-fallback=cpu" in plan.skip_reason
    assert external_plan(2, w, choose_device(w, cuda_count=1, visible=""), "cpu").emulated
