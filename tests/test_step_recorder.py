"""The pieces of record="optimizer" in one process (no ranks): torch's global optimizer step hooks
record each step and stop the loop after the N-th; the watch sees the model, its input rows, the
loss backpropagated; a vacuous side is told apart; a CUDA-only line is found in a traceback."""
import copy

import pytest
import torch
from torch import nn

from pytest_mgpu.cuda_only import cuda_only_call, user_lines
from pytest_mgpu.parity.record.step_recorder import StepRecorder, StopTraining
from pytest_mgpu.parity.judge.vacuous import VACUOUS, nothing_compared
from pytest_mgpu.parity.record.watch import Watch, fingerprint


def _loop(epochs=50, deepcopy=False, lr=0.1, detach=False, warmup=False):
    """An epoch-based loop with no notion of "steps": 4 batches per epoch; ``warmup``: Adam, its lr
    warmed up from 0 at the first step (MAE's and transformers' linear warm-ups start there)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=lr) if warmup else torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: s / 4) if warmup else None
    if deepcopy:
        model = copy.deepcopy(model)  # the optimizer keeps the original's parameters
    data = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(epochs):
        for x in data.split(4):
            out = model(x)
            loss = out.detach().mean() if detach else out.square().mean()
            opt.zero_grad()
            if loss.requires_grad:
                loss.backward()
            opt.step()
            if sched is not None:
                sched.step()


def _record(steps, **kw):
    watch = Watch()
    rec = StepRecorder(steps, watch)
    with watch.installed(), rec.installed():
        with pytest.raises(StopTraining):
            _loop(**kw)
    return rec.side


def test_each_optimizer_step_is_recorded_and_the_loop_stops_after_the_nth():
    side = _record(6)
    assert len(side.steps) == 6  # the loop asked for 50 epochs x 4 batches
    assert sorted(side.steps[0].params) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert all(g is not None and g.abs().sum() > 0 for g in side.steps[0].grads.values())
    assert len(side.steps[0].rows) == 4  # the batch's 4 input rows, fingerprinted
    assert side.steps[0].rows != side.steps[1].rows
    # the loss is the scalar last backpropagated: out.square().mean() of the first batch
    assert side.steps[0].loss > 0 and side.steps[0].loss != side.steps[1].loss
    assert side.final and not torch.equal(side.final["0.weight"], side.steps[-1].params["0.weight"])


def test_the_hooks_are_gone_afterwards():
    side = _record(2)
    before = len(side.steps)
    _loop(epochs=1)  # runs to its end: no recorder, no StopTraining
    assert len(side.steps) == before
    assert torch.autograd.backward.__name__ == "backward"


def test_an_optimizer_holding_a_copy_s_parameters_is_seen():
    side = _record(3, deepcopy=True)
    assert side.foreign == ["0.weight", "0.bias", "2.weight", "2.bias"]  # named by position and shape
    assert side.unstepped == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert all(g is None for g in side.steps[0].grads.values())


def test_a_side_that_does_not_train_is_nothing_compared():
    trained, idle = _record(3), _record(3, detach=True)
    assert nothing_compared([("reference_fn", trained)]) == ""
    text = nothing_compared([("reference_fn", trained), ("fn on rank 0", idle)])
    assert text.startswith(VACUOUS + ": fn on rank 0: every gradient was exactly zero")
    assert "its parameters never moved (3 step(s), and after the last)" in text
    assert nothing_compared([("x", _record(3, lr=0.0))]).startswith(VACUOUS)  # grads nonzero, lr 0


def test_a_step_at_lr_0_with_gradients_is_a_step():
    """A warm-up from lr 0 moves Adam's state at its first step: a loop of exactly `steps` optimizer
    steps is `steps` steps. (A step at lr 0 with no gradient, DCP's state initialisation, is not:
    test_modern_stack.py.)"""
    side = _record(4, epochs=1, warmup=True)  # 4 batches: StopTraining at the 4th, not the loop's end
    assert side.uncounted == 0 and [s.lrs[0] for s in side.steps] == pytest.approx([0.0, 0.025, 0.05, 0.075])


def test_fingerprints_tell_rows_apart_and_equal_rows_alike():
    x = torch.randn(5, 3, 2)
    assert fingerprint(x) == fingerprint(x.clone())
    assert len(set(fingerprint(x))) == 5
    swapped = fingerprint(torch.tensor([[1, 2], [2, 1]]))  # integer tokens, same values, other order
    assert swapped[0] != swapped[1]


TRACE = '''rank 1 raised RuntimeError: Found no NVIDIA driver on your system.
    | Traceback (most recent call last):
    |   File "/site-packages/torch/multiprocessing/x.py", line 3, in run
    |     fn(i)
    |   File "/home/u/multigpu.py", line 21, in __init__
    |     self.model = DDP(model, device_ids=[gpu_id])
    |   File "/site-packages/torch/nn/parallel/distributed.py", line 700, in __init__
    |     raise ValueError
'''


@pytest.mark.parametrize("line,what", [
    ("torch.cuda.set_device(rank)", "torch.cuda.set_device(...)"),
    ("torch.accelerator.set_device_index(rank)", "torch.accelerator.set_device_index(...)"),
    ("self.model = model.to(gpu_id)", ".to(<int>)"),
    ("self.model = DDP(model, device_ids=[gpu_id])", "DDP(..., device_ids=[...])"),
    ('x = torch.zeros(3, device="cuda")', 'a "cuda" device literal'),
])
def test_a_cuda_only_line_is_named_with_the_portable_one(line, what):
    text = TRACE.replace("self.model = DDP(model, device_ids=[gpu_id])", line)
    hint = cuda_only_call(text)
    assert hint is not None and f"{what} at multigpu.py:21 (`{line}`)" in hint
    assert "pytest_mgpu.rank_device()" in hint and "torch.accelerator" in hint


def test_no_cuda_hint_without_a_cuda_symptom_or_line():
    assert cuda_only_call(TRACE.replace("Found no NVIDIA driver", "shape mismatch")) is None
    assert cuda_only_call(TRACE.replace("device_ids=[gpu_id]", "find_unused_parameters=True")) is None
    assert user_lines(TRACE) == [("multigpu.py:21", "self.model = DDP(model, device_ids=[gpu_id])")]
