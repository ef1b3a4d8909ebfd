"""The first cause comes from evidence: the first phase of the first diverging step that differs
(``pytest_mgpu.parity.evidence``), cited in the ``likely cause:`` line with its numbers. Each loop
is a real 2-rank run (``tests/evidence_loops.py``); each bug's line must name its phase's evidence
and its cause, and the correct loops pass."""
import functools

import pytest

from pytest_mgpu import ParityError, world_sizes
from tests import evidence_loops as L

P = functools.partial


def first_cause(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("likely cause: "))


@world_sizes(2)
@pytest.mark.parametrize("bug, micro", [("", 1), ("", 2), ("teacher", 1)])
def test_correct_loops_pass(dist, bug, micro):
    report = dist.assert_same_training(P(L.hand_dp, bug=bug, micro=micro), P(L.reference, bug=bug, micro=micro),
                                       dist.world_size, steps=4, record="optimizer")
    assert report.passed


# bug -> (micro-batches, the start of the first cause line, words its evidence must hold)
CASES = {
    "seed_apart": (1, "likely cause: the ranks start from different weights (at step 0 the weights before any "
                      "update already differ between ranks (rank 1 vs rank 0:", "rel)"),
    "rank1_nudge": (1, "likely cause: one rank's update differs (the weights before step 2 differ between ranks "
                       "(rank 1 vs rank 0:", "while up to step 1 they agreed, though their gradients agreed"),
    "sum_no_divide": (1, "likely cause: gradients scaled by the world size (at step 0, with the same weights, every "
                         "gradient is 2x (= the world size 2) the reference's",
                      "backward left each rank its own shard's gradients, so the factor came from the reduction"),
    "gate_not_reduced": (1, "likely cause: gradients of some modules are not synchronized between ranks (at step 0 "
                            "the gradients the optimizer was given differ between ranks", "only in gate"),
    "zero_grad_micro": (2, "likely cause: gradients zeroed between micro-batches (at step 0 every gradient of fn on "
                           "the ranks was zero again before backward pass 2", "Fix: call optimizer.zero_grad() once"),
    "ema_rank0_only": (1, "likely cause: state no optimizer steps differs between ranks", "(rank 1 vs rank 0: "
                                                                                          "Teacher.net."),
    "ema_momentum": (1, "likely cause: state no optimizer steps (an EMA teacher, buffers) is updated otherwise than "
                        "in the reference (before step 1 the state no optimizer steps differs from the reference's",
                     "(Teacher.net.body.weight, "),
}


@world_sizes(2)
@pytest.mark.parametrize("bug", list(CASES))
def test_the_first_cause_cites_its_phase_evidence(dist, bug):
    micro, start, words = CASES[bug]
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.hand_dp, bug=bug, micro=micro), P(L.reference, bug=bug, micro=micro),
                                  dist.world_size, steps=4, record="optimizer")
    line = first_cause(str(info.value))
    print(line)
    assert line.startswith(start), line
    assert words in line, line


@world_sizes(2)
def test_a_precision_floor_is_named_with_its_precision(dist):
    """A bf16 communication hook passes with the line it sets; judged with a float32 rtol, the first
    cause says the difference sits at the bfloat16 level and who rounds there."""
    report = dist.assert_same_training(L.ddp_bf16, L.reference_plain, dist.world_size, record="optimizer")
    assert any("bfloat16 (DDP's bf16_compress_hook)" in n for n in report.notes), report.notes
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(L.ddp_bf16, L.reference_plain, dist.world_size, record="optimizer", rtol=1e-6)
    line = first_cause(str(info.value))
    print(line)
    assert line.startswith("likely cause: gradients differ at the level of a lower precision (bfloat16) (at step 0 "
                           "the gradients differ from the reference's at the bfloat16 level"), line
    assert "DDP's bf16_compress_hook rounds them" in line, line


@world_sizes(2)
def test_a_loss_off_by_one_factor_while_training_agrees_is_noted_not_failed(dist):
    """The loss off by 2x at every step while gradients and parameters agree: a normalisation, noted."""
    report = dist.assert_same_training(P(L.logged, factor=2.0), L.logged_reference, dist.world_size)
    assert report.passed
    assert any(n.startswith("the loss was not judged: it is 2x the reference's at every step") for n in report.notes)


@world_sizes(2)
def test_a_loss_factor_that_changes_is_judged(dist):
    """Not one factor at every step (here 1x, then 2x): the loss is judged, and fails."""
    with pytest.raises(ParityError, match="diverges from one device at step 1"):
        dist.assert_same_training(P(L.logged, factor=2.0, from_step=1), L.logged_reference, dist.world_size)
