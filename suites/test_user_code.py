"""The user's own distributed code, as it is: the reference documents' mp.spawn trainer through
``dist.spawn``, and against one device with ``dist.assert_same_training(spawn=True)``, and their
hand-written model-parallel and pipelined ResNet50 against torchvision's with ``dist.assert_parity``.
"""
import functools

import pytest

from pytest_mgpu import world_sizes
from suites import user_code as U

SIZES = world_sizes(2, 4)


# -- dist.spawn: seed 001's main, unchanged (hard-coded MASTER_PORT 12555) --------------------------
@SIZES
def test_seed001_main_runs_unchanged_through_spawn(dist):
    n = dist.world_size
    # mp.spawn(main, args=(world_size, total_epochs, save_every, batch_size), nprocs=world_size);
    # save_every > total_epochs: no checkpoint.pt written into the working directory
    assert dist.spawn(U.main, n, 1, 2, 32) == [None] * n
    assert dist.spawn(U.main, n, 1, 2, 32) == [None] * n  # the same port again, same ranks


@world_sizes(2)
def test_seed001_rank_raising_in_its_trainer_is_named(dist):
    from pytest_mgpu.launch.errors import RankFailure

    with pytest.raises(RankFailure) as info:
        dist.spawn(U.main_with_bad_rank, dist.world_size, 1, 2, 32)
    text = str(info.value)
    assert "rank 1 raised RuntimeError" in text
    assert "in _run_batch" in text and "user_code.py" in text


# -- dist.assert_same_training: seed 001's main, unchanged (mp.spawn entry, its Trainer, DDP,
#    DistributedSampler), against the same training on one device, step per optimizer.step() ----------
@SIZES
def test_seed001_main_trains_like_one_device(dist):
    n = dist.world_size
    report = dist.assert_same_training(
        functools.partial(U.main, world_size=n, total_epochs=1, save_every=2, batch_size=32),
        functools.partial(U.one_device_main, n, 1, 32), steps=2, spawn=True)
    print(report.format())


# -- dist.assert_parity(parallel_fn, ...): seed 004's hand-written ResNet50s against resnet50 -------
@world_sizes(2)
def test_seed004_model_parallel_resnet50_is_resnet50(dist):
    from suites import user_resnet as R

    report = dist.assert_parity(R.model_parallel, R.reference, R.batch, **R.ONE_STEP)
    print(report.format())


@world_sizes(2)
@pytest.mark.parametrize("split_size", [2, 5])   # seed 004 swept [1, 3, 5, 8, 10, 12, 20, 40, 60] of 120
def test_seed004_pipelined_resnet50_is_resnet50(dist, split_size):
    import functools

    from suites import user_resnet as R

    report = dist.assert_parity(functools.partial(R.pipeline, split_size), R.reference, R.batch, **R.ONE_STEP)
    assert report.facts.microbatches == -(-8 // split_size)
    print(report.format())


@world_sizes(2)
def test_seed004_pipelined_resnet50_with_batchnorm_is_not(dist):
    """Seed 004 as written (BatchNorm, train mode): each micro-batch is normalized on its own."""
    import functools

    from pytest_mgpu.parity import ParityError
    from suites import user_resnet as R

    with pytest.raises(ParityError) as info:
        dist.assert_parity(functools.partial(R.pipeline, 4, "batch"), R.BN, R.batch, **R.ONE_STEP)
    first = next(line for line in str(info.value).splitlines() if line.startswith("likely cause:"))
    assert "normalize each of 2 micro-batches" in first, first  # the first cause, not a start
    print(info.value)
