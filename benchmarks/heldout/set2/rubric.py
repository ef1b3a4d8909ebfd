"""The expected first cause of every bug of ``benchmarks/heldout/set2/``, written and committed before any
benchmark run, and not changed after.

One record per bug: ``id`` ("family.bug"), ``family``, ``what`` (the bug, one line), ``phase``
(where it first shows in a step: "state before step", "inputs", "loss", "raw gradients", "synced
gradients", "update"), ``how`` ("one rank alone", "uniform factor <value>", "some modules <names>",
"certain rows"), and ``accept``: lowercase regexes, any one of which found in the FIRST "likely
cause" line of the failure message makes the diagnosis right. ``accept`` names the cause (what a
competent engineer would accept as naming the bug), not an expected wording: a line that only says
something "differs" or "diverges" is not accepted. Factors are those at 2 ranks.
"""
from __future__ import annotations

import re

# what names each kind of cause
INIT = r"seed|broadcast|sync_module_states|src_data_rank|\binit(iali[sz]\w*|ial (weights|param\w*|values))?\b|start(ed)? (from )?different"
LR = r"learning rate|\blr\b|schedul"
NOT_SYNCED = (r"all[-_ ]?reduc|reduce[-_ ]scatter|not (been )?(synchroni[sz]ed|averaged|reduced|all-reduced)"
              r"|never (averaged|reduced|synchroni[sz]ed)|unsynced|no_sync|(gradients?|grads) (differ|disagree)\w* (across|between) (the )?ranks"
              r"|replicas?\W.{0,40}(gradients?|grads)")
ROWS_SHARED = (r"same (input |training )?(rows|data|batch(es)?|inputs?|samples)|identical (rows|data|batch|inputs?)|sampler"
               r"|not sharded|shard(ed|ing)? .{0,20}(data|rows|batch)|\brows\b")
ACCUM_SCALE = r"accumulat|micro|not divided|without divid|undivided|backward passes"
CLIP = r"clip"
EMA = r"\bema\b|teacher|momentum|moving average|averaged model"
DECAY = r"weight[_ ]decay|\bwd\b|decay|param(eter)? groups?"
OPT_ORPHAN = (r"optimi[sz]er.{0,80}(before|wrap|flat|copy|no model|not run|stale|old|orig|dtensor|fully_shard)"
              r"|never (move|change|updated)|flat.?param|use_orig_params"
              r"|(parameters|params).{0,40}(not|never).{0,20}(stepped|move|updat|train)")


def _r(family, bug, what, phase, how, *accept):
    return {"id": f"{family}.{bug}", "family": family, "what": what, "phase": phase, "how": how,
            "accept": list(accept)}


RUBRIC = [
    # cnn_bn: torchvision classification reference, DDP, BatchNorm per rank, SGD momentum, MultiStepLR
    _r("cnn_bn", "no_set_epoch", "sampler.set_epoch never called: epochs 1, 2 repeat epoch 0's order", "inputs",
       "certain rows", r"set_epoch", r"epoch.{0,40}(same|repeat|again|order)", r"shuffl", r"(same|repeated?) (rows|order)"),
    _r("cnn_bn", "sched_per_iter", "MultiStepLR stepped per iteration: lr halved from step 1 instead of step 2",
       "state before step", "uniform factor 0.5 (lr, from step 1)", LR),
    _r("cnn_bn", "eval_left_on", "model.train() not called after validation: BatchNorm in eval mode from step 2",
       "loss", "some modules BatchNorm (1, 4)",
       r"eval(uation)? mode|\.eval\(\)|\.train\(\)|training mode|train mode|running (stats|statistics|mean|var)"),
    _r("cnn_bn", "norm_decay", "weight decay applied to the BatchNorm parameters (param groups unused)", "update",
       "some modules BatchNorm weights and biases", DECAY),
    _r("cnn_bn", "batch_not_divided", "per-rank batch = global batch: the ranks train on 2x the reference's rows",
       "inputs", "certain rows (twice as many per step)",
       r"batch size|batch .{0,30}(world|multipl|divid|larger|twice)|\brows\b|more (rows|samples|data)|sampler|number of samples"),
    _r("cnn_bn", "zero_grad_per_epoch", "zero_grad once per epoch: the second step of an epoch adds the first's gradients",
       "raw gradients", "certain steps (every second)",
       r"zero_grad|not zeroed|(gradients?|grads) .{0,30}(accumulat|carried|kept|previous)|previous step'?s? grad"),
    _r("cnn_bn", "lr_scaled_world", "lr multiplied by the world size on top of the global batch", "state before step",
       "uniform factor 2 (lr)", LR, r"step size"),

    # gpt_accum: nanoGPT train.py, DDP, require_backward_grad_sync accumulation, AdamW groups, cosine lr, clipping
    _r("gpt_accum", "sync_first_micro", "require_backward_grad_sync true on the first micro-step, not the last",
       "synced gradients", "one rank alone (replicas disagree)", NOT_SYNCED,
       r"require_backward_grad_sync|sync(hroni[sz]ation)? flag|last micro"),
    _r("gpt_accum", "loss_not_scaled", "micro-batch loss not divided by gradient_accumulation_steps", "loss",
       "uniform factor 2 (loss; clipping hides it in the gradients)", ACCUM_SCALE),
    _r("gpt_accum", "accum_not_split", "gradient_accumulation_steps not divided by the world size: 2x the rows per step",
       "inputs", "certain rows (twice as many micro-batches per rank)",
       r"accumulation steps|gradient_accumulation|micro|backward passes|batch size|global batch|more (rows|tokens|samples)|\brows\b"),
    _r("gpt_accum", "lr_first_group", "lr schedule written into param group 0 only: the no-decay group keeps base lr",
       "state before step", "some modules (biases, LayerNorm weights)", LR, r"param(eter)? groups?"),
    _r("gpt_accum", "decay_all", "weight decay on biases and LayerNorm weights too", "update",
       "some modules (biases, LayerNorm weights)", DECAY),
    _r("gpt_accum", "same_rows", "every rank reads the same micro-batches", "inputs", "certain rows (duplicated across ranks)",
       ROWS_SHARED, r"offset|rank-dependent (data|rows|input)"),
    _r("gpt_accum", "clip_each_micro", "clip_grad_norm_ inside the micro loop, on local partial gradients",
       "synced gradients", "uniform factor per step (clip coefficient)", CLIP),
    _r("gpt_accum", "iter_per_micro", "iteration counter advanced per micro-step: lr schedule runs 2x fast",
       "state before step", "uniform factor (lr schedule ahead from step 1)", LR),

    # fsdp1_tut: FSDP tutorial, FULL_SHARD, flat params, StepLR, model.clip_grad_norm_
    _r("fsdp1_tut", "no_sampler", "no DistributedSampler: every rank draws from the whole data set", "inputs",
       "certain rows", ROWS_SHARED),
    _r("fsdp1_tut", "sum_reduction", "nll_loss(reduction='sum'): loss and gradients 4x (local batch size)", "loss",
       "uniform factor 4", r"reduction|\bsum(med)?\b|batch size|local batch|per[- ]row"),
    _r("fsdp1_tut", "optimizer_before_wrap", "optimizer built before FSDP: it steps the pre-flattening parameters",
       "update", "some modules (all: no parameter of the model moves)", OPT_ORPHAN),
    _r("fsdp1_tut", "sched_per_batch", "StepLR stepped per batch instead of per epoch", "state before step",
       "uniform factor 0.7 (lr, from step 1)", LR),
    _r("fsdp1_tut", "clip_local_shards", "torch.nn.utils.clip_grad_norm_ on FSDP1: norm of the local shard",
       "synced gradients", "one rank alone (per-rank clip coefficient)", CLIP, r"(local|shard).{0,30}norm|norm.{0,30}(local|shard)"),
    _r("fsdp1_tut", "seed_apart", "ranks seeded apart, sync_module_states False: shards of different inits",
       "state before step", "one rank alone", INIT),

    # fsdp2_mp: fully_shard + MixedPrecisionPolicy + set_requires_gradient_sync accumulation, AdamW, warmup, clip
    _r("fsdp2_mp", "sync_flag_first", "set_requires_gradient_sync true on the first micro-batch, not the last",
       "synced gradients", "certain rows (the last micro-batch's gradients never reduced)", NOT_SYNCED,
       r"requires_gradient_sync|sync(hroni[sz]ation)? flag|last micro"),
    _r("fsdp2_mp", "optimizer_before_shard", "AdamW built before fully_shard: it steps orphaned parameters", "update",
       "some modules (all)", OPT_ORPHAN),
    _r("fsdp2_mp", "seed_apart", "ranks seeded apart: fully_shard keeps each rank's own init shard", "state before step",
       "one rank alone", INIT),
    _r("fsdp2_mp", "loss_not_divided", "micro-batch loss not divided by the accumulation steps", "loss",
       "uniform factor 2 (loss; clipping hides it in the gradients)", ACCUM_SCALE),
    _r("fsdp2_mp", "clip_local_norm", "hand-written clip with the local shards' norm", "synced gradients",
       "one rank alone (per-rank clip coefficient)", CLIP, r"(local|shard).{0,30}norm|norm.{0,30}(local|shard)"),
    _r("fsdp2_mp", "first_micro_repeated", "every micro-batch of a step is the first one (iterator re-created)",
       "inputs", "certain rows", r"same (rows|data|batch|inputs?|micro)|repeat|\brows\b|data ?loader|iterator",
       r"micro.?batch.{0,40}(same|again|twice)"),
    _r("fsdp2_mp", "sched_per_micro", "warmup LambdaLR stepped per micro-batch", "state before step",
       "uniform factor (lr warmup ahead from step 1)", LR),

    # tp_sp: torchtitan-style TP + SequenceParallel + loss_parallel
    _r("tp_sp", "heads_not_local", "n_heads not divided by the TP degree: local heads reshaped wrong", "loss",
       "some modules attention", r"\bheads?\b|n_heads|view|reshape|attention"),
    _r("tp_sp", "rank_rows", "each TP rank feeds its own rows", "inputs", "certain rows (rank-dependent)",
       r"(different|rank-dependent|own|differing) (rows|inputs?|data|batch)", r"same (batch|input|rows)", r"\brows\b",
       r"sampler", r"inputs?.{0,40}(differ|rank)"),
    _r("tp_sp", "norm_not_sp", "norms not in the plan under sequence parallel: their gradients never summed over TP",
       "synced gradients", "some modules (attention_norm, ffn_norm, norm)",
       r"sequence.?parallel|layernorm|_norm\b|\bnorm layers?|\bnorms\b|tp group|tensor.parallel (group|mesh)",
       r"not (been )?(reduced|all-reduced|summed)|partial"),
    _r("tp_sp", "lr_times_tp", "lr multiplied by the TP world size", "state before step", "uniform factor 2 (lr)", LR),
    _r("tp_sp", "loss_div_tp", "loss divided by the world size before backward", "loss", "uniform factor 0.5",
       r"world size|divid|\bhalf\b|0?\.5 ?(x|×|times)|1/2|inverse"),
    _r("tp_sp", "seed_no_scatter", "ranks seeded apart and src_data_rank=None: shards from different inits",
       "state before step", "one rank alone", INIT, r"scatter"),

    # comm_hook_zero: DDP comm hooks, ZeroRedundancyOptimizer, StepLR
    _r("comm_hook_zero", "hook_no_div", "all-reduce hook never divides by the world size", "synced gradients",
       "uniform factor 2", r"hook", r"world size", r"not divid|without divid", r"\bsum(med)?\b",
       r"\b2(\.0+)? ?(x|×|times)|twice|doubl"),
    _r("comm_hook_zero", "hook_div_twice", "hook divides before and after the all_reduce", "synced gradients",
       "uniform factor 0.5", r"hook", r"world size", r"divid", r"\bhalf\b|0?\.5 ?(x|×|times)|1/2|inverse"),
    _r("comm_hook_zero", "hook_no_comm", "hook returns the local bucket: no all_reduce at all", "synced gradients",
       "one rank alone (replicas disagree)", NOT_SYNCED, r"hook"),
    _r("comm_hook_zero", "hook_skip_last_bucket", "hook skips the all_reduce of the last bucket", "synced gradients",
       "some modules (first layers, the last bucket)", NOT_SYNCED, r"hook|bucket"),
    _r("comm_hook_zero", "hook_div_node_size", "hook divides by 8 (GPUS_PER_NODE) instead of the world size",
       "synced gradients", "uniform factor 0.25", r"hook", r"divid", r"0?\.25 ?(x|×|times)|1/4|quarter",
       r"(another|wrong|other) constant"),
    _r("comm_hook_zero", "sched_rank0_only", "scheduler stepped on rank 0 only: rank 1's ZeRO shard keeps the old lr",
       "state before step", "one rank alone (rank 1's parameter shard)", LR),

    # dino_teacher: DINO student/teacher, EMA, all-reduced center, frozen last layer, wd schedule
    _r("dino_teacher", "center_local", "center updated without all_reduce", "loss", "one rank alone (per-rank center)",
       r"cent(er|re)", r"all[-_ ]?reduc", r"not (been )?(reduced|synchroni[sz]ed)", r"buffer"),
    _r("dino_teacher", "ema_rank0_only", "teacher EMA updated on rank 0 only", "loss", "one rank alone (rank 1's teacher)",
       EMA, r"main process|rank 0 only|only (on )?rank 0"),
    _r("dino_teacher", "momentum_swapped", "EMA weights swapped (1 - m on the teacher)", "loss",
       "some modules (the teacher: all)", EMA),
    _r("dino_teacher", "ema_before_step", "EMA update before optimizer.step: teacher one step behind", "loss",
       "some modules (the teacher: all)", EMA, r"(before|after) .{0,20}(optimizer\.)?step"),
    _r("dino_teacher", "last_layer_trained", "last layer not frozen during the first epoch", "update",
       "some modules (head.last_layer)", r"last[_ ]layer|frozen|freez|requires_grad|cancel",
       r"(parameters?|params).{0,40}(should not|must not|not be) (train|move|updat)"),
    _r("dino_teacher", "teacher_not_copied", "teacher not loaded from the student: its own random init", "loss",
       "some modules (the teacher: all)", r"teacher|\bema\b|load_state_dict|not copied|copy of"),
    _r("dino_teacher", "momentum_by_epoch", "momentum schedule indexed by epoch instead of iteration", "loss",
       "some modules (the teacher: all)", EMA),
    _r("dino_teacher", "wd_all_groups", "weight decay schedule written into the no-decay group too", "update",
       "some modules (biases, LayerNorm)", DECAY),

    # moe_top2: expert parallel, top-2 gating with capacity, variable all_to_all_single
    _r("moe_top2", "expert_grads_allreduced", "expert gradients all-reduced like dense ones: experts mixed across ranks",
       "synced gradients", "some modules (moe.experts.*)",
       r"expert.{0,80}(all[-_ ]?reduc|averag|mix|sum|shared|replica)|(all[-_ ]?reduc|averag).{0,80}expert"),
    _r("moe_top2", "expert_grads_not_scaled", "expert gradients not divided by the world size", "synced gradients",
       "some modules (moe.experts.*) uniform factor 2",
       r"expert.{0,80}(world size|twice|doubl|not divid|scal|\b2(\.0+)? ?(x|×|times))|(world size|twice|doubl|not divid).{0,80}expert"),
    _r("moe_top2", "gate_not_reduced", "router (moe.wg) gradients never all-reduced", "synced gradients",
       "some modules (moe.wg), one rank alone", r"gate|router|\bwg\b", NOT_SYNCED),
    _r("moe_top2", "plain_all_to_all", "non-autograd all_to_all: expert outputs detached, experts get no gradient",
       "raw gradients", "some modules (moe.experts.*, inp partly)",
       r"all[-_ ]?to[-_ ]?all|detach|autograd|differentiab|no grad(ient)?s?\b|never (receive|get)|zero gradient|grad(ient)? (is )?(none|missing)"),
    _r("moe_top2", "striped_owner", "tokens sent to expert % W while experts are placed in blocks", "loss",
       "certain rows (tokens to the wrong experts)",
       r"expert.{0,80}(placement|owner|wrong|index|mapping|route|routing|dispatch)|rout|dispatch|placement|all[-_ ]?to[-_ ]?all"),
    _r("moe_top2", "capacity_global", "capacity from the global token count: no tokens dropped", "loss",
       "certain rows (tokens kept that the reference drops)", r"capacity|drop|token"),
    _r("moe_top2", "experts_same_init", "every rank builds its local experts itself: rank 1's experts copy 0 and 1",
       "state before step", "one rank alone (rank 1's experts)", INIT,
       r"expert.{0,60}(same|identical|copies|copy)"),
]

BY_ID = {r["id"]: r for r in RUBRIC}


def right(bug_id: str, cause: str | None) -> bool:
    """Whether ``cause`` (the first "likely cause" line) names the expected cause of ``bug_id``."""
    if not cause:
        return False
    text = cause.lower()
    return any(re.search(p, text) for p in BY_ID[bug_id]["accept"])
