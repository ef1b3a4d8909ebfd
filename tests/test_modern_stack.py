"""assert_same_training(record="optimizer") on the modern stack (tests/modern_trainers.py): FSDP2 with
a DCP checkpointer, DDP with gradient accumulation and StepLR, sequence parallel. Correct runs pass
with what the report says of them; each bug fails with its cause named first on the CI page."""
import functools

import pytest

from pytest_mgpu import ParityError, world_sizes
from tests import modern_trainers as M
from tests.test_junit_messages import assert_cause, junit_head

SIZES = world_sizes(2, 4)


@SIZES
def test_fsdp2_with_a_dcp_checkpoint_reload_trains_like_one_device(dist, tmp_path):
    fn = functools.partial(M.fsdp2_dcp, str(tmp_path / "ckpt"))
    report = dist.assert_same_training(fn, M.one_device, steps=6, record="optimizer")
    notes = "\n".join(report.notes)
    # DCP creates the optimizer's state with one step at lr 0: not a training step
    assert "not counted: 1 optimizer.step() that changed nothing (state initialisation, e.g. DCP " \
           "set_optimizer_state_dict)" in notes, notes
    assert not any(e.missing for e in report.errors()), "the rebuilt model's names line up with the reference's"


@world_sizes(2)
def test_fsdp2_resumed_without_optimizer_state_fails_on_the_resumed_step(dist, tmp_path):
    fn = functools.partial(M.fsdp2_dcp, str(tmp_path / "ckpt"), bug="no_optimizer_state")
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(fn, M.one_device, steps=6, record="optimizer")
    text = str(info.value)
    assert "diverges from one device at step 4 (of 6)" in text, text[:600]  # the first update without state
    assert_cause("likely cause: the optimizer's state differs. Fix: save and load the optimizer's state", text)
    assert "data is not sharded" not in text and "DistributedSampler" not in text


@world_sizes(2)
def test_fsdp2_clipping_by_local_norms_is_named_from_the_clip_factors(dist, tmp_path):
    fn = functools.partial(M.fsdp2_dcp, str(tmp_path / "ckpt"), clip=True, bug="local_clip")
    dist.assert_same_training(functools.partial(M.fsdp2_dcp, str(tmp_path / "ok"), clip=True),
                              functools.partial(M.one_device, clip=True), steps=6, record="optimizer")
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(fn, functools.partial(M.one_device, clip=True), steps=6, record="optimizer")
    text = str(info.value)
    first = text.splitlines()[1]
    assert first.startswith("likely cause: gradient clipping differs (at step 0 reference_fn clipped"), text
    assert ". Fix: call torch.nn.utils.clip_grad_norm_" in first, text
    assert "optimizer holds other parameters" not in text
    assert "data is not sharded" not in text


@world_sizes(2)
@pytest.mark.parametrize("bug,cause", [
    ("no_zero_grad", "likely cause: gradients not zeroed between steps. Fix: call optimizer.zero_grad()"),
    ("data_restarted", "likely cause: data repeated. Fix: restore the epoch and the position in it"),
])
def test_fsdp2_loop_bugs_are_named(dist, tmp_path, bug, cause):
    fn = functools.partial(M.fsdp2_dcp, str(tmp_path / "ckpt"), bug=bug)
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(fn, M.one_device, steps=6, record="optimizer")
    text = str(info.value)
    assert_cause(cause, junit_head(f"pytest_mgpu.parity.report.ParityError: {text}"))
    assert "never calls DistributedSampler.set_epoch" not in text and "data is not sharded" not in text


@SIZES
def test_gradient_accumulation_with_steplr_trains_like_one_device(dist):
    report = dist.assert_same_training(M.ddp_accumulate, functools.partial(M.accumulate_one_device, dist.world_size),
                                       steps=6, record="optimizer")
    assert report.errors("loss"), "the loss was compared"
    assert any("steps recorded with 2 backward passes each (gradient accumulation)" in n for n in report.notes)


@world_sizes(4)
@pytest.mark.parametrize("bug,cause", [
    ("scheduler_per_micro_batch", "likely cause: the scheduler is stepped per micro-batch. Fix: call "
                                  "scheduler.step() right after optimizer.step()"),
    ("not_divided", "likely cause: gradient accumulation without dividing the loss. Fix: backpropagate loss / 2"),
])
def test_accumulation_bugs_are_named(dist, bug, cause):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(M.ddp_accumulate, bug=bug),
                                  functools.partial(M.accumulate_one_device, dist.world_size), steps=6,
                                  record="optimizer")
    text = str(info.value)
    assert_cause(cause, text)
    assert "no known cause" not in text


@SIZES
def test_sequence_parallel_compares_gradients_and_says_why_not_the_loss(dist):
    report = dist.assert_same_training(M.sequence_parallel, functools.partial(M.toy_one_device, dist.world_size),
                                       steps=4, record="optimizer")
    notes = "\n".join(report.notes)
    assert "the loss was not compared: ranks " in notes and "Gradients and parameters were compared" in notes
    assert not report.errors("loss") and report.errors("grad")


@world_sizes(2)
def test_sequence_parallel_fed_one_shard_everywhere_is_named(dist):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(M.sequence_parallel, bug="same_rows_everywhere"),
                                  functools.partial(M.toy_one_device, dist.world_size), steps=4, record="optimizer")
    text = str(info.value)
    assert_cause("likely cause: every tensor-parallel peer fed the same rows. Fix: feed each rank its shard", text)
    assert "loss is scaled by the world size" not in text and "batch_size x 1" not in text


@SIZES
def test_a_pipeline_schedule_is_judged_stage_by_stage(dist):
    report = dist.assert_same_training(M.pipeline, M.pipeline_one_device, steps=4, record="optimizer")
    notes = "\n".join(report.notes)
    assert f"{dist.world_size} pipeline stages" in notes, notes
    assert report.errors("loss") and not any(e.missing for e in report.errors()), "every stage matched, the loss too"


@world_sizes(2)
def test_an_interleaved_pipeline_schedule_is_judged_stage_by_stage(dist):
    """Two stage modules per rank: named as the model names them (they do not collide), so each is
    matched to its part of the one-device model."""
    report = dist.assert_same_training(M.interleaved, M.pipeline_one_device, steps=4, record="optimizer")
    assert "2 pipeline stages" in " ".join(report.notes), report.notes
    assert {e.name for e in report.errors("param") if not e.name.startswith("rank ")} >= {"0.weight", "6.weight"}

