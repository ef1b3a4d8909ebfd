"""A companion's run (the float64 run, the same-precision twin) is recorded light: each step's loss,
gradients, parameters and learning rates, which its distances from the reference read, and nothing
the judgement reads from the sides themselves (rows, lines, norms, optimizer state). Those records are
the full recorder's to the bit. In process, no ranks."""
import torch

from pytest_mgpu.launch.rank import seed_everything
from pytest_mgpu.parity.record.float64_kernels import float64_kernels
from pytest_mgpu.parity.record.loops import LoopJob, run_shadow, run_side, run_twin
from pytest_mgpu.parity.records import Portable
from tests import public_trainers as P


def gpt_loop(dtype=torch.float32):
    """The minGPT-like trainer (AdamW groups, clipping, a DistributedSampler), dropout on."""
    model = P.GPT(P.GPTConfig(dropout=0.1), dtype=dtype)
    P.GPTTrainer(model, model.configure_optimizers(), P.CharDataset(64), 8, distributed=False).train(100)


def job(**kwargs):
    return LoopJob(Portable.of(gpt_loop, "reference_fn"), (), kwargs, 4, "optimizer", reference=True)


def side(j, light, mode=None):
    seed_everything(0)
    return run_side(j, gpt_loop, 0, "twin/", mode, light=light)[0]


def assert_same_records(full, light):
    assert len(full.steps) == len(light.steps) == 4 and full.uncounted == light.uncounted
    for a, b in zip(full.steps, light.steps):
        assert a.loss == b.loss and a.lrs == b.lrs and a.backwards == b.backwards
        assert a.params.keys() == b.params.keys() and a.grads.keys() == b.grads.keys()
        for name in a.params:
            assert torch.equal(a.params[name], b.params[name]), name
            assert torch.equal(a.grads[name], b.grads[name]), name
    assert full.final.keys() == light.final.keys()
    assert all(torch.equal(full.final[n], light.final[n]) for n in full.final)


def test_a_light_run_records_what_the_distances_read_to_the_bit():
    full, light = side(job(), False), side(job(), True)
    assert_same_records(full, light)
    assert full.steps[0].rows and full.steps[0].where and full.steps[0].hyper  # the full record has them
    assert not any(s.rows or s.where or s.hyper or s.untrained or s.clips for s in light.steps)
    assert full.set_epoch_calls and not light.set_epoch_calls  # no patch but backward's


def test_the_companions_run_light_and_measure_the_same():
    j = job(dtype=None)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        full = side(j, False, float64_kernels())
    finally:
        torch.set_default_dtype(saved)
    shadow, why = run_shadow(j, gpt_loop, 0, light=True)  # what assert_same_training runs
    assert why == "" and shadow is not None
    assert_same_records(full, shadow)
    assert not shadow.steps[0].rows
    twin = run_twin(job(), gpt_loop, 0)
    assert len(twin.steps) == 4 and not twin.steps[0].rows
