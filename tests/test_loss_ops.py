"""Where step 0's loss differs on the same outputs, the first call that made it otherwise is named with
its line (``parity/record/loss_ops.py``, ``parity/evidence/loss_ops.py``): real 2-rank DDP runs of
``tests/loss_op_loops.py`` (a distillation loss), and the recorder alone."""
import functools
import inspect

import pytest

from pytest_mgpu import ParityError, world_sizes
from tests import loss_op_loops as L

P = functools.partial


def first_cause(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("likely cause: "))


def line_of(fn, text: str) -> str:
    lines, start = inspect.getsourcelines(fn)
    return f"loss_op_loops.py:{start + next(i for i, line in enumerate(lines) if text in line)}"


@world_sizes(2)
@pytest.mark.parametrize("loop", ["distilled", "gathered"])
def test_correct_loops_of_either_layout_pass(dist, loop):
    assert dist.assert_same_training(getattr(L, loop), L.reference, dist.world_size, record="optimizer").passed


# (loop, bug) -> (the calls said, the line's code)
CASES = {
    ("distilled", "teacher_not_softened"): ("rank 0 skips x / 2, which the reference computes", "p_t = "),
    ("distilled", "kl_mean"): ("rank 0 computes kl_div(reduction='mean'), the reference kl_div(reduction='batchmean')",
                               "kl = "),
    ("gathered", "kl_mean"): ("rank 0 computes kl_div(reduction='mean'), the reference kl_div(reduction='batchmean')",
                              "kl = "),
    ("gathered", "targets_shifted"): ("rank 0 computes roll(_, 8), which the reference does not", "y = torch.roll"),
}


@world_sizes(2)
@pytest.mark.parametrize("loop, bug", list(CASES))
def test_the_first_call_that_makes_the_loss_otherwise_is_named_at_its_line(dist, loop, bug):
    """The calls of each side's loss lined up: an argument that differs, a call one side skips, a call one
    side adds; what the gathered layout adds (the gather, the concatenation, the world size's factor) is not a
    difference, nor are the teacher's forward's calls made inside the window."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(getattr(L, loop), bug=bug), L.reference, dist.world_size, record="optimizer")
    line = first_cause(str(info.value))
    calls, code = CASES[(loop, bug)]
    assert line.startswith(f"likely cause: the loss is computed otherwise from the same outputs (at step 0, {calls}: "
                           f"`{code}"), line
    where = line_of(L.kd_loss, code) if bug != "targets_shifted" else line_of(L.gathered, code)
    assert f" at {where}{' in the reference' if bug == 'teacher_not_softened' else ''} (the loss). Fix: " in line, line
    assert len(line) < 500


@world_sizes(2)
def test_a_loss_computed_otherwise_from_a_later_step_on_is_named_at_its_line(dist):
    """Steps after the probed one keep their losses' calls too: the KL's reduction changed from step 1 on is
    named, with its line, as the evidence of a loss that changes over the steps."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.distilled, bug="kl_mean_later"), L.reference, dist.world_size, record="optimizer")
    line = first_cause(str(info.value))
    print(line)
    assert line.startswith("likely cause: what the loss reads changes otherwise over the steps"), line
    assert "(at step 1 the weights agree but the loss differs (" in line, line
    text = str(info.value)
    assert "rank 0 computes kl_div(reduction='mean'), the reference kl_div(reduction='batchmean')" in text, text
    assert f" at {line_of(L.kd_loss, 'kl = ')} (the loss). Fix: " in text, text  # in the list (the lead is full)


def test_the_recorder_reads_the_loops_calls_alone_and_leaves_the_mode_stack_as_it_found_it():
    """Calls inside a model's forward (``busy``) and the plugin's own are not the loss's; a mode pushed by
    the loop after the recorder's is left on the stack (and the recorder reads no more)."""
    import torch
    from torch.overrides import TorchFunctionMode

    from pytest_mgpu.parity.record.loss_ops import Recorder

    inside = [False]
    rec = Recorder(lambda: inside[0])
    ops: list = []
    x = torch.randn(4, 3)
    rec.start(ops)
    y = torch.softmax(x / 2.0, dim=1)
    inside[0] = True
    torch.tanh(x)  # a model's forward
    inside[0] = False
    rec.stop()
    torch.exp(y)
    assert [op.shown for op in ops] == ["x / 2", "softmax(_, dim=1)"], ops
    lines, start = inspect.getsourcelines(test_the_recorder_reads_the_loops_calls_alone_and_leaves_the_mode_stack_as_it_found_it)
    here = start + next(i for i, line in enumerate(lines) if "y = torch.softmax" in line)
    assert ops[0].line == f"test_loss_ops.py:{here}" and ops[0].source.startswith("y = torch.softmax"), ops
    assert torch._C._len_torch_function_stack() == 0

    class Theirs(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    rec.start(ops := [])
    theirs = Theirs()
    theirs.__enter__()
    try:
        rec.stop()
        torch.exp(x)
        assert torch._C._len_torch_function_stack() == 2 and not ops
    finally:
        theirs.__exit__(None, None, None)
    assert torch._C._len_torch_function_stack() == 1  # the recorder's own, under the loop's: reads nothing
    rec.stop()
    assert torch._C._len_torch_function_stack() == 0


@world_sizes(2)
@pytest.mark.parametrize("bug", ["aux_weight", "labels_in_eval"])
def test_a_loss_weighing_an_output_not_compared_otherwise_is_named_at_its_line(dist, bug):
    """The main output's gradient agrees, the loss does not: the weight of the auxiliary head's term, at its
    line. A forward of the DDP-wrapped model whose inner module is in eval() is no validation pass in training
    mode (the wrapper's own flag is not the modules')."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.two_heads, bug=bug), P(L.two_heads_reference, bug=bug), dist.world_size,
                                  record="optimizer")
    line = first_cause(str(info.value))
    assert line.startswith("likely cause: the loss is computed otherwise "), line
    assert "rank 0 computes x * 0.4, the reference x * 0.3: `loss = F.cross_entropy(main, y) + weight" in line, line
    assert f" at {line_of(L.two_heads, 'loss = F.cross_entropy(main, y)')} (the loss). Fix: " in line, line


def _ops(*calls):
    """Probes holding the calls ``(name, args, kwargs, line)``, as a side's first step records them."""
    from types import SimpleNamespace

    import torch

    from pytest_mgpu.parity.record.loss_ops import op_of

    t = torch.zeros(1)
    ops = [op_of(name, tuple(t if a is None else a for a in args), kwargs, f"loop.py:{line}", f"code {line}")
           for name, args, kwargs, line in calls]
    return [SimpleNamespace(ops=ops)]


def test_what_a_layout_does_otherwise_is_no_difference_and_the_first_that_is_one_is_said():
    """Unit: the lining up alone, on made-up calls (no ranks)."""
    from pytest_mgpu.parity.evidence.facts import UserFacts
    from pytest_mgpu.parity.evidence.loss_ops import difference

    ref = [("log_softmax", (None,), {"dim": 1}, 10), ("div", (None, 48), {}, 11), ("mul", (None, 0.5), {}, 12)]
    layout = [("detach", (None,), {}, 20), ("cat", ([None, None],), {}, 21), ("add", (None, 0), {}, 22),
              ("__getitem__", (None, slice(0, 8)), {}, 23)]
    f = UserFacts("fn", world_size=2, ref_probes=_ops(*ref), rank_probes=[_ops(*(layout + ref))])
    assert difference(f) is None  # a gather, a detach, rank 0's offset of 0, its rows' slice
    f.rank_probes = [_ops(*(layout + ref[:1] + [("div", (None, 16), {}, 11)] + ref[2:]))]
    words, line = difference(f)
    assert words == ("rank 0 computes x / 16, the reference x / 48 (a count over the rank's own rows, where the "
                     "reference counts the whole batch): `code 11`") and line == "loop.py:11"
    f.rank_probes = [_ops(*(ref + [("sum", (None, [0, 3]), {}, 14)]))]
    f.ref_probes = _ops(*(ref + [("sum", (None, [0, 2]), {}, 14)]))
    assert difference(f)[0] == "rank 0 computes sum([0, 3]), the reference sum([0, 2]): `code 14`"  # a list whole
    f.rank_probes = [_ops(*(ref[:1] + [("div", (None, 0.07), {}, 11)] + ref[2:]))]
    f.ref_probes = _ops(*(ref[:1] + [("div", (None, 0.1), {}, 11)] + ref[2:]))
    assert difference(f)[0] == "rank 0 computes x / 0.07, the reference x / 0.1: `code 11`"  # a temperature: no count
    twice = ref[:1] + [("softmax", (None,), {"dim": 1}, 13)] + ref[1:]
    f.ref_probes, f.rank_probes = _ops(*(twice + twice)), [_ops(*(ref + ref))]
    assert difference(f) == ("rank 0 skips softmax(_, dim=1), which the reference computes: `code 13`",
                             "loop.py:13 in the reference")  # the same place in each of two terms: one place
    f.ref_probes = _ops(*[c for i in range(4) for c in (("exp", (None,), {}, 30 + i), ("mul", (None, i), {}, 40 + i))])
    f.rank_probes = [_ops(*[c for i in range(4) for c in (("exp", (None,), {}, 30 + i), ("mul", (None, 9), {}, 40 + i))])]
    assert difference(f) is None  # four places: loops written otherwise
