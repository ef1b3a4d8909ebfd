"""dist.assert_same_training on a held-out set of the bugs users write in their own training
loops (tests/user_bugs.py): each is caught with the hint that names it; the correct loops pass."""
import functools

import pytest

from pytest_mgpu import world_sizes
from pytest_mgpu.parity import ParityError
from pytest_mgpu.parity.training import StepCountError
from tests import user_bugs as B

SIZES = world_sizes(2, 4)

BUGS = [  # (loop, bug, what the likely causes must say)
    (B.hand_dp, "sum_no_divide", "gradients scaled by the world size"),
    (B.hand_dp, "no_allreduce", "gradients are not synchronized between ranks"),
    (B.hand_dp, "rank_init", "the ranks start from different weights"),
    (B.ddp_loop, "no_sync", "gradients are not synchronized between ranks"),
    (B.ddp_loop, "no_sampler", "the data is not sharded"),
    (B.ddp_loop, "loss_times_world", "gradients scaled by the world size"),
    (B.ddp_loop, "sum_loss", "gradients scaled by a constant"),
]


@SIZES
@pytest.mark.parametrize("loop", [B.hand_dp, B.ddp_loop], ids=["hand_dp", "ddp"])
def test_correct_loops_pass(dist, loop):
    report = dist.assert_same_training(loop, B.one_device, dist.world_size, steps=3)
    assert report.passed and len(report.records) == 3
    assert any(e.name.startswith("rank 1: ") for e in report.errors("param"))  # replicas compared


@SIZES
@pytest.mark.parametrize("loop,bug,hint", BUGS, ids=[b for _, b, _ in BUGS])
def test_bug_is_caught_with_its_hint(dist, loop, bug, hint):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(loop, B.one_device, dist.world_size, bug=bug, steps=3)
    causes = str(info.value).split("likely causes:", 1)[1]
    assert hint in causes, str(info.value)
    if "world size" in hint:
        assert f"= the world size {dist.world_size}" in causes


def _short(log, world_size, steps):
    B.one_device(log, world_size, steps=steps - 1)


@world_sizes(2)
def test_a_side_logging_too_few_steps_is_named(dist):
    with pytest.raises(StepCountError, match=r"reference_fn \(one process\) logged 2 step"):
        dist.assert_same_training(B.hand_dp, _short, dist.world_size, steps=3)


@world_sizes(2, 4)
def test_ranks_taking_world_size_times_the_steps_are_told_no_distributed_sampler(dist):
    """An epoch over the whole data set on every rank: not "each loop must call log" (the loops do)."""
    w = dist.world_size
    with pytest.raises(StepCountError) as info:
        dist.assert_same_training(B.ddp_loop, B.one_device, w, bug="no_sampler_epoch", steps=3)
    text = str(info.value)
    assert f"every rank took {w} x the reference's steps: {3 * w} = {w} x 3" in text.splitlines()[1]
    assert "as if there were no DistributedSampler" in text and "must call log" not in text


def _names_in_rank(world_size):
    from pytest_mgpu.parity.record.recorder import Recorder

    return B.wrapped_names(Recorder(), world_size)


@world_sizes(2)
def test_wrappers_are_removed_from_names(dist):
    names = dist.run(_names_in_rank, dist.world_size)
    assert names == [["0.bias", "0.weight", "2.bias", "2.weight"]] * 2


@world_sizes(2)
@pytest.mark.parametrize("version", [2, 1], ids=["fsdp2", "fsdp1"])
def test_fsdp_loops_are_gathered_and_pass(dist, version):
    report = dist.assert_same_training(B.fsdp_loop, B.one_device, dist.world_size, version=version, steps=2)
    assert {e.name for e in report.errors("grad")} >= {"0.weight", "rank 1: 2.bias"}


@world_sizes(2)
@pytest.mark.parametrize("version", [2, 1], ids=["fsdp2", "fsdp1"])
def test_fsdp_loops_recorded_at_optimizer_step_are_gathered_and_pass(dist, version):
    """record="optimizer": the parameters FSDP's optimizer steps (DTensor shards, FSDP1's original
    parameters) are gathered and named as the one-device model's."""
    report = dist.assert_same_training(B.fsdp_loop, B.one_device, B.no_log, dist.world_size, version=version,
                                       steps=2, record="optimizer")
    assert {e.name for e in report.errors("grad")} == {"0.weight", "0.bias", "2.weight", "2.bias",
                                                        "rank 1: 0.weight", "rank 1: 0.bias", "rank 1: 2.weight",
                                                        "rank 1: 2.bias"}


@world_sizes(2)
def test_the_float64_run_starts_from_the_same_weights_and_data(dist):
    """A float64 tensor draws other random numbers than a float32 one from the same seed: the shadow
    must draw as float32 does, or it trains another network and its "floor" forgives any bug."""
    report = dist.assert_same_training(B.hand_dp, B.one_device, dist.world_size, steps=2)
    assert report.tolerance.rule == "measured"
    assert [n for n in report.notes if not n.startswith("judged by what each rank holds: data-parallel replicas: ranks "
                                                        "0-1 each hold the whole model")] == [], report.notes
    assert max(report.tolerance.floors.values()) < 1e-4  # roundoff, not another network (O(1))


def _urandom_init(log, world_size, steps):
    import os

    import torch

    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))  # not from the test's seed
    B.one_device(log, world_size, steps=steps)


@world_sizes(2)
def test_a_shadow_that_starts_elsewhere_is_not_used_as_the_floor(dist):
    with pytest.raises(ParityError) as info:  # the ranks' weights differ from the reference's too
        dist.assert_same_training(B.hand_dp, _urandom_init, dist.world_size, steps=2)
    report = info.value.report
    assert report.tolerance.rule == "derived"
    assert any("started from other weights" in n for n in report.notes), report.notes
