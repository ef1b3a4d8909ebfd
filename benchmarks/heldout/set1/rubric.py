"""The expected first cause of every held-out bug, written before any run and not changed after.

One record per bug: ``id`` ("family.bug"), ``family``, ``what`` (the bug, one line), ``phase`` (where
it first shows: "state before step", "inputs", "loss", "raw gradients", "synced gradients",
"update"), ``how`` ("one rank alone", "uniform factor <value>", "some modules <names>",
"certain rows"), and ``accept``: lowercase regexes, any of which found in the FIRST "likely cause"
line of the failure message makes the diagnosis right. ``accept`` names the cause, not a wording.
Factors are those at 2 ranks.
"""
from __future__ import annotations

import re

SEED = r"seed|did not start from the same|start(ed)? apart|broadcast|init(iali[sz]ation|ial weights)? .{0,20}differ|rank-dependent init"
LR = r"learning rate|\blr\b|schedul"
NO_SYNC = (r"all_reduce|all-reduce|allreduce|no_sync|not (been )?(synchroni[sz]ed|averaged|reduced)"
           r"|never (averaged|reduced|synchroni[sz]ed)|gradients differ")
HALF = r"world size|\b0?\.5 ?(x|×|times)|half|inverse|divided twice|divid"
DOUBLE = r"world size|\b2(\.0+)? ?(x|×|times)|twice|sum(med)?\b.{0,40}without divid|not divided"
ROWS = r"\brows?\b|sampler|shard|same (data|input|batch)|different (data|inputs?|batch)"


def _r(family, bug, what, phase, how, *accept):
    return {"id": f"{family}.{bug}", "family": family, "what": what, "phase": phase, "how": how,
            "accept": list(accept)}


RUBRIC = [
    _r("lm_ddp", "lr_rank", "rank 1's optimizer has twice the lr", "state before step", "one rank alone", LR),
    _r("lm_ddp", "sched_twice", "LambdaLR stepped twice per step", "state before step",
       "uniform factor (lr schedule 2 steps ahead from step 1)", LR),
    _r("lm_ddp", "warmup_total", "schedule length from len(dataset)/local batch: warm-up 2x long",
       "state before step", "uniform factor 0.5 (lr)", LR),
    _r("lm_ddp", "unwrapped_forward", "forward through ddp.module: no all-reduce", "synced gradients",
       "one rank alone", NO_SYNC, r"ddp|wrapp|\.module"),
    _r("lm_ddp", "no_set_epoch", "set_epoch never called: epoch 1 repeats epoch 0's order", "inputs",
       "certain rows", r"set_epoch|epoch|same rows|repeat|shuffle|order"),
    _r("lm_ddp", "loss_times_world", "loss multiplied by the world size (clipping evens the grads)", "loss",
       "uniform factor 2", DOUBLE, r"multipl|backpropagated|loss .{0,30}(scal|factor)"),
    _r("lm_ddp", "clip_rank0_only", "clip_grad_norm_ on rank 0 only", "synced gradients", "one rank alone",
       r"clip|norm"),
    _r("lm_ddp", "no_zero_grad", "zero_grad once before the loop only", "synced gradients",
       "uniform factor (previous steps' gradients added from step 1)", r"zero_grad|not zeroed|zeroed|accumulat|previous"),
    _r("fsdp2_accum", "loss_not_divided", "micro-batch loss not divided by 2", "raw gradients", "uniform factor 2",
       r"accumulat|not divided|divid|\b2(\.0+)? ?(x|×|times)|twice|micro|backward passes"),
    _r("fsdp2_accum", "sync_inverted", "set_requires_gradient_sync(micro == 0)", "synced gradients",
       "certain rows", r"accumulat|sync|micro|set_requires_gradient_sync|backward pass"),
    _r("fsdp2_accum", "same_rows", "every rank takes the first rows", "inputs", "certain rows", ROWS),
    _r("fsdp2_accum", "lr_scaled", "lr x world size with the same global batch", "state before step",
       "uniform factor 2 (lr)", LR),
    _r("fsdp2_accum", "seed_apart", "seed + rank, fully_shard keeps each rank's init", "state before step",
       "one rank alone", SEED),
    _r("zero_ddp", "no_ddp", "ZeRO without DDP: gradients never averaged", "synced gradients", "one rank alone",
       NO_SYNC, r"\bddp\b|distributeddataparallel"),
    _r("zero_ddp", "rank_lr", "rank 1's ZeRO optimizer (its shard) has twice the lr", "state before step",
       "one rank alone", LR),
    _r("zero_ddp", "rank_seed_data", "each rank's batch from a generator seeded with its rank", "inputs",
       "certain rows", ROWS),
    _r("zero_ddp", "loss_div_world", "loss divided by the world size under DDP", "raw gradients",
       "uniform factor 0.5", HALF),
    _r("comm_hooks", "hook_no_divide", "hand-written hook never divides", "synced gradients", "uniform factor 2",
       DOUBLE, r"\bsum\b|average|hook"),
    _r("comm_hooks", "hook_divide_twice", "hook divides before and after", "synced gradients",
       "uniform factor 0.5", HALF, r"hook"),
    _r("comm_hooks", "bf16_manual_avg", "bf16 hook plus a manual division by the world size",
       "synced gradients", "uniform factor 0.5", HALF),
    _r("comm_hooks", "hook_skip_first", "hook returns the local bucket on the first iteration",
       "synced gradients", "one rank alone", NO_SYNC, r"hook"),
    _r("fsdp1", "optimizer_before_wrap", "optimizer over the pre-wrap parameters (use_orig_params=False)",
       "update", "some modules (all: nothing the model runs moves)",
       r"optimi[sz]er.{0,80}(before|wrap|built|copy|other param|no model)|never mov|(before|after) (fsdp|wrapping)|flat"),
    _r("fsdp1", "reduction_sum", "nll_loss reduction='sum' on the ranks", "raw gradients",
       "uniform factor 4 (the local batch)", r"reduction|\bsum\b|\b4(\.0+)? ?(x|×|times)|batch size"),
    _r("fsdp1", "steplr_per_batch", "StepLR stepped per batch, not per epoch", "state before step",
       "uniform factor 0.7 (lr at step 1)", LR),
    _r("fsdp1", "clip_local", "clip_grad_norm_ over the local flat shards", "synced gradients", "one rank alone",
       r"clip|norm"),
    _r("fsdp1", "seed_apart", "seed + rank, no sync_module_states", "state before step", "one rank alone",
       SEED, r"sync_module_states"),
    _r("tp_plan", "rank_data", "each rank's input seeded with its rank", "inputs", "certain rows",
       ROWS, r"input|rank-dependent|fed"),
    _r("tp_plan", "lr_rank", "rank 1's optimizer has twice the lr", "state before step", "one rank alone", LR),
    _r("tp_plan", "loss_div_world", "loss divided by the world size", "raw gradients", "uniform factor 0.5",
       HALF, r"scal"),
    _r("tp_plan", "seed_apart", "seed + rank, src_data_rank=None: each rank keeps its own chunk",
       "state before step", "some modules blocks.*.in_proj, blocks.*.out_proj", SEED, r"src_data_rank"),
    _r("dino_ema", "ema_rank0_only", "teacher EMA updated on rank 0 only", "state before step",
       "one rank alone", r"\bema\b|teacher|averaged ?model|update_parameters|momentum|only on rank|rank 0 only"),
    _r("dino_ema", "center_not_reduced", "center from the local batch, no all_reduce", "state before step",
       "one rank alone", r"center|buffer|all_reduce|all-reduce|not (synchroni|reduc)"),
    _r("dino_ema", "center_sum", "center's batch mean all-reduced, divided by the local count",
       "state before step", "uniform factor 2 (center)", r"center|buffer|world size|\bsum\b"),
    _r("dino_ema", "ema_before_step", "EMA update before optimizer.step()", "state before step",
       "some modules teacher", r"\bema\b|teacher|averaged ?model|update_parameters|momentum|before (the )?optimi[sz]er"),
    _r("moe_ep", "gate_not_reduced", "router gradients never all-reduced", "synced gradients",
       "some modules gate", r"gate|router", NO_SYNC),
    _r("moe_ep", "expert_grad_2x", "expert gradients not divided by the world size", "synced gradients",
       "some modules experts (uniform factor 2)", r"expert|\b2(\.0+)? ?(x|×|times)|world size|twice"),
    _r("moe_ep", "expert_grad_allreduced", "expert gradients all-reduced across different experts",
       "synced gradients", "some modules experts", r"expert|mix|all_reduce|all-reduce"),
    _r("moe_ep", "seed_apart", "seed + rank before building", "state before step", "one rank alone", SEED),
    _r("moe_ep", "combine_order", "expert outputs not unsorted", "loss", "certain rows",
       r"order|permut|\bsort|unsort"),
    _r("ddp_nosync", "loss_not_divided", "micro-batch loss not divided by 3", "raw gradients",
       "uniform factor 3", r"accumulat|not divided|divid|\b3(\.0+)? ?(x|×|times)|backward passes"),
    _r("ddp_nosync", "nosync_all", "no_sync on every micro-batch", "synced gradients", "one rank alone",
       NO_SYNC, r"never reduced"),
    _r("ddp_nosync", "zero_grad_micro", "zero_grad inside the micro-batch loop", "synced gradients",
       "certain rows", r"zero_grad|zeroed|accumulat|micro|backward pass"),
    _r("ddp_nosync", "buffers_apart", "seed + rank, broadcast_buffers=False: buffer differs on rank 1",
       "state before step", "one rank alone", r"buffer|broadcast|seed|did not start from the same"),
    _r("ddp_nosync", "steplr_per_micro", "StepLR stepped per micro-batch", "state before step",
       "uniform factor 0.5 (lr at step 1)", LR),
    _r("ddp_nosync", "sampler_rank0", "DistributedSampler(rank=0) in every rank", "inputs", "certain rows",
       ROWS, r"rank=0"),
]
BY_ID = {r["id"]: r for r in RUBRIC}


def right(bug_id: str, cause: str | None) -> bool:
    """Whether ``cause`` (the first "likely cause" line) names the expected cause of ``bug_id``."""
    if not cause:
        return False
    text = cause.lower()
    return any(re.search(p, text) for p in BY_ID[bug_id]["accept"])
