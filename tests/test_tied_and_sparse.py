"""Ranks that hold the reference's tensors otherwise (``tests/tied_loops.py``, real 2-rank loops): a
pipeline's last stage keeping its own copy of a tied embedding is judged against the tensor it copies
(a correct loop passes), and a copy that starts otherwise is named as such; a sparse embedding's
gradients are recorded (a correct loop passes; the ranks crashed on them before)."""
import functools

import pytest

from pytest_mgpu import ParityError, world_sizes
from tests import tied_loops as L


def first_cause(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("likely cause: "))


@world_sizes(2)
@pytest.mark.parametrize("tied_modules", [False, True], ids=["embedding-used", "modules-tied"])
def test_a_pipeline_with_a_tied_embedding_copy_passes(dist, tied_modules):
    """The reference uses the embedding as its output layer, or ties an output module to it (one tensor
    named twice): either way the last stage's copy is judged against it."""
    result = dist.assert_same_training(L.pipeline, functools.partial(L.pipeline_reference, tied_modules=tied_modules),
                                       dist.world_size, steps=L.STEPS, record="optimizer")
    assert result.passed


@world_sizes(2)
def test_a_tied_copy_that_starts_otherwise_is_the_cause(dist):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.pipeline, bug="copy_not_synced"), L.pipeline_reference,
                                  dist.world_size, steps=L.STEPS, record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: a copy of a tied weight starts from other values") and \
        "output.weight has the shape of the reference's embedding.weight" in line, line


@world_sizes(2)
def test_a_sparse_embedding_under_ddp_passes(dist):
    result = dist.assert_same_training(L.sparse_ddp, L.sparse_reference, dist.world_size, steps=L.STEPS,
                                       record="optimizer")
    assert result.passed
