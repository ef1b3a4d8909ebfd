"""Optimizers that do not step with ``.grad`` as the loop left it (``tests/own_grad_loops.py``): Megatron's
``main_grad`` is read where ``.grad`` is None, and a reference that zeroes its gradients between its blocks
and steps with a sum of its own is judged on its weights at those steps (its ``.grad`` is not what it
trains with); the bugs are still caught."""
import functools

import pytest

from pytest_mgpu import ParityError, world_sizes
from tests import own_grad_loops as L

CASES = {"main_grad": (L.main_grad_train, L.main_grad_reference),
         "summing reference": (L.plain_train, L.summing_reference)}


@world_sizes(2)
@pytest.mark.parametrize("case", list(CASES))
def test_the_correct_loop_passes(dist, case):
    fn, ref = CASES[case]
    report = dist.assert_same_training(fn, ref, dist.world_size, steps=L.STEPS, record="optimizer")
    assert report.passed
    if case == "summing reference":
        assert any("keeps them elsewhere" in n or "judged on the weights" in n for n in report.facts.loop_notes)


@world_sizes(2)
@pytest.mark.parametrize("case", list(CASES))
def test_a_gradient_summed_and_never_divided_fails(dist, case):
    fn, ref = CASES[case]
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(fn, bug="sum_not_mean"), ref, dist.world_size, steps=L.STEPS,
                                  record="optimizer")
    if case == "main_grad":  # the gradients were read: their factor is the cause
        assert "likely cause: gradients scaled by the world size" in str(info.value), str(info.value)[:600]
    else:  # the reference's loss is the sum of its 2 passes': no loss cause; the update is 2x the reference's
        line = next(x for x in str(info.value).splitlines() if x.startswith("likely cause: "))
        assert line.startswith("likely cause: every update is the world size x the reference's"), line
