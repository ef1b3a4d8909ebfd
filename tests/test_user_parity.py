"""dist.assert_parity(parallel_fn, model_fn, batch_fn): the user's own hand-written pipeline
(tests/user_bugs.TwoStage, in seed 004's style) against the plain model, step by step."""
import functools

import pytest

from pytest_mgpu import world_sizes
from pytest_mgpu.launch.errors import RankFailure
from pytest_mgpu.parity import ParityError
from tests import user_bugs as B


def _pipe(split_size=4, bug="", norm="group"):
    return functools.partial(B.TwoStage, split_size, bug, norm)


@world_sizes(2, 4)
@pytest.mark.parametrize("split_size", [8, 4, 3, 1])
def test_correct_pipeline_passes(dist, split_size):
    report = dist.assert_parity(_pipe(split_size), B.cnn, B.image_batch, steps=3)
    assert report.passed
    assert report.facts.microbatches == -(-8 // split_size)  # counted from the user's forward calls
    assert all(e.floor == e.floor for e in report.errors("grad"))  # a float64 shadow measured it


@world_sizes(2)
@pytest.mark.parametrize("bug,hint", [
    ("detach", "stage 'front' gets no gradient"),
    ("reversed", "the output rows are the reference's in another order"),
])
def test_pipeline_bug_is_caught_with_its_hint(dist, bug, hint):
    with pytest.raises(ParityError) as info:
        dist.assert_parity(_pipe(4, bug), B.cnn, B.image_batch, steps=2)
    assert hint in str(info.value).split("likely causes:", 1)[1], str(info.value)


@world_sizes(2)
def test_batchnorm_over_microbatches_is_named(dist):
    """The first cause names the micro-batches: parameters compared after a step's update are no
    evidence of where training started (a fact of assert_parity's run), so no start is said."""
    with pytest.raises(ParityError) as info:
        dist.assert_parity(_pipe(4, norm="batch"), functools.partial(B.cnn, "batch"), B.image_batch, steps=2)
    first = next(line for line in str(info.value).splitlines() if line.startswith("likely cause:"))
    assert "normalize each of 2 micro-batches" in first and "start from" not in first, first


@world_sizes(2)
def test_names_that_match_nothing_are_listed(dist):
    with pytest.raises(RankFailure) as info:
        dist.assert_parity(_pipe(4), B.mlp, B.image_batch, steps=1)
    text = str(info.value)
    assert "ParamNameError" in text and "same name, another shape (user vs reference): 0.weight (8, 3, 3, 3) vs (32, 20)" in text
    assert "in the user's module only (8): 1.weight = front.1.weight, 1.bias = front.1.bias" in text
