"""How each side ran the step that diverged, said as the cause where it is the evidence: a training
forward in eval mode (``model.train()`` not called back after validation), a validation forward in
training mode (no ``eval()``), a validation loss backpropagated (an extra backward), an optimizer step
skipped on one rank. Real DDP loops on
2 gloo ranks (tests/conduct_loops.py); a correct loop that validates on rank 0 only passes."""
import functools

import pytest

from pytest_mgpu import world_sizes
from pytest_mgpu.parity import ParityError
from pytest_mgpu.parity.training import StepCountError
from tests import conduct_loops as C


def _cause(dist, bug):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(C.train, bug=bug), C.reference, dist.world_size,
                                  steps=C.STEPS, record="optimizer")
    lines = str(info.value).splitlines()
    assert lines[1].startswith("likely cause:"), lines[:3]
    return lines[1]


@world_sizes(2)
def test_validation_on_rank_0_alone_passes(dist):
    dist.assert_same_training(functools.partial(C.train, bug="rank0_validates"), C.reference, dist.world_size,
                              steps=C.STEPS, record="optimizer")


@world_sizes(2)
def test_a_model_left_in_eval_after_validation_is_named_at_its_forward(dist):
    cause = _cause(dist, "left_in_eval")
    assert "another mode (train/eval)" in cause and "ran with modules in eval mode" in cause, cause
    assert "conduct_loops.py:" in cause and "model.train()" in cause, cause


@world_sizes(2)
def test_validation_without_eval_is_named_as_a_no_grad_forward_in_training_mode(dist):
    cause = _cause(dist, "no_eval")
    assert "validation forward (under no_grad) runs in training mode" in cause, cause
    assert "conduct_loops.py:" in cause, cause


@world_sizes(2)
def test_a_validation_loss_backpropagated_is_an_extra_backward(dist):
    cause = _cause(dist, "val_backward")
    assert "a loss the reference does not backpropagate" in cause, cause
    assert "backpropagated 2 losses, 1 at step 0" in cause and "conduct_loops.py:" in cause, cause


@world_sizes(2)
def test_an_optimizer_step_skipped_on_one_rank_is_named_not_blamed_on_the_data(dist):
    with pytest.raises(StepCountError) as info:
        dist.assert_same_training(functools.partial(C.train, bug="skip_step"), C.reference, dist.world_size,
                                  steps=C.STEPS, record="optimizer")
    text = str(info.value)
    assert text.splitlines()[1].startswith("likely cause: an optimizer.step() taken on some ranks only (the ranks "
                                           "took different numbers of optimizer steps: rank 0: 5, rank 1: 4)"), text
    assert "ran out of data" not in text, text
