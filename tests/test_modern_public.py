"""assert_same_training(record="optimizer") on small equivalents of the modern stack's public trainers
(tests/modern_public.py: FSDP2 with its DCP checkpointer, tensor and sequence parallel, 2-D FSDP x TP with
SequenceParallel norms, DDP with accumulation and StepLR, uneven shards, a model rebuilt in the process).
Each correct run passes at 2 and 4 ranks; each bug fails with its cause, and its fix, in the first 500
characters of the message (what a junit report keeps)."""
import functools

import pytest

from pytest_mgpu import ParityError, world_sizes
from tests import modern_public as T
from tests.test_junit_messages import assert_cause, junit_head

P = functools.partial

# name -> (fn, reference_fn, steps)
CORRECT = {
    "fsdp2 adamw + clipping": (T.fsdp_train, T.fsdp_reference, 6),
    "fsdp2 dcp resume, reference straight": (P(T.fsdp_ckpt_train, save_at=3), P(T.fsdp_ckpt_reference, save_at=3), 6),
    "fsdp2 dcp resume, reference resumes too": (P(T.fsdp_ckpt_train, save_at=3),
                                                P(T.fsdp_ckpt_reference, save_at=3, checkpoint=True), 6),
    "ddp accumulation + steplr": (T.accum_train, T.accum_reference, 8),
    "sequence parallel": (T.sp_train, T.sp_reference, 6),
    "tensor parallel": (T.tp_train, T.tp_reference, 6),
    "ddp 22 rows, drop_last=False": (T.uneven_train, T.uneven_reference, 6),
    "model rebuilt in the rank": (T.rebuild_train, T.rebuild_reference, 6),
    # parallelize_module scatters rank 0's weights (src_data_rank=0): seeding by rank before it is harmless
    "tp seeded by rank before parallelize_module": (P(T.tp_train, bug="rank_seed"), T.tp_reference, 6),
}

# name -> (world size, fn, reference_fn, steps, the cause the first line must name)
BUGS = {
    "fsdp2 clip by a norm of local shards": (2, P(T.fsdp_train, bug="local_clip"), T.fsdp_reference, 4,
                                             "gradient clipping differs"),
    "fsdp2 clip_grads_with_norm_ of local shards": (2, P(T.fsdp_train, bug="local_clip_api"), T.fsdp_reference, 4,
                                                    "gradient clipping differs"),
    "fsdp2 no zero_grad": (2, P(T.fsdp_train, bug="no_zero_grad"), T.fsdp_reference, 4,
                           "gradients not zeroed between steps"),
    "resume without optimizer state": (2, P(T.fsdp_ckpt_train, save_at=3, bug="no_optim_state"),
                                       P(T.fsdp_ckpt_reference, save_at=3), 6, "the optimizer's state differs"),
    "sequence-parallel norm not reduced over tp": (4, P(T.fsdp_tp_train, bug="norm_not_sp"), T.fsdp_tp_reference, 4,
                                                   "gradients not reduced across the tensor-parallel group"),
    "accumulation loss not divided": (2, P(T.accum_train, bug="no_divide"), T.accum_reference, 4,
                                      "gradient accumulation without dividing the loss"),
    "accumulation loss not divided, 4 ranks": (4, P(T.accum_train, bug="no_divide"), T.accum_reference, 4,
                                               "gradient accumulation without dividing the loss"),
    "scheduler stepped per micro-batch": (2, P(T.accum_train, bug="sched_per_micro"), T.accum_reference, 8,
                                          "the scheduler is stepped per micro-batch. Fix: call "
                                          "scheduler.step() right after"),
    "data restarted on resume": (2, P(T.fsdp_ckpt_train, save_at=3, bug="data_restart"),
                                 P(T.fsdp_ckpt_reference, save_at=3), 6, "data repeated"),
    "meta init, blocks never reset": (2, P(T.fsdp_train, bug="meta_partial_reset"), T.fsdp_reference, 3,
                                      "non-finite weights at step 0"),
    "tp with rank-dependent inputs": (2, P(T.tp_train, bug="rank_inputs"), T.tp_reference, 3,
                                      "rank-dependent inputs to a tensor-parallel model"),
    "uneven shards, local mean loss": (4, T.uneven_local_mean_train, T.uneven_global_mean_reference, 6,
                                       "unequal shards"),
    "lr times the world size": (2, P(T.fsdp_train, bug="lr_times_world"), T.fsdp_reference, 3,
                                "the ranks' learning rate is world size x the reference's"),
    "tp seeded by rank, no scatter": (2, P(T.tp_train, bug="rank_seed_local"), T.tp_reference, 3,
                                      "the ranks start from different weights"),
}


@world_sizes(2, 4)
@pytest.mark.parametrize("name", list(CORRECT))
def test_correct_runs_pass(dist, name):
    fn, ref, steps = CORRECT[name]
    report = dist.assert_same_training(fn, ref, dist.world_size, steps=steps, record="optimizer")
    assert report.passed and len(report.records) == steps


@pytest.mark.gpu4
def test_fsdp_x_tp_2d_passes(dist):
    report = dist.assert_same_training(T.fsdp_tp_train, T.fsdp_tp_reference, 4, steps=5, record="optimizer")
    assert any("tensor/sequence-parallel peers share one batch" in n for n in report.notes), report.notes


def _bug(dist, name):
    _, fn, ref, steps, cause = BUGS[name]
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(fn, ref, dist.world_size, steps=steps, record="optimizer")
    head = junit_head(f"pytest_mgpu.parity.report.ParityError: {info.value}")
    if ". Fix: " in cause:  # the cause, its evidence in parentheses, then its fix
        assert_cause(f"likely cause: {cause}", head)
    else:
        assert f"likely cause: {cause}" in head, str(info.value)


@world_sizes(2)
@pytest.mark.parametrize("name", [n for n, v in BUGS.items() if v[0] == 2])
def test_bugs_name_their_cause(dist, name):
    _bug(dist, name)


@pytest.mark.gpu4
@pytest.mark.parametrize("name", [n for n, v in BUGS.items() if v[0] == 4])
def test_bugs_name_their_cause_at_4(dist, name):
    _bug(dist, name)
