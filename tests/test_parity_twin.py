"""The same-precision twin of assert_same_training's reference: run as replaced matrix-product
kernels where the loop has no convolution, it records exactly what the dispatch mode records (the
same halves to the bit, at a fraction of the cost); a convolution sends it back to the mode; the
kernels are torch's own again afterwards. In process, no ranks."""
import torch
from torch import nn

from pytest_mgpu.launch.rank import seed_everything
from pytest_mgpu.parity.record.loop_companions import split_products, split_sums
from pytest_mgpu.parity.record.loops import LoopJob, run_side, run_twin
from pytest_mgpu.parity.records import Portable


def attention_loop(log, steps=3, conv=False, dtype=torch.float32):
    """mm, addmm and bmm (a linear layer, an attention product), optionally one convolution."""
    torch.manual_seed(0)
    net = nn.ModuleDict({"proj": nn.Linear(12, 12, dtype=dtype), "head": nn.Linear(12, 3, bias=False, dtype=dtype),
                         "conv": nn.Conv1d(4, 4, 3, padding=1, dtype=dtype)})
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(6, 4, 12, generator=g, dtype=dtype)
        if conv:
            x = net["conv"](x)
        q = net["proj"](x)
        att = torch.softmax(q @ q.transpose(-2, -1) / 4, dim=-1)
        loss = net["head"](att @ x).square().mean()
        opt.zero_grad()
        loss.backward()
        log(net, loss)
        opt.step()


def job(**kwargs):
    return LoopJob(Portable.of(attention_loop, "reference_fn"), (), kwargs, 3, "log", reference=True)


def records(side):
    return [(s.loss, {n: t for n, t in s.grads.items() if t is not None}, s.params) for s in side.steps]


def assert_identical(a, b):
    assert len(a) == len(b) == 3
    for (la, ga, pa), (lb, gb, pb) in zip(a, b):
        assert la == lb
        for name in ga:
            assert torch.equal(ga[name], gb[name]), name
            assert torch.equal(pa[name], pb[name]), name


def test_the_kernels_twin_is_the_modes_to_the_bit():
    for kwargs in ({}, {"dtype": torch.bfloat16}):
        j = job(**kwargs)
        seed_everything(0)
        as_mode, _ = run_side(j, attention_loop, 0, "twin/", split_sums())
        as_kernels = run_twin(j, attention_loop, 0)
        assert_identical(records(as_mode), records(as_kernels))
        seed_everything(0)
        plain, _ = run_side(j, attention_loop, 0)  # the twin differs from the loop itself: it did split
        assert any(not torch.equal(g, plain.steps[-1].grads[n]) for n, g in records(as_kernels)[-1][1].items())


def test_a_convolution_sends_the_twin_back_to_the_mode():
    j = job(conv=True)
    convolved = []
    try:
        with split_products(convolved):
            attention_loop(lambda *a: None, steps=1, conv=True)
    except Exception:
        pass
    assert len(convolved) == 1 and "test_parity_twin.py" in convolved[0], convolved
    seed_everything(0)
    as_mode, _ = run_side(j, attention_loop, 0, "twin/", split_sums())
    assert_identical(records(as_mode), records(run_twin(j, attention_loop, 0)))


def test_the_kernels_are_torchs_own_again_after():
    a, b = torch.randn(5, 8), torch.randn(8, 3)
    before = a @ b
    try:
        with split_products([]):
            raise ValueError("the loop failed")
    except ValueError:
        pass
    assert torch.equal(a @ b, before)
    halves = a[:, :4] @ b[:4] + a[:, 4:] @ b[4:]
    with split_products([]):
        assert torch.equal(a @ b, halves)
    assert torch.equal(a @ b, before)
