"""The power of the parity checks on a new user's AdamW trainer (``adam_trainers.py``): weak real bugs
are caught, correct runs pass, and each failure says what it saw.

- A learning rate 1% off from step 10 of a 20-step run: the gradients' line is their own, not the
  parameters' (AdamW's chaos in a key bias once widened it to 28% of a parameter).
- A resume at the same world size whose first steps reproduced the uninterrupted run bit for bit is
  judged bitwise: a forgotten scheduler, or a learning rate 0.1% off, fails as "not bitwise".
- Accumulation without dividing the loss, hidden by clipping: named from the norms clipped.
- ``fn_kwargs`` / ``reference_kwargs``: a keyword for one side only, and the report line naming them.
The same measurements, graded and repeated: ``benchmarks/parity/parity_power.py``."""
import functools

import pytest

from pytest_mgpu import ParityError, world_sizes
from pytest_mgpu.parity.judge.tolerance import pooled_floors
from pytest_mgpu.parity.records import StepRecord, TensorError
from tests import adam_trainers as A

P = functools.partial


@world_sizes(2)
def test_a_learning_rate_one_percent_off_from_step_10_is_caught_and_the_correct_run_passes(dist):
    report = dist.assert_same_training(P(A.train, True), P(A.train, False), steps=20, record="optimizer")
    print(report.format().splitlines()[0])
    assert report.worst_ratio < 0.2  # a wide margin, on a shared machine too
    with pytest.raises(ParityError) as failure:
        dist.assert_same_training(P(A.train, True, bug_lr=0.01), P(A.train, False), steps=20, record="optimizer")
    failed = failure.value.report
    print(str(failure.value).splitlines()[0])
    assert failed.first_divergence == 10  # the step whose lr differs: the options are judged exactly
    assert [(d.option, d.step) for d in failed.option_differences] == [("lr", 10)]
    assert min(s for s, _, _ in failed.failures()) == 11  # the first step that saw the changed update
    assert {e.kind for s, e, _ in failed.failures() if s == 11} >= {"grad"}


@world_sizes(2)
@pytest.mark.parametrize("bug", [{"forget_scheduler": True}, {"resumed_lr": 1e-3}], ids=["scheduler", "lr"])
def test_a_resume_that_reproduces_itself_is_judged_bitwise(dist, bug):
    ok = dist.assert_resumes(A.resumable, steps=20, stop_after=14)
    assert ok.bitwise and ok.exact
    with pytest.raises(ParityError) as failure:
        dist.assert_resumes(P(A.resumable, **bug), steps=20, stop_after=14)
    first = str(failure.value).splitlines()[0]
    print(first)
    assert first.startswith("not bitwise: at step 1")
    assert first.endswith("the resumed run differs from the uninterrupted one, whose first 14 steps the interrupted "
                          "run reproduced exactly")
    assert "tolerance: bitwise (a correct resume on these kernels is bitwise equal here" in str(failure.value)


@world_sizes(2)
def test_accumulation_without_dividing_the_loss_is_named_though_clipping_hides_it(dist):
    with pytest.raises(ParityError) as failure:
        dist.assert_same_training(A.accumulate, A.accumulate, steps=3, record="optimizer",
                                  fn_kwargs={"ddp": True, "divide": False}, reference_kwargs={"ddp": False})
    lines = str(failure.value).splitlines()
    print("\n".join(lines[:2]))
    assert "keywords" not in lines[0]  # they are a note: the cause stays on the second line
    assert "note: keywords: fn got ddp=True, divide=False; reference_fn got ddp=False" in lines
    assert lines[1].startswith("likely cause: gradient accumulation without dividing the loss (at step 0, with the "
                               "same weights, the ranks' loss is 4x (= the 4 backward passes per step) the reference's)")
    assert "Fix: backpropagate loss / 4" in lines[1]
    assert "DTensor" not in str(failure.value)


def _param(name: str, floor: float, norm: float = 1.0) -> TensorError:
    return TensorError("param", name, (4,), 0.0, 1.0, floor=floor, norm_ref=norm, numel=4)


def test_a_chaotic_tensor_keeps_its_own_floor_and_sets_no_line_of_the_others():
    """AdamW's roundoff-signed steps in a key bias: 1e-2 against 1e-7 for every other tensor."""
    steady = [_param(f"w{i}", 1e-7 * (1 + i / 10)) for i in range(6)]
    records = [StepRecord(0, steady + [_param("attn.in_proj_bias", 1e-2)])]
    pooled, own = pooled_floors(records)
    assert pooled[(0, "param")] == pytest.approx(1.5e-7)
    assert own[(0, "param", "attn.in_proj_bias")] == pytest.approx(1e-2)
    # without the outlier's chaos, nothing changes: every tensor is typical
    assert pooled_floors([StepRecord(0, steady)])[0][(0, "param")] == pytest.approx(1.5e-7)


@world_sizes(2)
def test_a_bug_in_the_last_update_alone_is_caught(dist):
    """Stopped after 4 of 6 steps, resumed from step 4, and the 6th update alone 0.1% off (as a scheduler
    not restored can be, where the optimizer's state brings back the first resumed step's learning
    rate): no later step's record shows it, the parameters after the last step do."""
    dist.assert_resumes(P(A.resumable, steps=6), steps=6, stop_after=4)
    with pytest.raises(ParityError) as failure:
        dist.assert_resumes(P(A.resumable, steps=6, last_lr=1e-3), steps=6, stop_after=4)
    first = str(failure.value).splitlines()[0]
    print(first)
    assert first.startswith("not bitwise: after the last step (step 6) the resumed run's parameters differ")
