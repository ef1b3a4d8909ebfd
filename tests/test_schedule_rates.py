"""How one lr schedule runs against another, read from the lr each side stepped with (the rules alone,
on lr sequences written out: a warm-up built for twice the steps, a scheduler also stepped on skipped
iterations, a base lr from the per-rank batch)."""
from __future__ import annotations

from pytest_mgpu.parity.evidence.state import schedule_rate, settled_factor

WARMUP = [0.25, 0.5, 0.4167, 0.3333, 0.25]  # a linear warm-up over 2 steps, then a linear decay


def test_a_warm_up_built_for_twice_the_steps_runs_at_half_the_rate():
    ranks = [0.125, 0.25, 0.375, 0.5, 0.4583]  # the same schedule over twice the steps
    assert schedule_rate(ranks, WARMUP).startswith("at half the rate"), schedule_rate(ranks, WARMUP)
    assert schedule_rate(WARMUP, WARMUP) == ""


def test_a_scheduler_also_stepped_on_skipped_iterations_drifts_ahead():
    ref = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    ranks = [0.2, 0.4, 0.6, 0.8]  # one step further ahead at each step
    assert schedule_rate(ranks, ref) == "2x faster (the lr at step s is the other's at step 2s)"
    ranks = [0.2, 0.3, 0.5, 0.6]  # ahead by 1, then by 2
    assert schedule_rate(ranks, ref) == ("ahead, further as the run goes on (the lr at step s is the other's at "
                                         "step s + 1 to s + 2)"), schedule_rate(ranks, ref)


def test_a_base_lr_from_the_per_rank_batch_is_reached_once_warm_up_ends():
    ref = [0.02, 0.08, 0.14, 0.1383]  # a warm-up from 0.02 to 0.14, then a cosine
    ranks = [0.02, 0.04667, 0.07333, 0.06913]  # the same warm-up to half the base lr
    assert settled_factor(ranks, ref, 2) == 0.5
    assert settled_factor(ranks, ref, 4) == 0.0  # not 1/W at W = 4
    assert settled_factor([0.02, 0.3, 0.07], ref[:3], 2) == 0.0  # no monotone approach
