"""The user's own distributed code, as it is: the reference documents' mp.spawn trainer through
``dist.spawn``, their training loop against one device with ``dist.assert_same_training``, and their
hand-written model-parallel and pipelined ResNet50 against torchvision's with ``dist.assert_parity``.
"""
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
