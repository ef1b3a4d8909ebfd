"""The tokens a mixture of experts routes (``tests/moe_loops.py``, real 2-rank DDP loops): where each expert
is called on the tokens routed to it, the tokens it received on all ranks together are the reference's;
a capacity counted over the rank's own tokens, or router noise drawn per rank, is named by the first expert
that received other tokens; jitter on the router's input drawn per rank, by the code before the router (the
batch's tokens flattened, ``view(-1, d)``, are read as its rows)."""
import functools

import pytest

from pytest_mgpu import ParityError, world_sizes
from tests import moe_loops as L


def first_cause(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("likely cause: "))


@world_sizes(2)
def test_a_correct_mixture_of_experts_passes(dist):
    assert dist.assert_same_training(L.train, L.reference, dist.world_size, steps=L.STEPS, record="optimizer").passed


@world_sizes(2)
@pytest.mark.parametrize("bug,what,fact", [
    ("capacity_local", "the tokens routed to a module differ", "received other tokens"),
    ("noise_per_rank", "the tokens routed to a module differ", "received other tokens"),
    ("jitter_per_rank", "the model's own code makes a module's input otherwise", "router's input differs first"),
])
def test_the_routing_that_differs_is_named(dist, bug, what, fact):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, bug=bug), L.reference, dist.world_size, steps=L.STEPS, record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: " + what) and fact in line and "moe_loops.py:" in line, line


@world_sizes(2)
def test_a_model_called_with_keywords_that_returns_its_loss_is_read_inside(dist):
    """``model(x=..., target=...)`` returning the loss (a transformers model's call): the trail starts with
    the call, and outputs no gradient reached are compared as they are."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, bug="noise_per_rank", keywords=True),
                                  functools.partial(L.reference, keywords=True), dist.world_size, steps=L.STEPS,
                                  record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: the tokens routed to a module differ") and "received other tokens" in line, line


@world_sizes(2)
def test_experts_split_by_hand_over_ranks_fed_their_own_rows_are_read_as_expert_parallel(dist):
    """Pieces of one tensor (``w``, no name saying experts) on ranks that each fed their own rows: the
    ranks are expert-parallel, each loss its rows' (compared), and a router left out of the all-reduce
    is said as such, not as a tensor-parallel reduce."""
    report = dist.assert_same_training(L.ep_train, L.ep_reference, dist.world_size, steps=L.STEPS,
                                       record="optimizer", shards={"w": 0})
    assert report.passed and any(e.kind == "loss" for e in report.records[0].errors), report
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.ep_train, bug="router_unreduced"), L.ep_reference,
                                  dist.world_size, steps=L.STEPS, record="optimizer", shards={"w": 0})
    text = str(info.value)
    line = text.splitlines()[1]
    assert line.startswith("likely cause: the gradients of modules every rank holds whole (a router or gate, shared "
                           "layers) are not all-reduced across the expert-parallel ranks"), line
    assert "expert-parallel ranks (experts sharded by hand), each with its own rows and loss (ranks 0, 1)" in text, text
