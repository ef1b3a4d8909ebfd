"""Pipeline parallel: seed 004's PipelineParallelResNet50 (stages on consecutive devices of one
process, the batch fed in micro-batches of ``split_size``), and torch.distributed.pipelining across
ranks with the GPipe and 1F1B schedules.

Micro-batching is exact for per-sample layers and changes BatchNorm in train mode (statistics per
micro-batch): the tests show both.
"""
import functools

import pytest

from pytest_mgpu import world_sizes
from pytest_mgpu.parity import ParityError
from suites import models as M

SIZES = world_sizes(1, 2, 4)
CNN_BN = functools.partial(M.small_cnn, norm="batch")
CNN_GN = functools.partial(M.small_cnn, norm="group")


def _batch(dist, batch=8):
    return functools.partial(M.image_batch, batch=batch, size=32 if dist.emulated else 64)


# -- seed 004: micro-batches through stages in one process ------------------------------------------
@SIZES
def test_eval_mode_pipeline_outputs_equal_the_unsplit_model(dist):
    report = dist.assert_parity("pipeline", functools.partial(M.resnet, 18, eval_mode=True), _batch(dist, 4),
                                steps=1, split_size=2)
    print(report.format())
    assert report.facts.microbatches == 2
    assert report.rel("output") <= report.tolerance.rel_line(0, "output")


@SIZES
def test_train_mode_batchnorm_micro_batching_changes_statistics(dist):
    batch = functools.partial(M.image_batch, batch=8, size=16)
    # one micro-batch: BatchNorm sees the whole batch, bitwise equal
    whole = dist.assert_parity("pipeline", CNN_BN, batch, steps=1, split_size=8, deterministic=True)
    assert whole.bitwise
    # four micro-batches: each normalizes with its own statistics
    with pytest.raises(ParityError) as failure:
        dist.assert_parity("pipeline", CNN_BN, batch, steps=1, split_size=2)
    message = str(failure.value)
    print(message)
    assert "BatchNorm" in message and "4 micro-batches" in message
    assert failure.value.report.rel("output") > 1e-3, "outputs must differ, not only gradients"


@SIZES
def test_groupnorm_model_pipelines_exactly_in_train_mode(dist):
    report = dist.assert_parity("pipeline", CNN_GN, functools.partial(M.image_batch, batch=8, size=16),
                                steps=2, split_size=2)
    print(report.format())


@world_sizes(2)
def test_seed_pipeline_resnet50_cut_before_layer3(dist):
    report = dist.assert_parity("pipeline", functools.partial(M.resnet, 50, eval_mode=True), _batch(dist, 4),
                                loss_fn=M.mse_onehot, steps=1, split_points=["layer3"], split_size=2)
    print(report.format())
    assert [s[0] for s in report.facts.stages] == ["conv1", "layer3"]


# -- torch.distributed.pipelining: one stage per rank -----------------------------------------------
@SIZES
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_distributed_schedule_trains_like_one_device(dist, schedule):
    report = dist.assert_parity("pipeline", CNN_GN, functools.partial(M.image_batch, batch=8, size=16),
                                steps=2, schedule=schedule)
    print(report.format())
    assert len(report.facts.stages) == dist.world_size


@world_sizes(2)
def test_distributed_1f1b_resnet18_sequential(dist):
    model = functools.partial(M.resnet_sequential, 18, norm="group")
    report = dist.assert_parity("pipeline", model, _batch(dist), steps=2, schedule="1f1b",
                                split_points=["layer3"], n_microbatches=4)
    print(report.format())


@world_sizes(2)
def test_distributed_pipeline_of_a_traced_model(dist):
    # not an nn.Sequential: the stages come from torch.distributed.pipelining.pipeline() tracing
    report = dist.assert_parity("pipeline", M.mlp, M.mnist_batch, steps=2, schedule="gpipe",
                                split_points=["fc2"])
    print(report.format())
