"""dist.assert_same_training(record="optimizer") on small equivalents of real public training code
(tests/public_trainers.py), unchanged: the DDP tutorial's mp.spawn main (spawn=True) against its
single_gpu.py, the hand-written all_reduce SGD, a minGPT-like trainer (float32 pinned, AdamW with
weight-decay groups, clipping), a tensor-parallel block. Each correct one passes at world sizes 2
and 4; each bug fails with the hint that names it."""
import functools

import pytest
import torch

from pytest_mgpu import ParityError, RankFailure, StepCountError, world_sizes
from tests import public_trainers as P

SIZES = world_sizes(2, 4)


def tutorial(world_size, batch_size=16, total_epochs=10, **kw):
    """multigpu.py's main as mp.spawn calls it: main(rank, world_size, save_every, total_epochs, batch_size)."""
    return functools.partial(P.multigpu_main, world_size=world_size, save_every=1000, total_epochs=total_epochs,
                             batch_size=batch_size, **kw)


def tutorial_reference(world_size, batch_size=16, total_epochs=10, **kw):
    """single_gpu.py's main(device, total_epochs, save_every, batch_size), on the global batch."""
    return functools.partial(P.single_gpu_main, "cpu", total_epochs, 1000, batch_size * world_size, **kw)


def hand_sgd(world_size, **kw):
    return functools.partial(P.init_process, size=world_size, fn=P.run, **kw)


PROGRAMS = {  # name -> (fn, reference_fn, args, options) for a world size
    "ddp tutorial (mp.spawn)": lambda w: (tutorial(w), tutorial_reference(w), (), {"spawn": True, "steps": 10}),
    "hand-written all_reduce SGD (mp.spawn)": lambda w: (hand_sgd(w), functools.partial(P.run_one_device, w), (),
                                                         {"spawn": True, "steps": 6}),
    "minGPT (float32 pinned, AdamW, clipping)": lambda w: (P.gpt_ddp_train, P.gpt_one_device, (w,),
                                                           {"record": "optimizer", "steps": 10}),
    "tensor-parallel block": lambda w: (P.tp_train, P.tp_one_device, (w,), {"record": "optimizer", "steps": 6}),
}


@SIZES
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_correct_public_code_passes_unchanged(dist, program):
    fn, reference, args, options = PROGRAMS[program](dist.world_size)
    report = dist.assert_same_training(fn, reference, *args, **options)
    assert report.passed and len(report.records) == options["steps"]
    assert report.tolerance.rule == "measured"
    print(report.format())


def _gpt(bug="", **ref):
    return lambda w: (functools.partial(P.gpt_ddp_train, bug=bug), functools.partial(P.gpt_one_device, **ref), (w,),
                      {"record": "optimizer", "steps": 4})


def _tutorial_case(bug="", **ref):
    return lambda w: (tutorial(w, bug=bug), tutorial_reference(w, **ref), (), {"spawn": True, "steps": 12})


BUGS = {  # bug -> (program, what the message must say)
    "no DistributedSampler": (_tutorial_case("no_sampler"), "the data is not sharded (at step 0 every one of the"),
    "set_epoch never called": (_tutorial_case("no_set_epoch"), "the shuffle order repeats across epochs"),
    "optimizer built on a deep copy": (_tutorial_case("deepcopy"), "the optimizer holds other parameters"),
    "dropout in the distributed loop only": (_tutorial_case("dropout"), "active dropout module(s) (2 in fn on the ranks)"),
    "batch not multiplied by the world size": (
        lambda w: (tutorial(w), functools.partial(P.single_gpu_main, "cpu", 10, 1000, 16), (), {"spawn": True, "steps": 4}),
        "the sides train on batches of another size"),
    "all_reduce SUM not divided": (
        lambda w: (hand_sgd(w, bug="sum_no_divide"), functools.partial(P.run_one_device, w), (), {"spawn": True, "steps": 3}),
        "gradients scaled by the world size"),
    "gradients never all-reduced": (
        lambda w: (hand_sgd(w, bug="no_allreduce"), functools.partial(P.run_one_device, w), (), {"spawn": True, "steps": 3}),
        "gradients are not synchronized between ranks"),
    "seeded by rank": (
        lambda w: (hand_sgd(w, bug="rank_seed"), functools.partial(P.run_one_device, w), (), {"spawn": True, "steps": 3}),
        "the ranks start from different weights"),
    "loss multiplied by the world size (clipped)": (_gpt("loss_times_world"), "the loss is scaled by the world size"),
    "no_sync() left on": (_gpt("no_sync"), "gradients are not synchronized between ranks"),
    "reference shuffled with another seed": (_gpt(shuffle_seed=1), "the sides saw different batches (at step 0"),
    "tensor parallel with rank-dependent inputs": (
        lambda w: (functools.partial(P.tp_train, bug="rank_inputs"), P.tp_one_device, (w,), {"record": "optimizer", "steps": 3}),
        "rank-dependent inputs to a tensor-parallel model"),
}


@world_sizes(2)
@pytest.mark.parametrize("bug", list(BUGS))
def test_bug_in_public_code_fails_with_its_hint(dist, bug):
    program, hint = BUGS[bug]
    fn, reference, args, options = program(dist.world_size)
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(fn, reference, *args, **options)
    causes = str(info.value).split("likely causes:", 1)[1]
    assert hint in causes, str(info.value)
    assert "no known cause" not in causes
    if bug == "tensor parallel with rank-dependent inputs":
        assert "not sharded" not in causes and "DistributedSampler(dataset)" not in causes


def ones_on_cuda():
    return torch.ones(1).cuda()


def ones_to_rank():
    rank = torch.distributed.get_rank()
    return torch.ones(1).to(rank)


def set_device_of_rank():
    torch.cuda.set_device(torch.distributed.get_rank())


@world_sizes(2)
def test_dist_run_run_on_and_run_single_name_a_cuda_only_call(dist):
    """The plain entry points give the same hint as dist.spawn: the call, its line, the portable one."""
    if not dist.emulated:
        pytest.skip("CUDA-only code runs on GPU ranks: the hint is for emulated CPU ranks")
    calls = [(lambda: dist.run(ones_on_cuda), ".cuda() at test_public_trainers.py", "`return torch.ones(1).cuda()`"),
             (lambda: dist.run_on(1, ones_to_rank), ".to(<int>) at test_public_trainers.py", "`return torch.ones(1).to(rank)`"),
             (lambda: dist.run_single(set_device_of_rank), "torch.cuda.set_device(...) at test_public_trainers.py",
              "`torch.cuda.set_device(torch.distributed.get_rank())`")]
    for call, what, line in calls:
        with pytest.raises(RankFailure) as info:
            call()
        text = str(info.value)
        assert f"a CUDA-only call on an emulated CPU rank: {what}" in text, text
        assert line in text and "pytest_mgpu.rank_device()" in text, text
        assert info.value.hint.count("a CUDA-only call on an emulated CPU rank") == 1, info.value.hint


@world_sizes(2)
def test_gpu_written_mp_spawn_script_names_its_cuda_only_call(dist):
    with pytest.raises(RankFailure) as info:
        dist.assert_same_training(tutorial(dist.world_size, gpu=True), tutorial_reference(dist.world_size),
                                  spawn=True, steps=2)
    text = str(info.value)
    # torch's words (a CPU machine has no driver; a GPU machine's CPU ranks see no GPU), and then ours:
    assert any(w in text for w in ("Found no NVIDIA driver", "No CUDA GPUs are available")), text
    assert "a CUDA-only call on an emulated CPU rank: torch.cuda.set_device(...) at public_trainers.py" in text
    assert "`torch.cuda.set_device(rank)`" in text and "pytest_mgpu.rank_device()" in text
    with pytest.raises(RankFailure, match=r"torch\.cuda\.set_device\(\.\.\.\) at public_trainers\.py"):
        dist.spawn(tutorial(dist.world_size, gpu=True))  # dist.spawn names it too


@world_sizes(2)
def test_a_device_chosen_by_torch_accelerator_is_named(dist):
    """current_accelerator() says cuda on a CUDA build without a GPU: the line that chose it is named,
    although the call that fails (model.to(device)) is elsewhere."""
    if torch.accelerator.current_accelerator() is None:
        pytest.skip("this torch build has no accelerator: current_accelerator() is None, the script runs on cpu")
    with pytest.raises(RankFailure) as info:
        dist.spawn(tutorial(dist.world_size, gpu="accelerator"))
    text = str(info.value)
    assert "a CUDA device chosen on an emulated CPU rank: torch.accelerator.current_accelerator() at " \
           "public_trainers.py" in text, text
    assert "current_accelerator(check_available=True)" in text


@world_sizes(2)
def test_the_tutorial_as_written_compares_nothing(dist):
    """multigpu.py's own loss, F.cross_entropy over one output column: zero loss and zero gradients."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(tutorial(dist.world_size, loss="cross_entropy"),
                                  tutorial_reference(dist.world_size, loss="cross_entropy"), spawn=True, steps=8)
    text = str(info.value)
    assert text.startswith("nothing was compared: reference_fn: every gradient was exactly zero (or None) at every "
                           "one of its 8 step(s)"), text
    assert "its parameters never moved" in text and info.value.report.passed  # equal, and still a failure


@world_sizes(2)
def test_an_epoch_based_trainer_stops_after_n_optimizer_steps(dist):
    """10 epochs of 8 steps asked of the trainer; both sides stop cleanly after the 11th step
    (inside epoch 1), and the group the mp.spawn entry built is gone: the next call runs."""
    report = dist.assert_same_training(tutorial(dist.world_size), tutorial_reference(dist.world_size),
                                       spawn=True, steps=11)
    assert len(report.records) == 11
    assert dist.run(_group_size) == [2, 2]


def _group_size():
    import torch.distributed as tdist

    return tdist.get_world_size()


@world_sizes(2)
def test_a_pinned_dtype_is_named_and_a_same_precision_twin_measures_the_floor(dist):
    report = dist.assert_same_training(P.gpt_ddp_train, P.gpt_one_device, dist.world_size, record="optimizer", steps=3)
    notes = "\n".join(report.notes)
    assert "no float64 run: parameter" in notes and "stayed float32" in notes
    assert "public_trainers.py:" in notes and "dtype=dtype" in notes  # the line that pinned it
    assert "by a twin of the reference" in notes
    assert "float32 twin" in report.tolerance.source
    unpinned = dist.assert_same_training(P.gpt_ddp_train, functools.partial(P.gpt_one_device, dtype=None),
                                         dist.world_size, record="optimizer", steps=3, dtype=None)
    assert "float64 shadow" in unpinned.tolerance.source
    assert [n for n in unpinned.notes if not n.startswith("judged by what each rank holds: data-parallel")] == [], \
        unpinned.notes  # nothing but how the replicas were judged


@world_sizes(2)
def test_bf16_autocast_trains_like_one_device_and_a_bug_in_it_still_fails(dist):
    report = dist.assert_same_training(P.gpt_ddp_train, P.gpt_one_device, dist.world_size, record="optimizer",
                                       steps=6, use_amp=True, dtype=None)
    assert report.passed and report.facts.dtype == "float32"  # autocast: measured by the twin, in bf16
    assert "float64 shadow and float32 twin" in report.tolerance.source  # both floors, the larger counts
    assert any("(bfloat16) by a twin of the reference" in n and "beside the float64 run" in n for n in report.notes)
    step, line = report.blind_below()  # bfloat16's roundoff: a line over 1% of a gradient, said in the pass
    assert f"cannot tell a difference under {line:.2g} of a gradient's norm (the line at step {step}" in str(report)
    with pytest.raises(ParityError, match="the loss is scaled by the world size"):
        dist.assert_same_training(functools.partial(P.gpt_ddp_train, bug="loss_times_world"), P.gpt_one_device,
                                  dist.world_size, record="optimizer", steps=3, use_amp=True)


@SIZES
def test_fsdp_mixed_precision_is_judged_in_its_own_precision(dist):
    """FSDP2 param_dtype=bfloat16 computes its loss in bfloat16 (3e-3 from the reference's float32
    loss at W=4, 130x the float64 run's loss gap): no floor is below bfloat16's eps there."""
    report = dist.assert_same_training(P.fsdp_mixed_precision_train, P.autocast_one_device, dist.world_size,
                                       record="optimizer", steps=8)
    assert report.facts.dtype == "bfloat16"
    with pytest.raises(ParityError, match="gradients scaled by the world size"):
        dist.assert_same_training(functools.partial(P.fsdp_mixed_precision_train, bug="loss_times_world"),
                                  P.autocast_one_device, dist.world_size, record="optimizer", steps=2)


@world_sizes(2)
def test_a_side_that_runs_out_of_steps_is_named(dist):
    with pytest.raises(StepCountError, match=r"took 4 optimizer step\(s\)\.\nA side that ends before"):
        dist.assert_same_training(tutorial(dist.world_size, total_epochs=1, size=128),
                                  tutorial_reference(dist.world_size, total_epochs=1, size=128), spawn=True, steps=6)


def test_spawn_needs_record_optimizer_and_record_is_checked():
    from pytest_mgpu.parity.training import assert_same_training

    with pytest.raises(ValueError, match="spawn=True runs an mp.spawn entry point unchanged, which takes no log"):
        assert_same_training(None, print, print, spawn=True, record="log")
    with pytest.raises(ValueError, match="record must be one of 'log', 'optimizer', got 'step'"):
        assert_same_training(None, print, print, record="step")
