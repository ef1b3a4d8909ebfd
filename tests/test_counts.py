"""A side that took another number of steps than asked: the cause where the run's own facts show one,
on the second line, and no cause where none does (the records built by hand: the rules alone)."""
from __future__ import annotations

import pytest

from pytest_mgpu import StepCountError
from pytest_mgpu.parity.counts import check_counts
from pytest_mgpu.parity.record.recorder import SideLog, StepLog


def side(lrs, **facts) -> SideLog:
    out = SideLog(steps=[StepLog(1.0, {}, {}, lrs=[lr]) for lr in lrs])
    for name, value in facts.items():
        setattr(out, name, value)
    return out


def message(ref: SideLog, *ranks: SideLog, steps: int) -> str:
    sides = [("reference_fn (one process)", ref)] + [(f"fn on rank {r}", s) for r, s in enumerate(ranks)]
    with pytest.raises(StepCountError) as info:
        check_counts(sides, steps, "optimizer", len(ranks))
    return str(info.value)


def test_a_schedule_twice_as_fast_that_reaches_lr_0_early_is_the_cause():
    ref = side([0.1, 0.2, 0.3, 0.4, 0.5], uncounted=1)
    rank = side([0.2, 0.4, 0.6], uncounted=3)
    text = message(ref, rank, side([0.2, 0.4, 0.6], uncounted=3), steps=5)
    line = text.splitlines()[1]
    assert line.startswith("likely cause: the learning-rate schedule runs 2x faster (the lr at step s is the "
                           "reference's at step 2s) on the ranks; fn on rank 0 took 3 step(s) at lr 0, the reference 1"), line
    assert "ran out of data" not in text, text


def test_gradients_clipped_before_unscale_on_the_ranks_only_is_the_cause():
    ref = side([0.1] * 4, scaler_found=[True] * 3)
    ranks = [side([0.1] * 3, scaler_found=[True] * 4, scaled_clips=7) for _ in range(2)]
    line = message(ref, *ranks, steps=4).splitlines()[1]
    assert line.startswith("likely cause: gradients clipped while still multiplied by the GradScaler's scale on the "
                           "ranks (fn on rank 0: clip_grad_norm_ before scaler.unscale_ 7 time(s)"), line


def test_every_rank_through_the_whole_data_set():
    line = message(side([0.1] * 3), side([0.1] * 6), side([0.1] * 6), steps=3).splitlines()[1]
    assert line.startswith("likely cause: each rank iterates over the whole data set, as if there were no "
                           "DistributedSampler (every rank took 2 x the reference's steps: 6 = 2 x 3)"), line


def test_no_fact_no_cause():
    """Both sides short alike, nothing skipped, no schedule: the data ran out, and no cause is claimed."""
    text = message(side([0.1] * 2), side([0.1] * 2), side([0.1] * 2), steps=3)
    assert "likely cause" not in text and "ran out of data" in text, text
