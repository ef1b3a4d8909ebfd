"""The parity engine: a broken model gives the divergence table and names the cause; tolerance and
determinism options; clear errors for a bad strategy, option or callable; skips with a reason.

The pytester sessions run real ranks; the rest checks the judging code on measured-like records.
"""
import math

import pytest

from pytest_mgpu.parity import STRATEGIES, ParityReport, StrategyError, Tolerance
from pytest_mgpu.parity.engine import judge
from pytest_mgpu.parity.tolerance import MULTIPLE, derive_tolerance, measure_tolerance
from pytest_mgpu.parity.records import RankResult, RunFacts, StepRecord, TensorError
from pytest_mgpu.parity.batches import shard_indices, split_micro
from pytest_mgpu.parity.registry import exactness, resolve
from pytest_mgpu.parity.runners.staged import auto_split_points

MODELS = """
import functools, pytest, torch
from torch import nn
from pytest_mgpu.parity import ParityError, StrategyError

class BNNet(nn.Module):
    def __init__(self, dropout=0.0, unused=False):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(4 * 8 * 8, 5)
        if unused:
            self.spare = nn.Linear(3, 3)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1))

def bn_net(**kw):
    return BNNet(**kw)

def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 5))

def batch(step, n=8):
    g = torch.Generator().manual_seed(step)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)

def sum_loss(out, y):
    return nn.functional.cross_entropy(out, y, reduction="sum")
"""


def test_broken_model_gives_the_divergence_table_hints_and_tolerance_options(pytester):
    # one session, so the tests share warm ranks
    pytester.makepyfile(test_parity_hints=MODELS + """
@pytest.mark.gpu2
def test_broken(dist):  # BatchNorm under DDP: fails with the table, naming BatchNorm
    dist.assert_parity("ddp", bn_net, batch, steps=2)

@pytest.mark.gpu2
def test_sum_loss(dist):
    with pytest.raises(ParityError) as e:
        dist.assert_parity("ddp", mlp, batch, loss_fn=sum_loss, steps=1)
    assert "reduction='sum' under DDP averaging (gradients are 0.5x" in str(e.value)

@pytest.mark.gpu2
def test_dropout(dist):
    with pytest.raises(ParityError) as e:
        dist.assert_parity("ddp", functools.partial(bn_net, dropout=0.5), batch, steps=1)
    assert "Dropout or other randomness: 1 active dropout module(s) (drop)" in str(e.value)

@pytest.mark.gpu2
def test_matching_model_passes_and_reports(dist):
    report = dist.assert_parity("ddp", mlp, batch, steps=2)
    assert report.passed and report.first_divergence is None
    assert [row["step"] for row in report.per_step()] == [0, 1]
    assert report.tolerance.rule == "measured" and 0 < report.worst_ratio < 1
    assert all(line.floor > 0 for line in report.lines()), "the float64 shadow measured every step"
    print(report.format())

@pytest.mark.gpu2
def test_zero_tolerance_fails_a_reordered_sum(dist):
    with pytest.raises(ParityError) as e:
        dist.assert_parity("ddp", mlp, batch, steps=1, rtol=0, atol=0)
    assert "rtol=0, atol=0 (given)" in str(e.value) or "bitwise (given)" in str(e.value)

@pytest.mark.gpu2
def test_loose_tolerance_accepts_batchnorm(dist):
    report = dist.assert_parity("ddp", bn_net, batch, steps=1, rtol=10.0)
    assert report.tolerance.source == "given" and report.rel("grad") > 1e-3

@pytest.mark.gpu2
def test_deterministic_falls_back_where_sums_are_reordered(dist):
    report = dist.assert_parity("ddp", mlp, batch, steps=1, deterministic=True)
    assert not report.exact and "bitwise equality is not possible" in report.notes[0]

@pytest.mark.gpu2
def test_deterministic_model_parallel_is_bitwise(dist):
    report = dist.assert_parity("model_parallel", bn_net, batch, steps=2, deterministic=True)
    assert report.exact and report.bitwise and len(report.facts.stages) == 2

@pytest.mark.gpu2
def test_uneven(dist):
    with pytest.raises(ParityError) as e:
        dist.assert_parity("ddp", mlp, functools.partial(batch, n=9), steps=1)
    assert "global batch not divisible by the world size: batch 9 on 2 ranks" in str(e.value)
    assert "[5, 5]" in str(e.value)

@pytest.mark.gpu2
def test_unused_needs_find_unused(dist):  # last: its rank failure costs the warm ranks
    from pytest_mgpu import RankFailure
    with pytest.raises(RankFailure) as e:
        dist.assert_parity("ddp", functools.partial(bn_net, unused=True), batch, steps=2)
    assert "find_unused_parameters=True to assert_parity" in str(e.value)
    report = dist.assert_parity("ddp", functools.partial(bn_net, unused=True), batch,
                                steps=1, find_unused_parameters=True, rtol=10.0)
    assert report.facts.unused == ["spare.weight", "spare.bias"]
""")
    result = pytester.runpytest("--mgpu-fallback=cpu", "-s")
    result.assert_outcomes(passed=9, failed=1)
    result.stdout.fnmatch_lines(["*parity: ddp on 2 x cpu (gloo, emulated) matches one device over 2 step(s)*"
                                 "worst error / line: *",
                                 "*step*loss rel err*grad rel err*floor*line*worst / line*"])
    result.stdout.fnmatch_lines([
        "*ParityError: ddp on 2 x cpu (gloo, emulated) diverges from one device at step 0 (of 2)*",
        "*tolerance: * x the measured roundoff floor of each step (measured: reference vs float64 shadow*",
        "*step*kind*name*shape*max abs err*max rel err*norm rel err*tolerance*err / line*",
        "*0*grad*bn.weight*4*",
        "*per step: the worst norm rel err of each kind*",
        "*likely causes:*",
        "*BatchNorm without SyncBatchNorm: 1 BatchNorm module(s) in training mode (bn)*SyncBatchNorm*",
    ])
    failure = result.stdout.str().split("test_broken", 1)[1].split("short test summary", 1)[0]
    assert "Dropout" not in failure and "reduction='sum'" not in failure, "no hint without its fact"


def test_bad_calls_say_what_to_do(pytester):
    pytester.makepyfile(test_parity_bad=MODELS + """
@pytest.mark.gpu1
def test_unknown_strategy(dist):
    with pytest.raises(StrategyError, match="(?s)unknown parity strategy 'zero3'.*'ddp'.*'fsdp'.*'pipeline'"):
        dist.assert_parity("zero3", mlp, batch)

@pytest.mark.gpu1
def test_unknown_option(dist):
    with pytest.raises(StrategyError, match="'ddp' takes no option.*'split_size'.*sync_bn=False"):
        dist.assert_parity("ddp", mlp, batch, split_size=2)

@pytest.mark.gpu1
def test_bad_schedule(dist):
    with pytest.raises(StrategyError, match="schedule must be one of"):
        dist.assert_parity("pipeline", mlp, batch, schedule="zigzag")

@pytest.mark.gpu1
def test_lambda_model(dist):
    with pytest.raises(TypeError, match="model_fn: .*lambda.*Move it to the top level"):
        dist.assert_parity("ddp", lambda: mlp(), batch)

@pytest.mark.gpu1
def test_steps(dist):
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        dist.assert_parity("ddp", mlp, batch, steps=0)

@pytest.mark.gpu2
def test_dp_skips_on_cpu(dist):
    dist.assert_parity("dp", mlp, batch)

@pytest.mark.gpu2
def test_syncbn_skips_on_cpu(dist):
    dist.assert_parity("ddp", bn_net, batch, sync_bn=True)
""")
    result = pytester.runpytest("--mgpu-fallback=cpu", "-rs")
    result.assert_outcomes(passed=5, skipped=2)
    result.stdout.fnmatch_lines([
        "*SKIPPED*parity 'dp' cannot run here: nn.DataParallel needs CUDA devices*",
        "*SKIPPED*parity 'ddp' cannot run here: SyncBatchNorm trains only on CUDA*",
    ])


# -- judging, without ranks -----------------------------------------------------------------------
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


SMALL_BUGS = MODELS + """
from pytest_mgpu.parity import ParityError

class Float32Only(nn.Module):
    '''Hard-codes float32 (as some real models do): a float64 shadow of it cannot run.'''
    def __init__(self):
        super().__init__()
        self.net = mlp()
    def forward(self, x):
        return self.net(x.float()).float() @ torch.eye(5)

class OutOfOrder(nn.Module):
    '''The bug of a hand-written pipeline: a micro-batch's outputs come back reversed.'''
    def __init__(self):
        super().__init__()
        self.net = mlp()
    def forward(self, x):
        out = self.net(x)
        return out.flip(0) if x.shape[0] < 8 else out

def mse_onehot(out, y):
    return nn.functional.mse_loss(out, nn.functional.one_hot(y, 5).to(out.dtype))

def scaled_on_shards(out, y):
    '''A loss scaled by 1.01 where the batch is a shard (the reference sees the whole batch).'''
    loss = nn.functional.cross_entropy(out, y)
    return loss * 1.01 if out.shape[0] < 8 else loss

@pytest.mark.gpu2
def test_float32_only_model_is_judged_without_a_shadow(dist):
    report = dist.assert_parity("ddp", Float32Only, batch, steps=2)
    assert "float64 shadow failed" in report.facts.shadow_note
    assert report.tolerance.rule == "measured" and "float64" not in report.tolerance.source
    # a strategy that adds in the reference's order has nothing to measure: the derived rule, said
    same_order = dist.assert_parity("model_parallel", Float32Only, batch, steps=2)
    assert same_order.tolerance.rule == "derived" and "reference's order" in same_order.notes[-1]

@pytest.mark.gpu2
def test_loss_scaled_by_one_percent_is_caught(dist):
    with pytest.raises(ParityError) as e:
        dist.assert_parity("ddp", mlp, batch, loss_fn=scaled_on_shards, steps=2)
    report = e.value.report
    assert report.first_divergence == 0 and report.worst_ratio > 10
    assert "the twin was not trusted" in report.notes[0]
    print("loss x1.01: worst error / line", report.worst_ratio)

@pytest.mark.gpu2
def test_micro_batches_out_of_order_under_mse_are_caught(dist):
    with pytest.raises(ParityError) as e:
        dist.assert_parity("pipeline", OutOfOrder, batch, loss_fn=mse_onehot, steps=1, split_size=4)
    report = e.value.report
    assert report.first_divergence == 0 and report.worst_ratio > 10
    print("out of order: worst error / line", report.worst_ratio)
"""


def test_measured_line_catches_small_bugs_and_falls_back_without_a_shadow(pytester):
    pytester.makepyfile(test_small_bugs=SMALL_BUGS)
    result = pytester.runpytest("--mgpu-fallback=cpu", "-s")
    result.assert_outcomes(passed=3)
