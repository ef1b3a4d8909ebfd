"""How one lr schedule runs against another, read from the lr each side stepped with (the rules alone,
on lr sequences written out: a warm-up built for twice the steps, a scheduler also stepped on skipped
iterations, a base lr from the per-rank batch)."""
from __future__ import annotations

from pytest_mgpu.parity.evidence.facts import UserFacts
from pytest_mgpu.parity.evidence.schedule import lr_finding, schedule_rate, settled_factor

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


def _lr_cause(ranks, ref, world=2):
    """The lr finding for lr sequences written out (one param group, or a list of groups per step)."""
    wrap = lambda xs: [x if isinstance(x, list) else [x] for x in xs]  # noqa: E731
    facts = UserFacts(strategy="ddp", world_size=world, rank_lrs=[[g] * world for g in wrap(ranks)], ref_lrs=wrap(ref))
    return lr_finding(facts)


def test_an_lr_set_once_per_epoch_where_the_reference_sets_it_every_iteration_is_held():
    ref = [0.0, 0.1, 0.2, 0.3, 0.25, 0.1]  # a warm-up over 3 iterations, then a decay, every iteration
    found = _lr_cause([0.0, 0.0, 0.0, 0.3, 0.3, 0.3], ref)  # the same schedule at the integer epoch
    assert (found.signal, found.value) == ("lr-held", 3), found
    assert "changes every 3 steps (steps 0-2: 0)" in found.evidence
    assert _lr_cause([0.0, 0.0, 0.0, 0.3, 0.25, 0.1], ref).signal == "lr-schedule"  # held once, then moving


def test_a_warm_up_counted_in_the_rank_s_batches_rises_at_a_fraction_of_the_rate():
    ref = [0.0, 0.1, 0.2, 0.3, 0.25, 0.1]
    found = _lr_cause([0.0, 0.05, 0.1, 0.3, 0.28, 0.25], ref)  # half the slope, then its own decay
    assert (found.signal, found.value) == ("lr-warm-up", 0.5), found
    assert "in the reference's warm-up (steps 0-2) the ranks' lr is 0.5x its own" in found.evidence
    assert _lr_cause([0.0, 0.05, 0.1, 0.15, 0.125, 0.05], ref).signal == "lr-factor"  # 0.5x at every step


def test_param_groups_whose_lrs_stand_otherwise_to_each_other_are_named():
    ref = [[0.0, 0.0], [0.025, 0.1], [0.05, 0.2]]  # a head at 4x the body's lr (layer-wise decay)
    found = _lr_cause([[0.0, 0.0], [0.1, 0.1], [0.2, 0.2]], ref)  # the scale left out on the ranks
    assert found.signal == "lr-groups" and "every param group of the ranks stepped with lr 0.1" in found.evidence
    found = _lr_cause([[0.0, 0.0], [0.1, 0.025], [0.2, 0.05]], ref)  # the scales reversed
    assert found.signal == "lr-groups" and "in other proportions (ranks/reference: 0.25x to 4x" in found.evidence
    assert _lr_cause([[0.0, 0.0], [0.05, 0.2], [0.1, 0.4]], ref).signal == "lr-factor"  # one factor in every group


def test_a_warm_up_counted_from_zero_runs_one_step_behind_until_it_ends():
    ref = [0.01, 0.02, 0.02, 0.01828, 0.01378]  # warm-up (step + 1) / 2, then a cosine
    ranks = [0.0, 0.01, 0.02, 0.01828, 0.01378]  # step / 2: lr 0 first, one step late in the warm-up
    x = _lr_cause(ranks, ref)
    assert x.signal == "lr-behind" and "the reference's at step s - 1 in steps 0-1, the same after them (at step " \
        "0: 0)" in x.evidence, x.evidence
    assert _lr_cause([0.0, 0.01, 0.02, 0.02, 0.01828], ref).signal == "lr-behind", "one step late all along"
    assert _lr_cause([0.0, 0.01, 0.03, 0.01828, 0.01378], ref).signal != "lr-behind", "step 2 is no one's"


def test_one_optimizer_of_several_with_another_lr_is_not_a_schedule_that_never_moves():
    """A GAN's D (lr x 2/3) interleaved with its G (the same lr): D, D, G, D, G, D, D."""
    ref = [0.00667, 0.00667, 0.01, 0.00667, 0.01, 0.00667, 0.00667]
    x = _lr_cause([0.01] * 7, ref)
    assert x.signal == "lr-factor" and "at every step whose lr differs (the other steps' agree: another " \
        "optimizer's)" in x.evidence, x.evidence
    assert _lr_cause([0.01] * 7, [0.00667, 0.01, 0.009, 0.00667, 0.01, 0.008, 0.01]).signal != "lr-factor"
