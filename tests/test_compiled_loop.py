"""A compiled model in the user's loop (``torch.compile(DDP(model))``): the recording's global module hooks
run outside the traced graph, so the check judges the loop instead of breaking its compilation."""
import functools

import pytest

from pytest_mgpu import ParityError, world_sizes
from tests import compiled_loops as L


@world_sizes(2)
def test_a_compiled_ddp_loop_passes(dist):
    assert dist.assert_same_training(L.train, L.reference, dist.world_size, steps=L.STEPS, record="optimizer").passed


@world_sizes(2)
def test_a_compiled_ddp_loop_with_a_summed_loss_fails_on_its_loss(dist):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, bug="sum"), L.reference, dist.world_size, steps=L.STEPS, record="optimizer")
    line = next(x for x in str(info.value).splitlines() if x.startswith("likely cause: "))
    assert "loss" in line and "compiled_loops.py:" in line, line  # judged on its loss, at its own line
