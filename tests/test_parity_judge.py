"""The parity engine's judgement, without ranks: tolerances derived from the dtype and the
reordering, the measured line (float64 shadow, float32 twin, pooled per step), the first diverging
step and the worst tensors, the report's typed result, and the strategy registry and batching.

``test_parity.py`` runs the same code on real ranks.
"""
import math

import pytest

from pytest_mgpu.parity import STRATEGIES, ParityReport, StrategyError, Tolerance
from pytest_mgpu.parity.batches import shard_indices, split_micro
from pytest_mgpu.parity.engine import judge
from pytest_mgpu.parity.records import RankResult, RunFacts, StepRecord, TensorError
from pytest_mgpu.parity.registry import exactness, resolve
from pytest_mgpu.parity.runners.staged import auto_split_points
from pytest_mgpu.parity.judge.tolerance import MULTIPLE, derive_tolerance, measure_tolerance


def _err(kind="grad", name="w", norm_err=0.0, norm_ref=1.0, max_abs=None, numel=4, ratio=1.0):
    max_abs = norm_err if max_abs is None else max_abs
    return TensorError(kind, name, (numel,), max_abs, norm_ref, norm_ratio=ratio, norm_err=norm_err,
                       norm_ref=norm_ref, numel=numel)


def _result(errors_per_step, **facts):
    f = RunFacts(strategy=facts.pop("strategy", "ddp"), world_size=facts.pop("world_size", 2), **facts)
    return RankResult([StepRecord(i, errs) for i, errs in enumerate(errors_per_step)], f)


def test_tolerance_is_derived_from_dtype_and_reordering():
    eps32 = 1.19e-7
    four = derive_tolerance(RunFacts("ddp", 4), 3)
    assert math.isclose(four.rtol, math.sqrt(eps32) * 2, rel_tol=1e-6)
    assert "sqrt(4 partial sums)" in four.source
    one_order = derive_tolerance(RunFacts("model_parallel", 4, exact=True), 3)
    assert math.isclose(one_order.rtol, math.sqrt(eps32), rel_tol=1e-6)
    fp64 = derive_tolerance(RunFacts("ddp", 2, dtype="float64"), 3)
    bf16 = derive_tolerance(RunFacts("ddp", 2, dtype="bfloat16"), 3)
    assert fp64.rtol < 1e-7 < four.rtol < 1e-2 < bf16.rtol
    micro = derive_tolerance(RunFacts("pipeline", 1, microbatches=4), 3)
    assert "sqrt(4 partial sums)" in micro.source


def test_judge_finds_the_first_diverging_step_and_the_worst_tensors():
    result = _result([
        [_err(norm_err=1e-7)],
        [_err(name="a", norm_err=0.5), _err(name="b", norm_err=1e-3)],
        [_err(name="a", norm_err=math.inf, max_abs=math.inf)],
    ])
    report = judge(result, "ddp", 2, "2 x cpu", None, None, False)
    assert not report.passed and report.first_divergence == 1
    assert [(s, e.name) for s, e, _ in report.failures()] == [(1, "a"), (1, "b"), (2, "a")]
    text = report.failure_message()
    assert "at step 1 (of 3): 2 of 2 tensors exceed the tolerance" in text
    assert "no known cause detected" in text
    assert "DIVERGED" in report.format()


def test_given_tolerance_wins_and_bitwise_mode_needs_exact_zero():
    result = _result([[_err(norm_err=1e-3, max_abs=1e-3)]])
    assert judge(result, "ddp", 2, "", 1e-2, None, False).passed
    assert not judge(result, "ddp", 2, "", None, None, False).passed
    exact = _result([[_err(norm_err=1e-12, max_abs=1e-12)]], strategy="model_parallel", exact=True,
                    exact_note="same order")
    strict = judge(exact, "model_parallel", 2, "", None, None, True)
    assert strict.exact and not strict.passed
    assert "bitwise equality was demanded" in strict.failure_message()
    assert judge(exact, "model_parallel", 2, "", None, None, False).passed


def test_constant_gradient_ratio_is_reported_as_a_scaling_mismatch():
    errs = [_err(name=f"p{i}", norm_err=0.5, ratio=0.5) for i in range(3)]
    report = judge(_result([errs], world_size=2, loss_reduction=None), "ddp", 2, "", None, None, False)
    assert "gradients are 0.5x the reference's; 1/2 = 0.5" in report.failure_message()


def test_tolerance_is_norm_wise():
    tol = Tolerance(1e-3, 0.0, "given")
    # one element far off in a big tensor can pass norm-wise while max error is 10x rtol
    assert tol.passes(_err(norm_err=9e-4, norm_ref=1.0, max_abs=1e-2))
    assert not tol.passes(_err(norm_err=2e-3, norm_ref=1.0))
    assert not tol.passes(_err(norm_err=math.nan))


def _floored(norm_err, floor, name="w", kind="grad", norm_ref=1.0):
    e = _err(kind=kind, name=name, norm_err=norm_err, norm_ref=norm_ref)
    e.floor = floor
    return e


def test_measured_line_is_a_multiple_of_the_float64_floor_pooled_per_step():
    parts2 = MULTIPLE * math.sqrt(2)  # ddp on 2 ranks: 2 partial sums
    # the error lands on "b", whose own float64 gap is tiny; the step's worst gap (on "a") sets the line
    step = [_floored(0.0, 1e-4, "a"), _floored(0.5 * parts2 * 1e-4, 1e-9, "b")]
    report = judge(_result([step]), "ddp", 2, "", None, None, False)
    assert report.tolerance.rule == "measured" and report.passed
    assert math.isclose(report.worst_ratio, 0.5, rel_tol=1e-2)
    over = [_floored(0.0, 1e-4, "a"), _floored(2 * parts2 * 1e-4, 1e-9, "b")]
    failed = judge(_result([over]), "ddp", 2, "", None, None, False)
    assert not failed.passed and math.isclose(failed.worst_ratio, 2, rel_tol=1e-2)
    assert "x the measured roundoff floor" in failed.failure_message()


def test_measured_floor_never_shrinks_between_steps_and_kinds_stay_apart():
    report = judge(_result([[_floored(0, 1e-3)], [_floored(0, 1e-6)], [_floored(0, 1e-5, kind="param")]]),
                   "ddp", 2, "", None, None, False)
    tol = report.tolerance
    assert tol.rel_line(1, "grad") == tol.rel_line(0, "grad") == tol.rtol * 1e-3
    assert tol.rel_line(2, "param") == tol.rtol * 1e-5
    assert tol.rel_line(0, "loss") == tol.rtol * 1e-3, "a kind without a floor gets the run's loosest line"
    # never below the dtype's own roundoff
    tiny, _ = measure_tolerance([StepRecord(0, [_floored(0, 0.0)])], RunFacts("ddp", 2))
    assert tiny.rel_line(0, "grad") == tiny.rtol * 1.19e-7


def _twinned(norm_err, floor, twin, name="w", kind="grad", norm_ref=1.0):
    e = _floored(norm_err, floor, name, kind, norm_ref)
    e.twin = twin
    return e


def test_twin_sets_the_line_only_when_its_step_zero_loss_agrees():
    """A kink flip moves gradients (here 4e-3, the shadow saw 2e-6) but not the loss: a twin that met
    the same flip sets the line. A twin whose step-0 loss moved shares a model-level trap: ignored."""
    loss_ok = _twinned(0.0, 1e-7, 1e-7, "loss", "loss")
    steps = [[loss_ok, _twinned(1e-6, 1e-6, 1e-6)], [_twinned(4e-3, 2e-6, 4e-3)]]
    report = judge(_result(steps), "ddp", 2, "", None, None, False)
    assert report.passed and "float32 twin" in report.tolerance.source and not report.notes
    moved = _twinned(0.0, 1e-7, 1e-2, "loss", "loss")  # e.g. BatchNorm statistics per shard
    steps = [[moved, _twinned(1e-6, 1e-6, 1e-6)], [_twinned(4e-3, 2e-6, 4e-3)]]
    report = judge(_result(steps), "ddp", 2, "", None, None, False)
    assert not report.passed and report.first_divergence == 1
    assert "not in the distributed run" in report.notes[0]


def test_a_tensor_without_significant_digits_keeps_its_own_floor():
    """A conv bias in front of a norm layer: true gradient 0, float32 and float64 both roundoff."""
    bias = _floored(0.9e-9, 1e-9, "conv.bias", norm_ref=1e-9)  # gap ~ its size
    weight = _floored(1e-3, 1e-6, "conv.weight")  # a real 1e-3 error, far above its 1e-6 floor
    report = judge(_result([[bias, weight]]), "ddp", 2, "", None, None, False)
    assert [e.name for _, e, _ in report.failures()] == ["conv.weight"], "the bias passes on its own floor"


def test_no_shadow_falls_back_to_the_derived_rule_and_says_why():
    result = _result([[_err(norm_err=1e-5)]], shadow_note="no float64 shadow (TypeError: float32 only)")
    report = judge(result, "ddp", 2, "", None, None, False)
    assert report.tolerance.rule == "derived" and report.passed
    assert report.notes == ["judged by the derived rule: no float64 shadow (TypeError: float32 only)"]
    assert "floor" not in report.format()


def test_small_bugs_sit_far_above_a_step_zero_floor():
    """A 1% loss scaling moves every gradient by 1e-2; the derived rule's 4.9e-4 catches it too, but
    a 1.6e-4 shift (micro-batches out of order under MSE) passes the derived rule and not the measured
    one, whose line at step 0 sits at MULTIPLE x sqrt(partial sums) x the float64 gap (~1e-6)."""
    result = _result([[_floored(1.6e-4, 1e-6)]], strategy="pipeline", world_size=2, microbatches=2)
    assert not judge(result, "pipeline", 2, "", None, None, False).passed
    unshadowed = _result([[_err(norm_err=1.6e-4)]], strategy="pipeline", world_size=2, microbatches=2)
    assert judge(unshadowed, "pipeline", 2, "", None, None, False).passed


def test_strategies_and_their_options_resolve():
    assert set(STRATEGIES) == {"ddp", "fsdp", "dp", "model_parallel", "pipeline"}
    spec, opts = resolve("pipeline", {"schedule": "1F1B"})
    assert spec.process == "ranks" and opts["schedule"] == "1f1b"
    assert resolve("pipeline", {})[0].process == "single"
    with pytest.raises(StrategyError, match="split_points must be a list"):
        resolve("model_parallel", {"split_points": "layer3"})
    with pytest.raises(StrategyError, match="fsdp_version must be 1 or 2"):
        resolve("fsdp", {"fsdp_version": 3})
    assert exactness(STRATEGIES["ddp"], {}, 1, 1)[0] and not exactness(STRATEGIES["ddp"], {}, 2, 1)[0]
    assert not exactness(STRATEGIES["pipeline"], {}, 1, 4)[0]


def test_shards_follow_distributed_sampler_and_micro_batches_split_evenly():
    import torch

    assert shard_indices(10, 4, 0) == [0, 4, 8] and shard_indices(10, 4, 3) == [3, 7, 1]
    chunks = split_micro(torch.arange(10), 4)
    assert [len(c) for c in chunks] == [3, 3, 2, 2] and torch.equal(torch.cat(chunks), torch.arange(10))


def test_auto_split_balances_parameters_and_gives_every_stage_parameters():
    from torch import nn

    model = nn.Sequential(nn.Linear(100, 100), nn.ReLU(), nn.Linear(100, 10), nn.ReLU(), nn.Linear(10, 10))
    assert auto_split_points(model, 1) == []
    assert auto_split_points(model, 2) == ["2"]  # the first Linear holds 90% of the parameters
    assert auto_split_points(model, 5) == ["2", "4"]  # cuts only before modules with parameters


def test_report_is_a_typed_result():
    report = judge(_result([[_err(norm_err=1e-9)]]), "ddp", 2, "2 x cpu", None, None, False)
    assert isinstance(report, ParityReport) and report.passed
    assert report.per_step("max_abs") == [{"step": 0, "grad": 1e-9}]
    with pytest.raises(ValueError, match="metric"):
        report.per_step("median")


def test_replicas_are_judged_against_each_other_at_a_replica_line_whatever_the_reference_needs():
    """A line as wide as an autocast loop's (10%) passes a tensor 5% from the reference, and fails a
    replica 5% from rank 0's (replicas hold the same bits when correct); a replica a millionth apart passes."""
    from pytest_mgpu.parity.judge.tolerance import REPLICA_LINE

    tol = Tolerance(0.1, 0.0, "given")
    assert tol.passes(_err("grad", "w", norm_err=0.05, norm_ref=1.0))
    assert not tol.passes(_err("grad", "rank 1: w", norm_err=0.05, norm_ref=1.0))
    assert tol.passes(_err("grad", "rank 1: w", norm_err=REPLICA_LINE / 100, norm_ref=1.0))
    tight = Tolerance(1e-6, 0.0, "given")  # a line tighter than the replicas' keeps its own
    assert not tight.passes(_err("grad", "rank 1: w", norm_err=1e-5, norm_ref=1.0))
