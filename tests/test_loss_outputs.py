"""The loss read from the model's outputs (``record/probe.py``, ``evidence/outputs.py``): with the same
weights, rows and outputs at the first step, how the gradient the loss gave each output row differs
names how the loss is computed otherwise. Real 2-rank loops (``tests/token_loops.py``) for what the
recording carries end to end; the classifier on made-up probes for each pattern, and for the patterns
that must say nothing (one factor for every row, outputs that differ)."""
import functools

import pytest
import torch

from pytest_mgpu import ParityError, world_sizes
from pytest_mgpu.parity.evidence import outputs
from pytest_mgpu.parity.evidence.facts import UserFacts
from pytest_mgpu.parity.record.probe import Probe, condensed
from tests import token_loops as L


def first_cause(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("likely cause: "))


@world_sizes(2)
def test_the_correct_loop_passes(dist):
    assert dist.assert_same_training(L.train, L.reference, dist.world_size, steps=L.STEPS, record="optimizer").passed


CASES = {
    "mask_last": ("a mask leaves out of the ranks' loss positions the reference's counts",
                  "the last of each such row"),
    "unshifted": ("the targets are aligned one position otherwise",
                  "reads each row's outputs one position later"),
    "weights_local": ("per-row loss weights differ", "per-row factors"),
    "detached_pos": ("the model's backward differs (same outputs and loss gradient)",
                     "only the gradients of pos"),
    "scale_kept": ("the loss backpropagated is multiplied by a loss scale on one side only (a power of two",
                   "6.554e+04x"),
}


@world_sizes(2)
@pytest.mark.parametrize("bug", list(CASES))
def test_a_loss_built_otherwise_from_the_same_outputs_is_named(dist, bug):
    what, evidence = CASES[bug]
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, bug=bug), L.reference, dist.world_size, steps=L.STEPS,
                                  record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: " + what), line
    assert evidence in line and ("with the same weights and outputs" in line or bug in ("scale_kept", "detached_pos")), line
    assert "token_loops.py:" in line or bug == "detached_pos", line  # the backward's line (no room beside that evidence)


def probe(rows, out, grad):
    return Probe(list(rows), [(float(o), 1.0 + abs(float(o))) for o in out], condensed(grad), tuple(grad.shape))


def facts(rank_grads, ref_grad, outs=None):
    """Two ranks of 2 rows each against a reference of 4 rows: the same outputs unless ``outs`` says."""
    f = UserFacts("hand DP", 2)
    f.ref_probes = [probe([1, 2, 3, 4], [10, 20, 30, 40], ref_grad)]
    outs = outs or [[10, 20], [30, 40]]
    f.rank_probes = [[probe([1 + 2 * r, 2 + 2 * r], outs[r], g)] for r, g in enumerate(rank_grads)]
    return f


def signal(f):
    found = outputs.findings(None, f)
    return found[0].signal if found else None


def test_each_pattern_of_the_output_gradients():
    torch.manual_seed(0)
    h = torch.randn(4, 5, 3)
    assert signal(facts([2 * h[:2], 2 * h[2:]], h)) is None  # one factor (the world size of a mean): nothing
    assert signal(facts([2 * h[:2], 3 * h[2:]], h)) == "loss-rank-scale"
    w = torch.tensor([1.0, -2.0, 0.5, 3.0])[:, None, None]
    assert signal(facts([(w * h)[:2], (w * h)[2:]], h)) == "loss-row-weights"
    assert signal(facts([h[[1, 0]], h[2:]], h)) == "loss-rows-moved"
    cut = h.clone()
    cut[:, -1] = 0
    assert signal(facts([cut[:2], cut[2:]], h)) == "loss-positions"
    assert signal(facts([h[:2], h[2:]], cut)) == "loss-positions-extra"
    shifted = torch.zeros_like(h)
    shifted[:, 1:] = h[:, :-1]
    early = h.clone()
    early[:, -1] = 0
    assert signal(facts([shifted[:2], shifted[2:]], early)) == "loss-shift"
    assert signal(facts([torch.randn(2, 5, 3), torch.randn(2, 5, 3)], h)) == "loss-formula"
    # outputs that differ: the forward differs, and nothing is said from here
    assert signal(facts([2 * h[:2], 3 * h[2:]], h, outs=[[10, 21], [30, 40]])) is None


@world_sizes(2)
def test_rows_masked_by_a_draw_per_rank_are_the_reference_rows_transformed(dist):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, bug="mask_local"), L.reference, dist.world_size,
                                  steps=L.STEPS, record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: the ranks' rows are the reference's transformed otherwise"), line
    assert "fed instead near one (" in line and "rank 0's all the reference's" in line and "token_loops.py:" in line, line


@world_sizes(2)
def test_a_model_called_with_keywords_alone_has_its_rows_read(dist):
    train = functools.partial(L.train, bug="keywords")
    assert dist.assert_same_training(train, L.reference, dist.world_size, steps=L.STEPS, record="optimizer").passed
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, bug="keywords_overlap"), L.reference, dist.world_size,
                                  steps=L.STEPS, record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: the sides saw different batches (at step 0 "), line


FORWARD = {  # bug -> (the first cause, what the trail names): a forward computed otherwise inside the model
    "token_drop": ("the model's own code makes a module's input otherwise", "mix's input differs first"),
    "mix_reduced": ("a module computes otherwise from the same input", "the output of mix (Mix) differs first"),
    "keep_off": ("the loop feeds the model another input beside the rows", "the model's argument keep differs"),
    "scale_by_position": ("the loop feeds the model another input beside the rows",
                          "the model's argument scale differs"),
    "inside_token_drop": ("the model's own code makes a module's input otherwise", "mix's input differs first"),
}


@world_sizes(2)
@pytest.mark.parametrize("bug", list(FORWARD))
def test_a_forward_computed_otherwise_is_placed_inside_the_model(dist, bug):
    what, where = FORWARD[bug]
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.train, bug=bug), functools.partial(L.reference, bug=bug),
                                  dist.world_size, steps=L.STEPS, record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: " + what), line
    assert where in line and "token_loops.py:" in line, line
    assert "(mix)" in line or bug in ("keep_off", "scale_by_position"), line  # the line calling that module; the model's call for its input


@world_sizes(2)
def test_a_model_that_returns_its_loss_passes_when_correct(dist):
    inside = functools.partial(L.train, bug="inside"), functools.partial(L.reference, bug="inside")
    assert dist.assert_same_training(*inside, dist.world_size, steps=L.STEPS, record="optimizer").passed
