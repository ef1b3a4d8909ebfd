"""Stacks torch ships, each as its public code writes it, correct and passing under
``assert_same_training`` (``benchmarks/heldout/set1/``: written from the tutorials and torch's own docs,
held out from the diagnosis work while ``benchmarks/parity/parity_diagnosis.py`` measured it):

- FSDP1 at its defaults (``use_orig_params=False``: the optimizer steps flat parameters, read as
  torch lays them out; ``summon_full_params(with_grads=True)`` is not supported there);
- DDP with ``bf16_compress_hook`` (the line takes the precision the gradients are reduced in);
- ``ZeroRedundancyOptimizer`` over DDP (each rank's optimizer holds a shard of the state);
- an expert-parallel MoE layer with ``all_to_all_single`` (top-1, and DeepSpeed-style top-2 with a
  capacity, ``benchmarks/heldout/set2/``), FSDP1 as its tutorial writes it, ZeRO beside comm hooks."""
import functools
import importlib

import pytest

from pytest_mgpu import ParityError, world_sizes


@world_sizes(2)
@pytest.mark.parametrize("family, variant", [("fsdp1", None), ("comm_hooks", "bf16"), ("zero_ddp", None),
                                             ("moe_ep", None), ("set2.fsdp1_tut", None),
                                             ("set2.moe_top2", None), ("set2.comm_hook_zero", "zero")])
def test_correct_public_stack_passes(dist, family, variant):
    fam = importlib.import_module(f"benchmarks.heldout.{family if '.' in family else 'set1.' + family}")
    report = dist.assert_same_training(functools.partial(fam.train, variant=variant), fam.reference,
                                       dist.world_size, steps=fam.STEPS, record="optimizer")
    print(report.format().splitlines()[0])
    if family == "comm_hooks":
        assert any("reduce their gradients in bfloat16 (DDP's bf16_compress_hook)" in n for n in report.notes), report.notes
    assert report.passed


@world_sizes(2)
@pytest.mark.parametrize("family, bug, cause", [
    ("lm_ddp", "lr_rank", "one rank's learning rate differs (at step 0 rank 1 stepped with lr"),
    ("zero_ddp", "no_ddp", "gradients are not synchronized between ranks (at step 0 the gradients the optimizer was "
                           "given differ between ranks (rank 1 vs rank 0"),
])
def test_replicas_that_differ_are_the_first_cause_by_their_phase(dist, family, bug, cause):
    """Ranks that should hold equal tensors and do not, at the first diverging step: said first, with
    the phase they differ in and the evidence, whatever else differs after."""
    fam = importlib.import_module(f"benchmarks.heldout.set1.{family}")
    with pytest.raises(ParityError) as failure:
        dist.assert_same_training(functools.partial(fam.train, bug=bug), fam.reference, dist.world_size,
                                  steps=fam.STEPS, record="optimizer")
    first = next(line for line in str(failure.value).splitlines() if line.startswith("likely cause: "))
    print(first)
    assert first.startswith(f"likely cause: {cause}"), first


@world_sizes(2)
@pytest.mark.parametrize("family, bug, cause", [
    ("set1.moe_ep", "expert_grad_allreduced", "the experts' gradients are all-reduced over ranks that hold other experts"),
    ("set2.moe_top2", "capacity_global", "the expert-parallel layer routes or combines tokens otherwise"),
    ("set7.dlrm_tw", "a2a_no_permute", "the layer whose parts each rank holds alone (tables or a layer placed per "
                                       "rank, exchanged with all_to_all) routes or combines its rows otherwise"),
    ("set7.dlrm_tw", "allreduce_all_params", "the gradients of tensors each rank holds alone (not replicas) are "
                                             "all-reduced with other ranks' different tensors"),
    ("set7.dlrm_tw", "dense_grad_sum", "the gradients of some modules are world size x the reference's (summed over "
                                       "the ranks, never divided by the world size)"),
])
def test_an_expert_parallel_bug_is_said_for_the_layout_found(dist, family, bug, cause):
    """Where the ranks hold experts of their own beside shared layers, a loss or an expert gradient that
    differs with the same weights is said for that layout, not as a loss normalised by a local count;
    where the parts each rank holds alone are not named experts (DLRM's embedding tables, sharded
    table-wise), in words that do not call them experts. Gradients off by exactly the world size in some
    modules are said as a sum never divided."""
    fam = importlib.import_module(f"benchmarks.heldout.{family}")
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(fam.train, bug=bug), fam.reference, dist.world_size,
                                  steps=fam.STEPS, record="optimizer")
    line = str(info.value).splitlines()[1]
    assert line.startswith("likely cause: ") and cause in line, line


@world_sizes(2)
@pytest.mark.parametrize("family, bug", [("set1.fsdp2_accum", "sync_inverted"), ("set1.ddp_nosync", "nosync_all")])
def test_a_last_backward_with_gradient_sync_off_is_named(dist, family, bug):
    """FSDP2's set_requires_gradient_sync left off for the last micro-batch, and DDP's no_sync() around
    every micro-batch's forward: the step's last backward reduced nothing, said as such at its line."""
    fam = importlib.import_module(f"benchmarks.heldout.{family}")
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(fam.train, bug=bug), fam.reference, dist.world_size,
                                  steps=fam.STEPS, record="optimizer")
    line = str(info.value).splitlines()[1]
    assert line.startswith("likely cause: the step's last ") and "backward ran with gradient synchronisation off" in line, line
    assert f"at {family.split('.')[1]}.py:" in line, line


@world_sizes(2)
def test_ranks_fed_their_part_of_every_sequence_are_judged_as_context_parallel(dist):
    """Ring attention by hand (``benchmarks/heldout/set7/ring_attn.py``): each rank fed part r of every row;
    the correct loop passes with that layout named, and a causal mask applied per block (not by global
    position) is said as the attention across the parts, not as a batch of another size."""
    fam = importlib.import_module("benchmarks.heldout.set7.ring_attn")
    report = dist.assert_same_training(fam.train, fam.reference, dist.world_size, steps=fam.STEPS, record="optimizer")
    assert report.passed and any("along the sequence: context parallel" in n for n in report.notes), report.notes
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(functools.partial(fam.train, bug="causal_all_blocks"), fam.reference,
                                  dist.world_size, steps=fam.STEPS, record="optimizer")
    line = str(info.value).splitlines()[1]
    assert line.startswith("likely cause: the attention across the ranks' parts of the sequence computes otherwise"), line
