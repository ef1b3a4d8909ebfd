"""The first cause comes from evidence: the first phase of the first diverging step that differs
(``pytest_mgpu.parity.evidence``), cited in the ``likely cause:`` line with its numbers. Each loop
is a real 2-rank run (``tests/evidence_loops.py``); each bug's line must name its phase's evidence
and its cause, and the correct loops pass."""
import functools

import pytest

from pytest_mgpu import ParityError, StepCountError, world_sizes
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
                      "backward left each rank its own shard's gradients"),
    "gate_not_reduced": (1, "likely cause: gradients of some modules are not synchronized between ranks (at step 0 "
                            "the gradients the optimizer was given differ between ranks", "only in gate"),
    "zero_grad_micro": (2, "likely cause: gradients zeroed between micro-batches (at step 0 every gradient of fn on "
                           "the ranks was zero again before backward pass 2", "Fix: call optimizer.zero_grad() once"),
    "ema_rank0_only": (1, "likely cause: the EMA copy (a teacher, an averaged model) is updated on some ranks only "
                          "(before step 1 only rank 0 updated its EMA copy (momentum 0.9, as the reference's)",
                       "rank 1's did not move (momentum 1)"),
    "ema_late_rank0": (1, "likely cause: the EMA copy (a teacher, an averaged model) is updated on some ranks only "
                          "(before step 2 only rank 0 updated and ran its EMA or averaged copy of the model "
                          "(Teacher.net.", "as the reference does; rank 1 ran none"),
    "ema_momentum": (1, "likely cause: the EMA's momentum differs from the reference's (before step 1 the EMA's "
                        "momentum was 0.8, 0.8, 0.8 on rank 0, 0.9, 0.9, 0.9 in the reference", ""),
    "ema_copied_early": (1, "likely cause: an EMA copy (a teacher) differs between ranks from the start: copied from "
                            "each rank's own weights before they were synchronised", "(rank 1 vs rank 0: Teacher.net."),
    "ema_late_momentum": (1, "likely cause: the EMA's momentum differs from the reference's (before step 2 the EMA's "
                             "momentum was 0.8, 0.8 on rank 0, 0.9, 0.9 in the reference", ""),
    "ema_warm": (1, "likely cause: the EMA's momentum lacks the reference's warm-up (a fixed decay from the first step) "
                    "(before step 1 the EMA's momentum was 0.9, 0.9, 0.9 on rank 0, 0, 0.5, 0.6667 in", "is fixed"),
    "ema_ahead": (1, "likely cause: the EMA is updated before the optimizer step (or once more at the start): it runs "
                     "an update ahead (before step 1 the EMA's momentum was 0.5, 0.6667, 0.75 on rank 0, 0, 0.5, 0.6667 "
                     "in the reference", "runs one update ahead"),
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


def _line_of(fn, text: str) -> str:
    """``evidence_loops.py:<n>``: where ``text`` is in ``fn``'s source (no line number written here)."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return f"evidence_loops.py:{start + next(i for i, line in enumerate(lines) if text in line)}"


@world_sizes(2)
def test_the_first_cause_names_the_line_that_made_its_phase(dist):
    """Gradients summed and not divided: the cause points between the loop's backward and its
    optimizer.step, where the reduction is."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.hand_dp, bug="sum_no_divide"), P(L.reference, bug="sum_no_divide"),
                                  dist.world_size, steps=4, record="optimizer")
    line = first_cause(str(info.value))
    print(line)
    backward, step = _line_of(L.hand_dp, "(loss / micro).backward()"), _line_of(L.hand_dp, "opt.step()")
    assert f"at {backward} (backward) to :{step.rsplit(':', 1)[1]} (optimizer.step). Fix: " in line, line


@world_sizes(2)
def test_a_schedule_stepped_per_micro_batch_is_judged_and_located(dist):
    """The lr schedule is judged at every step; the cause names the scheduler.step line."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.scheduled, bug="sched_micro", micro=2, steps=6),
                                  P(L.scheduled, bug="sched_micro", micro=2, reference=True, steps=6),
                                  dist.world_size, steps=6, record="optimizer")
    text = str(info.value)
    head, line = text.splitlines()[:2]
    print(head, line, sep="\n")
    assert "diverges from one device at step 0 (of 6): " in head, head
    assert "13 of 25 tensors exceed the tolerance from step 1; the optimizer's lr differs from step 0" in head, head
    assert "note: the optimizer's lr differs: 0.0245 on the ranks, 0.05 in the reference (param group 0, from step 0)" \
        in text, text
    assert line.startswith("likely cause: the scheduler is stepped per micro-batch ("), line
    assert f"at {_line_of(L.scheduled, 'sched.step()  # the scheduler stepped per micro-batch')} (scheduler.step). " \
           "Fix: call scheduler.step() right after" in line, line
    assert "Fix: call scheduler.step() right after optimizer.step(), once per step. Each micro-batch's backward is " \
           "followed by a scheduler step" in text, text


@world_sizes(2)
@pytest.mark.parametrize("bug, cause, rate", [
    ("sched_first", "the learning rate schedule runs ahead of the reference's", "at step s + 1: their schedule runs 1 "
                                                                                "step(s) ahead"),
    ("sched_epoch", "the ranks' learning rate schedule never moves", "the ranks' lr stays 0.05 at every step"),
])
def test_a_schedule_off_by_a_step_or_never_stepped_is_said_with_its_rate(dist, bug, cause, rate):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.scheduled, bug=bug, steps=4), P(L.scheduled, bug=bug, reference=True, steps=4),
                                  dist.world_size, steps=4, record="optimizer")
    line = str(info.value).splitlines()[1]
    assert line.startswith(f"likely cause: {cause} (") and rate in line, line


@world_sizes(2)
def test_a_loss_counted_otherwise_beside_the_same_gradients_is_no_cause(dist):
    """The reference backpropagates the W blocks' losses one by one (its logged loss is W x the ranks'),
    with the same gradients at step 0: the schedule that never moves is the cause, not the loss."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.scheduled, bug="sched_epoch"), P(L.scheduled, reference=True, blocks=True),
                                  dist.world_size, steps=4, record="optimizer")
    line = str(info.value).splitlines()[1]
    assert line.startswith("likely cause: the ranks' learning rate schedule never moves ("), line


@world_sizes(2)
def test_steps_a_grad_scaler_skipped_are_said_not_sent_to_the_data(dist):
    with pytest.raises(StepCountError) as info:
        dist.assert_same_training(P(L.amp_scaled, bug="overflow", steps=30),
                                  P(L.amp_scaled, bug="overflow", reference=True, steps=30),
                                  dist.world_size, steps=4, record="optimizer")
    text = str(info.value)
    assert text.splitlines()[1].startswith("likely cause: a new GradScaler is made at every iteration on the ranks "
                                           "(fn on rank 0 made 31; its GradScaler skipped 30 of its steps)"), text
    assert "fn on rank 0's GradScaler skipped every step, 30 step(s) (inf/NaN in the scaled gradients)" in text, text
    assert "reference_fn (one process)'s GradScaler skipped" in text and "ran out of data" not in text, text


@world_sizes(2)
def test_an_optimizer_option_that_differs_fails_on_its_own(dist):
    """Weight decay 1e-4 relative off moves no tensor past the line in 4 steps; the option alone fails
    the check, first line and cause, and optimizer_options= opts out."""
    fn, ref = P(L.scheduled, bug="wd"), P(L.scheduled, bug="wd", reference=True)
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(fn, ref, dist.world_size, steps=4, record="optimizer")
    assert not info.value.report.failures(), "the tensors alone must pass here: the option is what fails"
    head, line = str(info.value).splitlines()[:2]
    print(head, line, sep="\n")
    assert "diverges from one device at step 0 (of 4): the optimizer's weight_decay differs: 0.050005 on the ranks, " \
           "0.05 in the reference; every tensor is within the line" in head, head
    assert line.startswith("likely cause: the optimizer's hyperparameters differ (weight_decay)"), line
    assert dist.assert_same_training(fn, ref, dist.world_size, steps=4, record="optimizer",
                                     optimizer_options=["weight_decay"]).passed
    report = dist.assert_same_training(fn, ref, dist.world_size, steps=4, record="optimizer", optimizer_options="ignore")
    assert report.passed and not report.option_differences


@world_sizes(2)
def test_keywords_do_not_push_the_cause_off_the_second_line(dist):
    """Keywords each side received are a note further down; the first line names the function, the world
    size and the step, the second the cause."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(L.hand_dp, L.reference, dist.world_size, steps=4, record="optimizer",
                                  fn_kwargs=dict(bug="sum_no_divide", micro=1), reference_kwargs=dict(bug="", micro=1))
    lines = str(info.value).splitlines()
    print(*lines[:2], sep="\n")
    assert lines[0].startswith("hand_dp on 2 x cpu") and "diverges from one device at step 0" \
        in lines[0] and "keywords" not in lines[0], lines[0]
    assert lines[1].startswith("likely cause: gradients scaled by the world size"), lines[1]
    assert any(x.startswith("note: keywords: fn got bug='sum_no_divide'") for x in lines), lines


@world_sizes(2)
def test_a_validation_forward_is_not_a_training_input(dist):
    """Rank 0 validates after each step (under no_grad, and in eval mode without it): its rows are not the
    step's, so a real bug's cause leads, not unequal shards; and the correct loop passes."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.hand_dp, bug="sum_no_divide", validate=True), P(L.reference, bug="sum_no_divide"),
                                  dist.world_size, steps=4, record="optimizer")
    line = first_cause(str(info.value))
    print(line)
    assert line.startswith("likely cause: gradients scaled by the world size"), line
    assert dist.assert_same_training(P(L.hand_dp, validate=True), L.reference, dist.world_size, steps=4,
                                     record="optimizer").passed


@world_sizes(2)
def test_a_factor_equal_to_the_grad_scalers_scale_names_the_scaler_and_its_order(dist):
    """clip_grad_norm_ before scaler.unscale_: the factor is the scaler's scale (65536), not a loss reduction;
    the cause names the scaler and the order of unscale_ and the clip; the correct order passes."""
    assert dist.assert_same_training(L.amp_scaled, P(L.amp_scaled, reference=True), dist.world_size, steps=4,
                                     record="optimizer").passed
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.amp_scaled, bug="clip_scaled"), P(L.amp_scaled, reference=True),
                                  dist.world_size, steps=4, record="optimizer")
    text = str(info.value)
    line = first_cause(text)
    print(line)
    assert line.startswith("likely cause: gradients clipped while still multiplied by the GradScaler's scale (65536, "
                           "with clip_grad_norm_ before scaler.unscale_) ("), line
    assert "reduction='mean'" not in line and "Fix: call scaler.unscale_(optimizer) before clip_grad_norm_" in text, text


@world_sizes(2)
@pytest.mark.parametrize("bug, micro, cause", [
    ("clip_late", 1, "clip_grad_norm_ runs before the step's backward (after the previous optimizer.step or "
                     "zero_grad): the step uses unclipped gradients (at step 1 rank 0 clipped before its backward, "
                     "after step 0's optimizer.step"),
    ("clip_micro", 2, "the gradients are clipped on every micro-batch (clip_grad_norm_ between the backward passes"),
])
def test_a_clip_out_of_its_place_in_the_step_is_named_by_the_order_of_the_calls(dist, bug, micro, cause):
    """The ranks clip after opt.step() (read at the next step: before its backward) or after every micro-batch's
    backward; the reference clips once before the step (with one micro-batch it backpropagates its W blocks'
    losses one by one: its loss is W x the ranks', counted otherwise, not a cause). The correct loop passes."""
    ref = P(L.scheduled, reference=True, blocks=micro == 1, micro=micro, clip=0.05, steps=4)
    assert dist.assert_same_training(P(L.scheduled, clip=0.05, micro=micro, steps=4), ref, dist.world_size, steps=4,
                                     record="optimizer").passed
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.scheduled, bug=bug, clip=0.05, micro=micro, steps=4), ref, dist.world_size,
                                  steps=4, record="optimizer")
    line = str(info.value).splitlines()[1]
    print(line)
    assert line.startswith(f"likely cause: {cause}"), line
    assert f"at {_line_of(L.scheduled, '# each micro' if bug == 'clip_micro' else '# after the step: it used')}" \
           in line, line
    assert "no clipping call was seen" not in str(info.value), str(info.value)


@world_sizes(2)
@pytest.mark.parametrize("bug, cause, where", [
    ("clip_summed", "gradients clipped by hand with another norm than the total (a rank's own shard's, norms summed, "
                    "not the root of their squares) (at step 0 the reference's clip_grad_norm_ scaled its gradients by",
     "at evidence_loops.py:"),
    ("clip_per_tensor", "gradients clipped per tensor (clip_grad_norm_ called once per parameter or group), not by their "
                        "total norm (at step 0 the ranks called clip_grad_norm_ 6 times, the reference once)",
     "# each tensor"),
])
def test_a_clip_by_hand_or_per_tensor_is_told_from_no_clip(dist, bug, cause, where):
    """The ranks clip with no clip_grad_norm_ call (the norms summed), or call it once per tensor; the
    reference clips the total norm. Neither is "no clipping call was seen"."""
    ref = P(L.scheduled, reference=True, blocks=True, clip=0.05, steps=3)
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.scheduled, bug=bug, clip=0.05, steps=3), ref, dist.world_size, steps=3,
                                  record="optimizer")
    line = str(info.value).splitlines()[1]
    assert line.startswith(f"likely cause: {cause}"), line
    assert (where if where.startswith("at ") else _line_of(L.scheduled, where)) in line, line


@world_sizes(2)
@pytest.mark.parametrize("bug, cause", [
    ("metric_local", "the scheduler's metric differs between ranks (each rank's own value, e.g. its shard's validation "
                     "loss, not all-reduced) (scheduler.step(metric) after step "),
    ("metric_train", "the scheduler is stepped with each rank's own training loss, not a metric the ranks share ("),
    ("eval_left", "the model runs in another mode (train/eval) on one side (at step 1 the training forward of the ranks "
                  "ran with modules in eval mode"),
    ("metric_on_train_rows", "the plateau scheduler's metric is computed otherwise (duplicates or padding counted, "
                             "rows not gathered) (at step 4 the ranks stepped with lr 0.025, the reference with 0.05; "
                             "metrics apart: 3.14, 3.26 on rank 0, 5.56, 5.1 in the reference)"),
    ("mode_max", "the plateau scheduler is built with other settings than the reference's (at step 2 the ranks "
                 "stepped with lr 0.025, the reference with 0.05; its settings differ: mode='max' on rank 0, 'min' in "
                 "the reference"),
    ("stepped_twice", "the plateau scheduler is stepped more than once per call (the same metric given again) (at "
                      "step 1 the ranks stepped with lr 0.025, the reference with 0.05; rank 0 stepped it 2 times by "
                      "then, the reference 1, each metric given again"),
])
def test_a_validation_pass_and_a_plateau_scheduler_are_read_from_the_run(dist, bug, cause):
    """ReduceLROnPlateau stepped with a validation loss the ranks all-reduce: the metric each rank gave it is
    recorded (a rank's own, or the loss it backpropagated, is said so); a model left in eval() after validation
    is named at the step it trains in eval mode, though the reference's loss is counted otherwise before it."""
    ref = P(L.plateau, reference=True)
    assert dist.assert_same_training(L.plateau, ref, dist.world_size, steps=5, record="optimizer").passed
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.plateau, bug=bug), ref, dist.world_size, steps=5, record="optimizer")
    line = str(info.value).splitlines()[1]
    print(line)
    assert line.startswith(f"likely cause: {cause}"), line
    if bug != "metric_on_train_rows":  # a head that says the lr alone differs leaves no room for the place
        assert f"at {_line_of(L.plateau, 'sched.step(' if bug != 'eval_left' else 'loss = nn.functional')}" in line, line


@world_sizes(2)
@pytest.mark.parametrize("bug, cause", [
    ("counts_local", "a buffer no optimizer steps differs between ranks: updated from each rank's own rows or counts "),
    ("sign_flipped", "a buffer no optimizer steps is updated otherwise than in the reference (its rule: "),
])
def test_a_buffer_updated_outside_the_optimizer_is_told_from_an_ema_copy(dist, bug, cause):
    """A bias buffer that follows the batch's counts (no trained parameter of its name: not an EMA copy)."""
    ref = P(L.balanced, reference=True)
    assert dist.assert_same_training(L.balanced, ref, dist.world_size, steps=4, record="optimizer").passed
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.balanced, bug=bug), ref, dist.world_size, steps=4, record="optimizer")
    line = str(info.value).splitlines()[1]
    print(line)
    assert line.startswith(f"likely cause: {cause}") and ("(bias)" in line or ": bias)" in line), line


@world_sizes(2)
def test_an_accumulation_not_divided_is_read_through_the_clipping(dist):
    """Two micro-batches whose losses are not divided, against one pass over the batch, both clipped: the
    gradients are 2x the reference's times what each side's clip scaled them by, which confirms the loss."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.scheduled, bug="micro_undivided", micro=2, clip=0.3),
                                  P(L.scheduled, reference=True, clip=0.3), dist.world_size, steps=4,
                                  record="optimizer")
    line = str(info.value).splitlines()[1]
    print(line)
    assert line.startswith("likely cause: gradient accumulation without dividing the loss (at step 0, with the same "
                           "weights, the ranks' loss is 2x (= the 2 backward passes per step, and the world size 2)"), line


@world_sizes(2)
def test_an_accumulation_boundary_counted_otherwise_is_read_from_the_passes_of_each_step(dist):
    """A flat loop over micro-batches that steps when ``i % k == 0``: its first step follows one micro-batch,
    the others two; that, not the batch's size, is the cause. The loop counted from 1 passes."""
    ref = P(L.accumulate, reference=True)
    assert dist.assert_same_training(L.accumulate, ref, dist.world_size, steps=4, record="optimizer").passed
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.accumulate, bug="boundary_off"), ref, dist.world_size, steps=4,
                                  record="optimizer")
    line = str(info.value).splitlines()[1]
    print(line)
    assert line.startswith("likely cause: the ranks' accumulation boundary is counted otherwise: some optimizer step "
                           "comes after another number of micro-batches than the others (at step 0 rank 0 stepped "
                           "after 1 backward pass(es), at its other steps after 2"), line
    assert f"at {_line_of(L.accumulate, '# after the k-th micro-batch')} (optimizer.step)" in line, line


@world_sizes(2)
def test_modules_a_cut_graph_leaves_with_zero_gradients_are_said_so(dist):
    """A stage's output received without requires_grad_(): the body before it is sent zeros (0x)."""
    ref = P(L.staged, reference=True)
    assert dist.assert_same_training(L.staged, ref, dist.world_size, steps=4, record="optimizer").passed
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.staged, bug="recv_no_grad"), ref, dist.world_size, steps=4, record="optimizer")
    line = str(info.value).splitlines()[1]
    print(line)
    assert line.startswith("likely cause: some modules get zero gradients: the graph is cut before them"), line
    assert "only the gradients of body differ" in line and "all by 0x" in line, line
    assert "note: nothing was compared: fn on rank 0: every gradient was exactly zero" in str(info.value)




def test_running_statistics_changed_after_a_no_grad_forward_in_training_mode_are_read_as_that_forward():
    """SWA's averaged model run for a target in train(): its BatchNorm's running statistics differ from
    the reference's (eval()) before the step after. Facts as the recorder gives them."""
    from pytest_mgpu.parity.evidence.causes import said
    from pytest_mgpu.parity.evidence.facts import UserFacts
    from pytest_mgpu.parity.evidence.finding import Finding
    from pytest_mgpu.parity.record.where import TRAIN_NO_GRAD

    stats = ("AveragedModel.module.1.running_mean", "AveragedModel.module.1.running_var")
    f = UserFacts(strategy="your training loop", world_size=2)
    f.rank_where = [[{"forward": ("t.py:80",)}] * 2] * 3 + [[{"forward": ("t.py:80",), TRAIN_NO_GRAD: ("t.py:70",)}] * 2]
    f.ref_where = [{"forward": ("r.py:9",)}] * 3 + [{"forward": ("r.py:9",), "forward under no_grad": ("r.py:7",)}]
    x = Finding(4, "state", "some modules", "untrained-other", "before step 4 the state differs", names=stats)
    assert said(x, f).startswith("BatchNorm running statistics are updated by a forward under no_grad in training "
                                 "mode (a validation, target or averaged copy's pass without eval()) (before step 4 "
                                 "the state differs) at t.py:70 (no_grad forward in train mode). Fix: call eval()")
    f.ref_where[3] = {"forward": ("r.py:9",), "forward under no_grad": ("r.py:7",), TRAIN_NO_GRAD: ("r.py:7",)}
    assert said(x, f).startswith("a buffer no optimizer steps is updated otherwise"), "the reference ran it so too"
    f.ref_where[3] = {"forward": ("r.py:9",), "forward under no_grad": ("r.py:7",)}
    other = Finding(4, "state", "some modules", "untrained-other", "...", names=stats + ("AveragedModel.module.1.bias",))
    assert said(other, f).startswith("a buffer no optimizer steps is updated otherwise"), "not statistics alone"


@world_sizes(2)
def test_a_loss_that_agreed_and_then_differs_is_read_as_what_changes_over_the_steps(dist):
    """A consistency weight ramped twice as fast: 0 at step 0 on both sides (the losses agree), apart after."""
    ref = P(L.ramped, reference=True)
    assert dist.assert_same_training(L.ramped, ref, dist.world_size, steps=4, record="optimizer").passed
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.ramped, bug="ramp_fast"), ref, dist.world_size, steps=4, record="optimizer")
    line = str(info.value).splitlines()[1]
    assert line.startswith("likely cause: what the loss reads changes otherwise over the steps: a coefficient or "
                           "temperature on another schedule") and "(at step 1 the weights agree but the loss" in line, line


@world_sizes(2)
def test_a_schedule_that_runs_k_times_as_fast_says_so_in_its_cause(dist):
    """StepLR stepped twice per update (one backward per step, so not per micro-batch): the ranks' lr at step
    s is the reference's at step 2s, and the cause says the schedule runs faster, not only that the lr differs."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.scheduled, bug="sched_twice"), P(L.scheduled, reference=True, blocks=True),
                                  dist.world_size, steps=4, record="optimizer")
    line = str(info.value).splitlines()[1]
    assert line.startswith("likely cause: the ranks' lr schedule runs faster (stepped more than once per update"), line
    assert "the ranks' lr at step s is the reference's at step 2s" in line, line


def test_running_statistics_apart_after_the_first_forward_name_the_batch_norm():
    """Ranks whose state no optimizer steps was alike before the first forward and apart after it: where
    every such tensor is a BatchNorm's running statistic, the batch norm is not synchronised (a Fabric
    float16 loop's input BatchNorm, whose trail told nothing); anything else is a queue or memory bank."""
    from pytest_mgpu.parity.evidence.causes import said
    from pytest_mgpu.parity.evidence.facts import UserFacts
    from pytest_mgpu.parity.evidence.finding import Finding

    f = UserFacts(strategy="your training loop", world_size=2)
    stats = ("bn.running_mean", "bn.running_var")
    x = Finding(0, "state", "one rank alone", "untrained-forward", "before step 0 it differs between ranks",
                names=stats)
    assert said(x, f).startswith("BatchNorm's running statistics are updated from each rank's own rows: the batch "
                                 "norm is not synchronised across ranks (before step 0"), said(x, f)
    assert "convert_sync_batchnorm" in said(x, f)
    queue = Finding(0, "state", "one rank alone", "untrained-forward", "...", names=stats + ("queue",))
    assert said(queue, f).startswith("state no optimizer steps is updated in the forward from each rank's own rows")


def test_a_schedule_ahead_by_the_updates_a_grad_scaler_skipped_names_the_skips():
    """One step ahead where the ranks' GradScaler skipped one update (both sides overflowed at the first):
    the scheduler stepped on the skipped update. With no skip, the generic cause."""
    from pytest_mgpu.parity.evidence.causes import said
    from pytest_mgpu.parity.evidence.facts import UserFacts
    from pytest_mgpu.parity.evidence.finding import Finding

    f = UserFacts(strategy="your training loop", world_size=2)
    x = Finding(0, "state", "a value", "lr-ahead", "the ranks' lr at step s is the reference's at step s + 1",
                value=1)
    assert said(x, f).startswith("the learning rate schedule runs ahead of the reference's"), said(x, f)
    f.rank_scaler_skips = 1
    assert said(x, f).startswith("the scheduler is stepped on updates the GradScaler skipped"), said(x, f)
    assert "scaler.get_scale() did not drop" in said(x, f)
    x2 = Finding(0, "state", "a value", "lr-ahead", "two steps ahead", value=2)
    assert said(x2, f).startswith("the learning rate schedule runs ahead"), "more steps ahead than skips"


def test_an_ema_whose_momentum_is_one_minus_the_references_has_its_weights_swapped():
    """A Polyak update with tau and 1 - tau swapped: the ranks' momentum 0.1 where the reference's is 0.9."""
    from pytest_mgpu.parity.evidence import ema
    from pytest_mgpu.parity.evidence.causes import said
    from pytest_mgpu.parity.evidence.facts import UserFacts

    f = UserFacts(strategy="your training loop", world_size=2)
    f.rank_ema, f.ref_ema = [[0.1, 0.1, 0.1], [0.1, 0.1, 0.1]], [0.9, 0.9, 0.9]
    (x,) = ema.findings(f)
    assert said(x, f).startswith("the EMA's two weights are swapped (tau and 1 - tau"), said(x, f)
    f.rank_ema = [[0.8, 0.8, 0.8], [0.8, 0.8, 0.8]]
    (y,) = ema.findings(f)
    assert said(y, f).startswith("the EMA's momentum differs from the reference's"), said(y, f)


def test_a_plateau_metric_from_a_validation_in_training_mode_says_so():
    """The lr agreed before step 2; the metrics differ, and rank 0's forward under no_grad ran with modules
    in training mode where the reference's ran in eval mode."""
    from pytest_mgpu.parity.evidence.causes import said
    from pytest_mgpu.parity.evidence.facts import UserFacts
    from pytest_mgpu.parity.evidence.schedule import lr_finding
    from pytest_mgpu.parity.record.where import TRAIN_NO_GRAD

    f = UserFacts(strategy="your training loop", world_size=2)
    f.rank_lrs, f.ref_lrs = [[[0.1]] * 2, [[0.1]] * 2, [[0.05]] * 2], [[0.1], [0.1], [0.1]]
    f.rank_metrics, f.ref_metrics = [[[], []], [[1.3], [1.3]], [[1.4], [1.4]]], [[], [1.2], [1.1]]
    f.rank_where = [[{"forward": ("t.py:9",), TRAIN_NO_GRAD: ("t.py:20 `out = model(vx)`",)}] * 2] * 3
    f.ref_where = [{"forward": ("r.py:9",), "forward under no_grad": ("r.py:20",)}] * 3
    x = lr_finding(f)
    assert x is not None and said(x, f).startswith(
        "the plateau scheduler's metric is computed in training mode on the ranks (validation without model.eval()) "
        "(at step 2 the ranks stepped with lr 0.05, the reference with 0.1; its metric was computed with modules in "
        "training mode (under no_grad at t.py:20, the reference's in eval mode)"), said(x, f)
    f.rank_where = [[{"forward": ("t.py:9",), "forward under no_grad": ("t.py:20",)}] * 2] * 3
    assert said(lr_finding(f), f).startswith("the plateau scheduler's metric is computed otherwise"), "eval mode"



def test_param_groups_that_differ_in_number_say_the_option_that_sets_the_references_apart():
    """One group on the ranks, two in the reference that differ in weight decay alone (none on biases and
    norms): the finding names the option and the groups' sizes."""
    from pytest_mgpu.parity.evidence.facts import UserFacts
    from pytest_mgpu.parity.evidence.state import findings

    f = UserFacts(strategy="your training loop", world_size=2)
    one = {"weight_decay": 0.1, "momentum": 0.9, "parameters": 310.0}
    f.rank_hyper = [[[one], [one]]]
    f.ref_hyper = [[{"weight_decay": 0.1, "momentum": 0.9, "parameters": 300.0},
                    {"weight_decay": 0.0, "momentum": 0.9, "parameters": 10.0}]]
    from types import SimpleNamespace

    x = next(x for x in findings(SimpleNamespace(records=[]), f) if x.signal == "groups")
    assert x.evidence == ("at step 0 rank 0's optimizer has 1 param group(s), the reference's 2; the reference's "
                          "groups' weight_decay: 0.1, 0 (of 300 and 10 elements)"), x.evidence
