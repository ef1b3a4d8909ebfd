"""The mapping step: the ranks' tensors in the reference's names and shapes, whatever wraps or
shards them (pytest_mgpu.parity.layout). Real loops on 2 gloo ranks (tests/layout_loops.py): a
Lightning Fabric loop, Megatron-style tensor parallelism by hand (found by shape; a fused qkv by
``shards=``); a bug in one shard fails naming its module; a layout that cannot be mapped fails
saying so, with no cause. The name map itself is checked on plain names (no ranks)."""
import functools
import importlib.util
import re

import pytest
import torch

from pytest_mgpu import world_sizes
from pytest_mgpu.parity import ParityError
from pytest_mgpu.parity.layout.names import holders, name_map
from pytest_mgpu.parity.layout.shards import Rule, Sharding, find, gather
from tests import layout_loops as L


def test_a_wrapper_prefix_found_by_identity_is_dropped():
    inner = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))

    class Wrapper(torch.nn.Module):  # a library's wrapper: the model twice, under two names
        def __init__(self):
            super().__init__()
            self._forward_module = torch.nn.ModuleDict({"module": inner})
            self._original_module = inner

    found = holders(Wrapper(), lambda n: n)
    assert found[:2] == ["_forward_module.", "_forward_module.module."], found
    mine = {"module.0.weight": (2, 2), "module.0.bias": (2,), "module.1.weight": (1, 2), "module.1.bias": (1,)}
    ref = {n[len("module."):]: s for n, s in mine.items()}
    got = name_map(mine, ref, ["module."], [])
    assert got.to_ref == {n: n[len("module."):] for n in mine} and not got.unmapped
    assert "'module.' dropped" in got.notes[0]


def test_names_map_by_ending_then_by_position_and_never_by_guess():
    ref = {"encoder.layer.weight": (4, 4), "head.weight": (2, 4), "head.bias": (2,)}
    got = name_map({"layer.weight": (4, 4), "out.weight": (2, 4), "out.bias": (2,)}, ref)
    assert got.to_ref == {"layer.weight": "encoder.layer.weight", "out.weight": "head.weight", "out.bias": "head.bias"}
    assert any("unique ending" in n for n in got.notes) and any("position and shape" in n for n in got.notes)
    odd = name_map({"layer.weight": (4, 4), "out.weight": (3, 4)}, ref)  # a shape that fits nothing
    assert odd.unmapped == ["out.weight"] and "out.weight" not in odd.to_ref


def test_shards_found_by_shape_are_put_together_in_rank_order():
    full = torch.arange(24.0).reshape(6, 4)
    ranks = [{"w": full[:, :2].clone(), "b": torch.ones(3)}, {"w": full[:, 2:].clone(), "b": torch.ones(3)}]
    sharding = find(ranks, {"w": full, "b": torch.ones(3)}, {})
    assert sharding.rules["w"].dim == 1 and sharding.groups[2] == [[0, 1]] and "b" not in sharding.rules
    assert all(torch.equal(r["w"], full) for r in gather(ranks, sharding))
    four = [{"w": full[:, :2].clone()}, {"w": full[:, :2].clone()}, {"w": full[:, 2:].clone()}, {"w": full[:, 2:].clone()}]
    assert find(four, {"w": full}, {}).groups[2] == [[0, 2], [1, 3]]  # strided groups make the start: chosen
    assert isinstance(Sharding().rules, dict) and Rule(0, None, 2, False).k == 2


@world_sizes(2)
def test_a_lightning_fabric_loop_passes_through_its_wrapper(dist):
    if importlib.util.find_spec("lightning") is None:  # importing it here would cost 5 s: the ranks do
        pytest.skip("lightning is not installed")
    report = dist.assert_same_training(L.fabric_train, L.mlp_reference, steps=3, record="optimizer")
    assert any("'module.' dropped" in n for n in report.notes), report.notes
    assert {e.name for e in report.errors("param")} >= {"fc1.weight", "fc2.bias"}


@world_sizes(2)
@pytest.mark.parametrize("loop,reference", [(L.tp_mlp_train, L.tp_mlp_reference),
                                            (L.tp_attention_train, L.tp_attention_reference)], ids=["mlp", "attention"])
def test_tensor_parallel_by_hand_passes_by_detection(dist, loop, reference):
    report = dist.assert_same_training(loop, reference, steps=3, record="optimizer")
    note = next(n for n in report.notes if n.startswith("model parallel by hand"))
    assert "gathered along dim 0" in note and "gathered along dim 1" in note and "from ranks 0-1" in note
    assert all(len(e.shape) == 0 or e.numel > 0 for e in report.errors("grad"))


@world_sizes(2)
def test_a_fused_qkv_needs_shards_and_passes_with_it(dist):
    train, ref = (functools.partial(f, fused=True) for f in (L.tp_attention_train, L.tp_attention_reference))
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(train, ref, steps=2, record="optimizer")
    first, second = str(info.value).splitlines()[:2]
    assert "not compared (no counterpart in the reference)" in first and "qkv.weight" in first, first
    assert second.startswith("Fix: ") and "shards=" in second and "likely cause" not in str(info.value)
    report = dist.assert_same_training(train, ref, steps=2, record="optimizer", shards={"qkv.*": L.unfuse_qkv})
    assert any("qkv.weight, qkv.bias: put together by shards=" in n for n in report.notes), report.notes
    said = re.search(r"(shards=\{.*\}) puts them together", first)  # the message's own shards=, verbatim
    assert said and "its part of each of 3 equal chunks" in first, first
    kw = eval(f"dict({said.group(1)})", {"torch": torch})
    assert dist.assert_same_training(train, ref, steps=2, record="optimizer", **kw).passed


@world_sizes(2)
@pytest.mark.parametrize("bug,cause,module", [
    ("wrong_slice", "another slice of a weight sharded by hand", "1.fc1.weight"),
    ("no_backward_allreduce", "the replicated parameters' gradients (tensors every tensor-parallel rank holds whole) "
                              "are not all-reduced across the tensor-parallel group", "only in 0"),
    ("reduce_twice", "sharded by hand are multiplied by the world size", "by 2x (= the world size 2)"),
    ("whole_summed", "the gradients of tensors every tensor-parallel rank holds whole (norms, a row-parallel layer's "
                     "bias, a replicated head) are summed over the group", "only the gradients of 0, 1.fc2 differ"),
    ("strided_slice", "another slice of a weight sharded by hand", "rank 0 holds rows 0, 2, 4, ... of 1.fc1.weight "
                      "(every 2nd row along dim 0), not its block 0-7"),
])
def test_a_bug_in_one_shard_fails_naming_its_module(dist, bug, cause, module):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.tp_mlp_train, bug=bug), L.tp_mlp_reference, steps=3,
                                  record="optimizer")
    line = next(x for x in str(info.value).splitlines() if x.startswith("likely cause:"))
    assert cause in line and module in line, line


@world_sizes(2)
def test_a_step_whose_closure_runs_backward_is_recorded_after_it(dist):
    """``optimizer.step(closure)`` (Lightning's Trainer): the gradients and loss are the closure's."""
    report = dist.assert_same_training(L.closure_train, L.mlp_reference, steps=3, record="optimizer")
    assert report.passed and max(e.rel for e in report.errors("grad")) < 1e-4


@world_sizes(2)
def test_ranks_that_train_fewer_parameters_are_told_so(dist):
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(L.closure_train, freeze_fc2=True), L.mlp_reference, steps=3,
                                  record="optimizer")
    first, second = str(info.value).splitlines()[:2]
    assert "steps fewer parameters than reference_fn's" in first and "fc2.weight" in first, first
    assert second.startswith("likely cause: the ranks train fewer parameters than the reference (2 it trains are "
                             "stepped on no rank, e.g. ...fc2."), second


def test_assert_resumes_puts_stated_shards_together_over_every_rank():
    """assert_resumes has no one-device reference to read whole shapes from: shards= is what puts
    each phase's pieces together (here a dim and a callable), over all ranks in rank order."""
    from pytest_mgpu.parity.layout.mapping import assemble
    from pytest_mgpu.parity.record.recorder import SideLog, StepLog

    full = torch.arange(12.0).reshape(4, 3)
    sides = [SideLog(steps=[StepLog(0.0, {"w": None, "b": full[i]}, {"w": full[2 * i:2 * i + 2], "b": full[i]})])
             for i in range(2)]
    whole = assemble(sides, {"w": 0, "b": lambda pieces: torch.stack(pieces)})
    assert all(torch.equal(s.steps[0].params["w"], full) for s in whole)
    assert all(torch.equal(s.steps[0].params["b"], full[:2]) and s.steps[0].grads["w"] is None for s in whole)
    assert assemble(sides, None) is sides
    with pytest.raises(TypeError, match="name pattern"):
        assemble(sides, {"w": "rows"})
