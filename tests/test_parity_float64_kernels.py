"""The float64 shadow of assert_same_training's reference: run as replaced kernels of the random ops
(float64_kernels), it records exactly what the dispatch mode (float64_dispatch, the reference
implementation) records, on a loop drawing from Python and from C++ and on the minGPT-like trainer
with dropout; torch's own kernels are back afterwards, whatever the loop raised; a pinned dtype is
still named with its line. In process, no ranks."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pytest_mgpu.launch.rank import seed_everything
from pytest_mgpu.parity.record.float64_kernels import float64_kernels
from pytest_mgpu.parity.record.loop_companions import float64_dispatch
from pytest_mgpu.parity.record.loops import LoopJob, run_shadow, run_side
from pytest_mgpu.parity.records import Portable
from tests import public_trainers as P


def random_loop(log, steps=3, pin=""):
    """Random draws of every kind: factories (randn, rand, randperm) and in-place ones (bernoulli_)
    from Python, dropout from C++ (F.dropout's bernoulli_), and nn.Linear's own init (uniform_);
    ``pin``: one layer built in float32 ("layer"), or the whole model and its input cast ("model")."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16, dtype=torch.float32 if pin == "layer" else None), nn.Dropout(0.3),
                        nn.Linear(16, 2))
    if pin == "model":
        net = net.to(torch.float32)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    for _ in range(steps):
        x = torch.randn(6, 8) + torch.rand(6, 8)
        x = (x[torch.randperm(6)] * torch.empty(6, 8).bernoulli_(0.7)).to(net[0].weight.dtype)
        loss = F.dropout(net(x), 0.2).square().mean()
        opt.zero_grad()
        loss.backward()
        log(net, loss)
        opt.step()


def gpt_loop(steps=6):
    """The minGPT-like trainer, dropout on (0.1 in every dropout layer), float64 wherever the default is."""
    model = P.GPT(P.GPTConfig(dropout=0.1), dtype=None)
    P.GPTTrainer(model, model.configure_optimizers(), P.CharDataset(64), 8, distributed=False).train(100)


def records(side):
    return [(s.loss, {n: t for n, t in s.grads.items() if t is not None}, s.params) for s in side.steps]


def float64_side(job, fn, companion):
    saved = torch.get_default_dtype()
    seed_everything(0)
    torch.set_default_dtype(torch.float64)
    try:
        return run_side(job, fn, 0, "shadow/", companion)[0]
    finally:
        torch.set_default_dtype(saved)


def assert_identical(a, b, steps):
    assert len(a) == len(b) == steps
    for (la, ga, pa), (lb, gb, pb) in zip(a, b):
        assert la == lb
        assert ga.keys() == gb.keys() and pa.keys() == pb.keys()
        for name in pa:
            assert pa[name].dtype == torch.float64, name
            assert torch.equal(pa[name], pb[name]), name
            assert name not in ga or torch.equal(ga[name], gb[name]), name


@pytest.mark.parametrize("case", ["random draws", "minGPT with dropout"])
def test_the_kernels_shadow_is_the_modes_to_the_bit(case):
    if case == "random draws":
        fn, job = random_loop, LoopJob(Portable.of(random_loop, "reference_fn"), (), {}, 3, "log", reference=True)
    else:
        fn, job = gpt_loop, LoopJob(Portable.of(gpt_loop, "reference_fn"), (), {}, 6, "optimizer", reference=True)
    as_mode = float64_side(job, fn, float64_dispatch([]))
    as_kernels = float64_side(job, fn, float64_kernels())
    assert_identical(records(as_mode), records(as_kernels), job.steps)
    shadow, why = run_shadow(job, fn, 0)  # what assert_same_training runs
    assert why == "" and shadow is not None
    assert_identical(records(as_mode), records(shadow), job.steps)
    plain = float64_side(job, fn, None)  # float64 draws of its own: another start
    assert not torch.equal(records(plain)[0][2]["0.weight" if case == "random draws" else "lm_head.weight"],
                           records(as_kernels)[0][2]["0.weight" if case == "random draws" else "lm_head.weight"])


def draws():
    torch.manual_seed(0)
    x = torch.randn(4)
    return x, torch.empty(4).uniform_()


def test_the_kernels_are_torchs_own_again_after_and_nest():
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        own = draws()
        torch.set_default_dtype(torch.float32)
        narrow = [t.double() for t in draws()]
        torch.set_default_dtype(torch.float64)
        for _ in range(2):  # repeated, and nested
            with float64_kernels():
                with float64_kernels():
                    assert all(torch.equal(a, b) for a, b in zip(draws(), narrow))
                assert all(torch.equal(a, b) for a, b in zip(draws(), narrow))
            assert all(torch.equal(a, b) for a, b in zip(draws(), own))
        with pytest.raises(ValueError):
            with float64_kernels():
                raise ValueError("the loop failed")
        assert all(torch.equal(a, b) for a, b in zip(draws(), own))
        assert not torch.equal(own[0], narrow[0])
    finally:
        torch.set_default_dtype(saved)


@pytest.mark.parametrize("pin, why, line, pins", [
    ("layer", "the loop raised RuntimeError in float64 (mat1 and mat2", "dtype=torch.float32 if pin", 3),
    ("model", "parameter 0.weight stayed float32", "net = net.to(torch.float32)", 3)])
def test_a_pinned_dtype_is_named_with_its_line(pin, why, line, pins):
    job = LoopJob(Portable.of(random_loop, "reference_fn"), (), {"pin": pin}, 3, "log", reference=True)
    shadow, note = run_shadow(job, random_loop, 0)
    assert shadow is None
    assert note.startswith(why), note
    assert note.count("(asks for float32)") == pins, note  # the first few, each with its line
    assert note.count("test_parity_float64_kernels.py:") == pins and line in note, note
