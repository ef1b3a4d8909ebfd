"""The parity engine on real ranks: a broken model gives the divergence table and names the cause;
tolerance and determinism options; clear errors for a bad strategy, option or callable; skips with a
reason; the measured line catches small bugs. The judging code alone: ``test_parity_judge.py``.
"""
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


# one session, so the tests share warm ranks
HINTS = MODELS + """
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
"""


def test_broken_model_gives_the_divergence_table_hints_and_tolerance_options(pytester):
    pytester.makepyfile(test_parity_hints=HINTS)
    result = pytester.runpytest("--mgpu-fallback=cpu", "-s")
    result.assert_outcomes(passed=9, failed=1)
    result.stdout.fnmatch_lines(["*parity: ddp on 2 x cpu (gloo, emulated) matches one device over 2 step(s)*"
                                 "worst error / line: *",
                                 "*step*loss rel err*grad rel err*floor*line*worst / line*"])
    assert "cannot tell a difference" not in result.stdout.str()  # float32: every line far under 1%
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
    lock = __import__("threading").Lock()
    with pytest.raises(TypeError, match="model_fn cannot send .*lambda.* it captures `lock`"):
        dist.assert_parity("ddp", lambda: (lock, mlp())[1], batch)

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
        "SKIPPED [[]1[]] test_*.py:*: parity 'dp' cannot run here: nn.DataParallel needs CUDA devices*",
        "SKIPPED [[]1[]] test_*.py:*: parity 'ddp' cannot run here: SyncBatchNorm trains only on CUDA*",
    ])  # at the test's line, not in the plugin


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
