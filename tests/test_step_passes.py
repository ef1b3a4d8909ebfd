"""Steps of more than one pass (``tests/pass_loops.py``), real 2- and 4-rank loops: what the run shows of
its passes leads the cause. Gradients kept between SAM's two passes where the reference zeroes them; an
optimizer step per micro-batch where the reference accumulates two; a gradient penalty's
``torch.autograd.grad`` is no loss weighting its call otherwise (the rows fed lead); and in a 2-D layout by
hand, replicas whose gradients differ while each tensor-parallel group agrees name the data-parallel group.
A reference that runs BatchNorm on blocks of a rank's size puts no difference on the ranks' statistics. An
optimizer written in the loop's file: how its update differs names the part of it that does. A model called
with the whole batch, inside torch.func transforms, or without an argument the reference passes."""
import functools

import pytest

from pytest_mgpu import ParityError, world_sizes
from tests import pass_loops as L
from tests import update_loops as U

CASES = {  # (kind, bug) -> what the first cause starts with, and a fact it states
    ("sam", "kept"): ("gradients not zeroed between the backward passes of a step, where the reference zeroes them",
                      "reference_fn's gradients were zero again before backward pass 2 of 2, fn's on the ranks never"),
    ("accum", "micro_step"): ("the ranks step the optimizer (and scaler, scheduler) on every micro-batch",
                              "1 backward pass per step on the ranks, 2 in the reference"),
    ("penalty", "unsharded"): ("the data is not sharded", "every one of the 2 data-parallel ranks fed the same"),
}


def first_cause(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("likely cause: "))


@world_sizes(2)
@pytest.mark.parametrize("kind", ["sam", "accum", "penalty", "ghost"])
def test_the_correct_loops_pass(dist, kind):
    sides = functools.partial(L.train, kind=kind), functools.partial(L.reference, kind=kind)
    assert dist.assert_same_training(*sides, dist.world_size, steps=L.STEPS, record="optimizer").passed


@world_sizes(2)
@pytest.mark.parametrize("kind,bug", list(CASES))
def test_the_passes_of_a_step_lead_the_cause(dist, kind, bug):
    what, fact = CASES[kind, bug]
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, kind=kind, bug=bug),
                                  functools.partial(L.reference, kind=kind), dist.world_size, steps=L.STEPS,
                                  record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: " + what) and fact in line, line
    assert "call's rows" not in str(info.value), "a penalty's autograd.grad read as a loss gradient"


@world_sizes(2)
def test_batchnorm_is_no_cause_where_the_reference_normalises_blocks_of_a_rank_s_size(dist):
    """The reference runs its BatchNorm on blocks of a rank's rows (ghost BatchNorm): the ranks' own
    statistics are what it computes, so another difference in the forward is not put on them."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, kind="ghost", bug="temperature"),
                                  functools.partial(L.reference, kind="ghost"), dist.world_size, steps=L.STEPS,
                                  record="optimizer")
    line = first_cause(str(info.value))
    assert "the model's forward computes otherwise" in line and "BatchNorm" not in str(info.value), line


@world_sizes(4)
def test_replicas_of_a_2d_layout_name_the_data_parallel_group(dist):
    check = functools.partial(dist.assert_same_training, reference_fn=L.reference_2d, world_size=dist.world_size,
                              steps=L.STEPS, record="optimizer", shards=L.SHARDS_2D)
    assert check(L.train_2d).passed
    with pytest.raises(ParityError) as info:
        check(functools.partial(L.train_2d, bug="no_dp_reduce"))
    text = str(info.value)
    line = first_cause(text)
    assert line.startswith("likely cause: gradients not reduced across the data-parallel group"), line
    assert "data-parallel groups: ranks 0, 2; ranks 1, 3" in line, line
    assert "data-parallel replicas across those groups (ranks 0, 2; ranks 1, 3)" in text, text


UPDATES = {  # the ranks' optimizer bug -> what the first cause starts with, and its evidence
    "decay_1d": ("the optimizer updates the 1-D parameters (biases, norm weights) otherwise",
                 "only 1-D tensors (biases, norm weights) update otherwise; every matrix's update agrees"),
    "global_trust": ("the optimizer updates the weight matrices otherwise (the 1-D parameters agree)",
                     "only the matrices update otherwise"),
    "scaled": ("the optimizer scales its whole update otherwise with the same learning rate",
               "each update is 1.1x the reference's, in its direction"),
    "ema_swapped": ("weights that get no gradient are updated otherwise",
                    "none of them gets a gradient on either side"),
    # the loop's own SGD that scales matrices by their shape (tests/update_loops.py)
    "inverted": ("the optimizer computes a shape scale of the updates otherwise",
                 "each update is the reference's scaled by a factor set by the tensor's shape (0.612x for 16x6, 0.707x"),
    "placed": ("the step writes a tensor's result into another tensor's place", "4.weight holds the reference's 8.weight"),
    "row_normalised": ("the optimizer's own rule for the weight matrices computes their update in another direction",
                       "only the matrices update otherwise, in another direction than the reference's"),
    "decay_matrices": ("the optimizer updates the weight matrices otherwise (the 1-D parameters agree)",
                       "only the matrices update otherwise, each by a multiple of its weights (a weight decay)"),
}
SHAPED = ("inverted", "placed", "row_normalised", "decay_matrices")


@world_sizes(2)
@pytest.mark.parametrize("bug", ["", "shaped"] + list(UPDATES))
def test_how_the_update_differs_names_the_part_of_the_optimizer(dist, bug):
    """With the same weights and gradients, each tensor's update against the reference's: which tensors
    differ (1-D ones, matrices, those with no gradient) and how (one factor, one per tensor shape, a multiple
    of the weights, another direction, another tensor's result) says which part of the step. Both
    optimizers are the loops' own: the step is located where it is written."""
    train, reference, where = (U.train, U.reference, "ShapeScaled.step at update_loops.py:") \
        if bug in SHAPED + ("shaped",) else (L.train_opt, L.reference_opt, "Trust.step at pass_loops.py:")
    check = functools.partial(dist.assert_same_training, reference_fn=reference, world_size=dist.world_size,
                              steps=L.STEPS, record="optimizer")
    if bug in ("", "shaped"):
        assert check(train).passed
        return
    what, evidence = UPDATES[bug]
    with pytest.raises(ParityError) as info:
        check(functools.partial(train, bug=bug))
    text = str(info.value)
    line = first_cause(text)
    assert line.startswith("likely cause: " + what) and evidence in text.split("likely causes:")[1], text
    assert f"(optimizer.step; {where}" in text.split("likely causes:")[1], "where its step is written"


@world_sizes(2)
def test_experts_sharded_by_hand_name_the_expert_parallel_ranks(dist):
    """Experts split over the ranks by hand, the gate whole on each: a gate gradient left unreduced is
    that module's all-reduce across the expert-parallel ranks, not a tensor-parallel plan."""
    check = functools.partial(dist.assert_same_training, reference_fn=L.reference_moe, world_size=dist.world_size,
                              steps=L.STEPS, record="optimizer")
    assert check(L.train_moe).passed
    with pytest.raises(ParityError) as info:
        check(functools.partial(L.train_moe, bug="gate_unreduced"))
    text = str(info.value)
    line = first_cause(text)
    assert line.startswith("likely cause: the gradients of modules every rank holds whole (a router or gate, shared "
                           "layers) are not all-reduced across the expert-parallel ranks") and "only in gate" in line, line
    assert "expert-parallel ranks (experts sharded by hand) share one batch" in text and "parallelize_module" not in line


@world_sizes(2)
def test_a_model_run_inside_torch_func_transforms_is_recorded_and_judged(dist):
    """Per-sample gradients (DP-SGD's clipping) run the model inside vmap(grad(...)): the recorder leaves
    those calls alone (their tensors have no storage to read), and the loop is judged on its steps."""
    check = functools.partial(dist.assert_same_training, reference_fn=L.reference_per_sample,
                              world_size=dist.world_size, steps=L.STEPS, record="optimizer")
    assert check(L.train_per_sample).passed
    with pytest.raises(ParityError):
        check(functools.partial(L.train_per_sample, bug="clip"))


BATCHES = {  # how the batch is passed -> the ranks' bug, what the first cause starts with
    "tuple": ("unsharded", "the data is not sharded (at step 0 every one of the 2 data-parallel ranks fed the same 4 rows"),
    "dict": ("targets", "the loss differs with the same weights, and the rows could not be compared: another batch"),
}


@world_sizes(2)
@pytest.mark.parametrize("kind", list(BATCHES))
def test_a_model_called_with_the_whole_batch(dist, kind):
    """A module whose forward takes the batch, as a LightningModule's step does: the rows are read from
    the first tensor of a tuple; where they cannot be read (a dict), no cause says "the same rows"."""
    sides = functools.partial(L.train_batch, kind=kind), functools.partial(L.reference_batch, kind=kind)
    assert dist.assert_same_training(*sides, dist.world_size, steps=L.STEPS, record="optimizer").passed
    bug, what = BATCHES[kind]
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train_batch, kind=kind, bug=bug), sides[1],
                                  dist.world_size, steps=L.STEPS, record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: " + what), line
    assert "With the same weights and rows" not in str(info.value)  # they are not the same (tuple) or not seen (dict)


@world_sizes(2)
def test_an_argument_left_out_of_the_model_s_call_is_named(dist):
    """The reference passes its model a mask by keyword and the ranks leave it out: the call's arguments
    are the evidence, not "the forward computes otherwise"."""
    check = functools.partial(dist.assert_same_training, reference_fn=L.reference_masked, world_size=dist.world_size,
                              steps=L.STEPS, record="optimizer")
    assert check(L.train_masked).passed
    with pytest.raises(ParityError) as info:
        check(functools.partial(L.train_masked, bug="no_mask"))
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: the model is called with another set of arguments than in the reference") \
        and "reference_fn passes the model mask, the ranks do not" in line, line


TWO = {  # the ranks' bug in a loop with two optimizers -> what the first cause starts with
    "trunk_scaled": "the optimizer steps otherwise than the reference's",
    "head_lr_world": "the ranks' learning rate is world size x the reference's",
}


@world_sizes(2)
@pytest.mark.parametrize("bug", [""] + list(TWO))
def test_a_loop_with_two_optimizers(dist, bug):
    """The trunk's parameters are another optimizer's, not state no optimizer steps; an lr off by the world
    size in one optimizer (the other's steps agree) is that factor. (Each step records its own optimizer's
    parameters, so how the trunk's update differs is not read: the generic update cause leads.)"""
    check = functools.partial(dist.assert_same_training, reference_fn=L.reference_two, world_size=dist.world_size,
                              steps=2 * L.STEPS, record="optimizer")
    if not bug:
        assert check(L.train_two).passed
        return
    with pytest.raises(ParityError) as info:
        check(functools.partial(L.train_two, bug=bug))
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: " + TWO[bug]) and "state no optimizer steps" not in line, line


@world_sizes(2)
def test_gradients_a_loop_sets_itself_are_said_so(dist):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train_per_sample, bug="clip"), L.reference_per_sample,
                                  dist.world_size, steps=L.STEPS, record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: the gradients the loop sets itself differ with the same weights (no "
                           "backward pass ran"), line

