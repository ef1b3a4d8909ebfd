"""A VAE's loop (``tests/latent_loops.py``): the model's second argument (its noise) drawn per rank or
sliced at another offset is named for what it is, a loss term that reaches the encoder alone (the KL
term, its weight) is told from a loss computed otherwise as a whole, and a queue refreshed in the forward
with each rank's own codes from state loaded otherwise. Real 2-rank loops."""
import functools

import pytest

from pytest_mgpu import ParityError, world_sizes
from tests import latent_loops as L

CASES = {  # bug -> (the first cause, its evidence)
    "eps_rank_seed": ("an input beside the rows is drawn per rank", "same weights and rows: the model's argument eps differs (8 of "
                      "8 rows); none is any row's of the reference"),
    "eps_first_block": ("each rank gets another slice of a batch-wide input beside the rows",
                        "same weights and rows: the model's argument eps differs (4 of 8 rows); each is another row's argument eps"),
    "kl_weight_global": ("a loss term reaching only part of the model differs",
                         "the loss differs (1.005x the reference's) and only enc's gradients differ (dec's agree)"),
}


def first_cause(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("likely cause: "))


@world_sizes(2)
def test_the_correct_loop_passes(dist):
    assert dist.assert_same_training(L.train, L.reference, dist.world_size, steps=L.STEPS, record="optimizer").passed
    for variant in ("queue", "two_calls"):
        sides = functools.partial(L.train, bug=variant), functools.partial(L.reference, bug=variant)
        assert dist.assert_same_training(*sides, dist.world_size, steps=L.STEPS, record="optimizer").passed


OTHER = {  # bug -> (the first cause, its evidence, the reference's variant)
    "two_calls_weighted": ("the loss weights one forward call's outputs otherwise (several calls, one backward",
                           "each forward call's rows (one backward) by a factor of its own", "two_calls"),
    "perturbed": ("the weights are changed in place between the forward and optimizer.step()",
                  "alike before the first forward) at latent_loops.py:", ""),
}


@world_sizes(2)
@pytest.mark.parametrize("bug", list(OTHER))
def test_a_term_of_another_call_and_weights_moved_before_the_step_are_named(dist, bug):
    """Two forward calls in one backward are no micro-batches; weights that differ at the optimizer step
    after the same start were changed in between, not built otherwise."""
    what, evidence, variant = OTHER[bug]
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, bug=bug), functools.partial(L.reference, bug=variant),
                                  dist.world_size, steps=L.STEPS, record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: " + what) and evidence in line and "micro-batch" not in line, line


@world_sizes(2)
def test_a_queue_refreshed_with_each_rank_s_own_codes_is_named(dist):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, bug="queue_local"), functools.partial(L.reference, bug="queue"),
                                  dist.world_size, steps=L.STEPS, record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: state no optimizer steps is updated in the forward from each rank's own "
                           "rows"), line
    assert "(rank 1 vs rank 0: queue), alike before the first forward" in line, line
    assert "latent_loops.py:" in line, line


@world_sizes(2)
@pytest.mark.parametrize("bug", list(CASES))
def test_the_noise_and_the_kl_term_are_named(dist, bug):
    what, evidence = CASES[bug]
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, bug=bug), L.reference, dist.world_size, steps=L.STEPS,
                                  record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: " + what), line
    assert evidence in line and "latent_loops.py:" in line, line
