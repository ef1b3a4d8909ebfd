"""What a CI page shows of a failure: pytest 9 keeps 500 characters of a junit ``message``. A parity
failure, a hang and a desync each name what failed, where, and the cause with its fix in them; the
tables and stacks follow in the element's text. One real pytest run with --junitxml on 2 and 4 gloo
ranks (the hang and desync cases get 5 s each). Every bug of suites/ and examples/ is among them (their own
tests catch it with ``pytest.raises``), and a loop called with many keywords: the first line names what
diverged, with its devices and step, and the second is the cause."""
from pathlib import Path
import xml.etree.ElementTree as ET

FNS = """
import torch, torch.distributed as tdist
from torch import nn

def bn_net():
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 5))

def batch(step, n=8):
    g = torch.Generator().manual_seed(step)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)

def block():                         # rank 0 blocks outside any collective; the others wait for it
    import time
    if tdist.get_rank() == 0:
        time.sleep(600)
    tdist.barrier()

def other_collective():              # collective #2: rank 1 broadcasts, the others all-gather
    t = torch.ones(4)
    tdist.all_reduce(t)
    if tdist.get_rank() == 1:
        tdist.broadcast(t, 0)
    else:
        tdist.all_gather([torch.empty(4) for _ in range(tdist.get_world_size())], t)
"""

TESTS = """
import functools
import pytest
import junit_fns as F
from suites import models as M, user_resnet as R
from tests import evidence_loops as E

@pytest.mark.gpu2
def test_batchnorm(dist):
    dist.assert_parity("ddp", F.bn_net, F.batch, steps=2)

# every bug of suites/ and examples/ (their tests catch it with pytest.raises; here it fails), and a
# loop of the user's own called with many keywords
@pytest.mark.gpu2
def test_sum_loss(dist):
    dist.assert_parity("ddp", M.mlp, M.mnist_batch, loss_fn=M.sum_loss, steps=1)

@pytest.mark.gpu2
def test_bn_micro_batches(dist):
    dist.assert_parity("pipeline", functools.partial(M.small_cnn, norm="batch"),
                       functools.partial(M.image_batch, batch=8, size=16), steps=1, split_size=2)

@pytest.mark.gpu2
def test_user_resnet_pipeline(dist):
    dist.assert_parity(functools.partial(R.pipeline, 4, "batch"), R.BN, R.batch, **R.ONE_STEP)

@pytest.mark.gpu2
def test_keywords(dist):
    dist.assert_same_training(E.hand_dp, E.reference, dist.world_size, steps=4, record="optimizer",
                              fn_kwargs=dict(bug="sum_no_divide", micro=1, validate=False),
                              reference_kwargs=dict(bug="", micro=1), optimizer_options="same")

@pytest.mark.gpu4
def test_hang(dist):
    dist.run(F.block, timeout=5)

@pytest.mark.gpu4
def test_desync(dist):
    dist.run(F.other_collective, timeout=5)
"""


def assert_cause(cause: str, text: str) -> None:
    """The first ``likely cause:`` line of ``text`` names ``cause`` (its what, then its evidence in parentheses),
    and gives its fix."""
    what, fix = cause.split(". Fix: ", 1)
    line = next(line for line in text.splitlines() if line.startswith("likely cause: "))
    assert line.startswith(what + " (") or line.startswith(what + ". Fix"), text
    assert f". Fix: {fix}" in line, text


def junit_head(message: str, budget: int = 500) -> str:
    """What a junit ``message`` attribute keeps of a failure's message under pytest >= 9.2: whole
    lines while they fit in 500 characters (an older pytest keeps more; CI annotations show this)."""
    kept, size = [], 0
    for line in message.splitlines():
        if kept and size + len(line) + 1 > budget:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept)[:budget]


def test_the_junit_message_carries_the_cause(pytester):
    """In-process: the inner session has its own warm ranks (not this session's), and the clone on its
    path, as suites/ and examples/ import from it."""
    pytester.makepyfile(junit_fns=FNS, test_junit_inner=TESTS)
    pytester.syspathinsert(Path(__file__).resolve().parent.parent)
    xml = pytester.path / "junit.xml"
    result = pytester.runpytest("--mgpu-fallback=cpu", "-p", "no:randomly", f"--junitxml={xml}")
    rc, out = result.ret, result.stdout.str()
    assert rc == 1 and "7 failed" in out, out
    messages = {case.get("name"): case.find("failure").get("message")
                for case in ET.parse(xml).getroot().iter("testcase") if case.find("failure") is not None}
    for name, words in {
        "test_batchnorm[gpu2]": ["diverges from one device at step 0", "likely cause: ",
                                 "likely cause: BatchNorm without SyncBatchNorm (1 BatchNorm module(s) in training mode",
                                 "). Fix: convert with "
                                 "torch.nn.SyncBatchNorm.convert_sync_batchnorm"],
        "test_hang[gpu4]": ["rank(s) failed (hung)", "first cause: rank 0 did not finish within 5s (hung",
                            "fix: "],
        "test_desync[gpu4]": ["collectives disagree (flight recorder): collective #2: rank 1 entered broadcast"],
        "test_sum_loss[gpu2]": ["diverges from one device at step 0", "likely cause: ", "1/2"],
        "test_bn_micro_batches[gpu2]": ["diverges from one device at step 0", "likely cause: ", "4 micro-batches"],
        "test_user_resnet_pipeline[gpu2]": ["diverges from one device at step 0", "likely cause: ", "micro-batches"],
        "test_keywords[gpu2]": ["hand_dp on 2 x cpu", "diverges from one device at step 0",
                                "likely cause: gradients scaled by the world size", "(optimizer.step). Fix: "],
    }.items():
        full = messages[name.replace("[gpu2]", "").replace("[gpu4]", "")] if name not in messages else messages[name]
        head = junit_head(full)
        for w in words:
            assert w in head, f"{name}: {w!r} not in the whole lines of the first 500 characters:\n{head}"
        if "likely cause: " in words:  # a parity failure: line 1 what diverged (and where), line 2 its cause
            first, second = head.splitlines()[:2]
            assert "diverges from" in first and "2 x cpu" in first and "keywords" not in first, f"{name}: {first}"
            assert second.startswith("likely cause: ") and "none known" not in second, f"{name}: {second}"
