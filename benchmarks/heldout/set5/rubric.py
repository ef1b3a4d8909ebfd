"""Per bug of ``benchmarks/heldout/set5/``, the first cause expected (``EXPECTED``, in words) and the
regexes that accept a diagnosis naming it (``RUBRIC``), written from what each bug is before any run
of the plugin on this set. A diagnosis is the first "likely cause" line, lower-cased; it is right when
any regex of its bug searches successfully.
"""
from __future__ import annotations

import re

NOT = r"(not|never|no|without|missing|unsynchroni[sz]ed|un-?reduced|partial|local|skipped)"
SYNC = r"(all[- ]?reduc|synchroni[sz]|summed|averag|reduced)"
LR = r"(learning rate|\blr\b|lrs\b|schedul)"
W_FACTOR = r"((\bfactor|\btimes|\bx|×)\s*(of\s*)?(2(\.0+)?\b|the world size|world[_ ]size)|(multiplied|scaled) by (2\b|the world size)|doubled|twice)"
SLICE = r"(slice|shard|split|block|layout|partition|interleav|strid|order)"
START = r"(start\w* (from|with) (different|other|another)|initiali[sz]|\binit\b|before any update|at step 0 the weights)"


def _names(name: str, what: str) -> str:
    """A line naming both ``name`` and ``what`` (in either order)."""
    return rf"(?=.*{name})(?=.*{what})"


EXPECTED: dict[str, str] = {
    "tp_mlp.wrong_slice": "the ranks' fc1 shards are not the full weight's blocks (a wrong slice): fc1 differs from the reference from step 0",
    "tp_mlp.copy_no_bwd_allreduce": "the gradients of ln/inp (before the tensor-parallel region) are not all-reduced over the peers: partial, differ between ranks",
    "tp_mlp.allreduce_both": "the tensor-parallel layers' gradients are multiplied by the world size (all-reduce in the backward too)",
    "tp_mlp.row_bias_every_rank": "the row-parallel bias is added on every rank before the all-reduce (counted world-size times)",
    "tp_mlp.local_init": "the ranks start from weights other than the reference's (each shard initialised on its own)",
    "tp_mlp.dp_allreduce_all": "the sharded (tensor-parallel) gradients are averaged across ranks as if replicated",
    "tp_mlp.sp_ln_not_reduced": "the LayerNorm's gradients are not all-reduced under sequence parallelism",
    "tp_mlp.sp_loss_not_scaled": "the loss/gradients are the world size times too large (the ranks' means summed, not averaged)",
    "tp_attn.heads_not_divided": "the rank uses the global number of heads (head_dim wrong) in its attention",
    "tp_attn.reduce_avg": "the row-parallel output is averaged (divided by the world size) instead of summed",
    "tp_attn.v_strided_slice": "v_proj's shards are not the heads' blocks (a wrong slice)",
    "tp_attn.swapped_mappings": "the forward all-reduce sits before q/k/v and none after o_proj (region mappings swapped): outputs partial",
    "tp_attn.o_bias_every_rank": "the row-parallel o_proj bias is added on every rank before the all-reduce",
    "tp_fused.contiguous_slice": "the fused c_attn is sliced as a contiguous block, not each rank's q, k, v rows (wrong qkv slice/layout)",
    "tp_fused.per_head_split": "the local fused qkv is split in another layout (per head) than it was sliced",
    "moe_ep.gate_not_allreduced": "the router gate's gradients are not all-reduced (replicas of the gate differ)",
    "moe_ep.capacity_per_rank": "the expert capacity is computed per rank (tokens dropped)",
    "moe_ep.router_noise_local": "the router jitter is drawn per rank from the global RNG (randomness differs)",
    "moe_ep.aux_local_fraction": "the load-balancing (aux) loss uses the rank's own dispatch fractions",
    "moe_ep.expert_grads_not_scaled": "the experts' gradients are the world size times too large (not divided)",
    "moe_ep.experts_allreduced": "the experts' gradients are averaged across ranks though each rank holds other experts",
    "amp_timm.clip_before_unscale": "the gradients are clipped while still scaled (clip before scaler.unscale_)",
    "amp_timm.backward_unscaled_loss": "the backward ran on the unscaled loss while the scaler unscales: gradients 1/65536 of the reference's",
    "amp_timm.sched_per_micro": "the scheduler is stepped per micro-batch: the learning rate differs",
    "amp_timm.warmup_not_scaled": "the warm-up schedule is W times too long: the learning rate differs",
    "amp_timm.lr_local_batch": "the learning rate is scaled with the per-rank batch: 1/W of the reference's",
    "amp_timm.no_sync_last_micro": "the last micro-batch's gradients are not all-reduced (no_sync on the wrong micro-batches)",
    "val_plateau.left_in_eval": "the model is left in eval mode after validation (dropout off in training)",
    "val_plateau.no_eval_mode": "validation runs in train mode: dropout active, its random masks consumed",
    "val_plateau.val_not_allreduced": "the plateau scheduler is fed the rank's own validation loss: the ranks' learning rates differ",
    "val_plateau.val_backward": "the validation loss goes through backward: extra gradients in the next step",
    "val_plateau.val_from_train_rows": "the validation rows are training rows: the plateau decision (learning rate) differs",
    "val_plateau.plateau_every_step": "the plateau scheduler is stepped every step: the learning rate drops early",
    "val_plateau.val_rank0_only": "validation and the plateau step run on rank 0 only: the ranks' learning rates differ",
    "onecycle_ls.total_steps_dataset": "OneCycleLR's length from the dataset over the per-rank batch: the learning rate differs",
    "onecycle_ls.sched_per_epoch": "OneCycleLR stepped per epoch: the learning rate differs",
    "onecycle_ls.no_set_epoch": "sampler.set_epoch is never called: later epochs' rows differ",
    "onecycle_ls.smoothing_twice": "the loss differs with the same weights and rows (labels smoothed twice)",
    "onecycle_ls.max_lr_times_world": "the learning rate is the world size times the reference's",
}

RUBRIC: dict[str, list[str]] = {
    "tp_mlp.wrong_slice": [_names(r"fc1", rf"({SLICE}|{START})"), rf"(wrong|different|mis\w*|another) {SLICE}"],
    "tp_mlp.copy_no_bwd_allreduce": [_names(r"\b(ln|inp|layer ?norm|input)\b", rf"{NOT}\W+(\w+\W+){{0,4}}{SYNC}"),
                                     r"copy[- _]?to", r"backward\W+(\w+\W+){0,4}(all[- ]?reduc|sum)",
                                     _names(r"\b(ln|inp)\b", r"differ between ranks|ranks? differ|replicas? differ")],
    "tp_mlp.allreduce_both": [W_FACTOR, r"all[- ]?reduc\w*\W+(\w+\W+){0,5}(twice|both|backward)"],
    "tp_mlp.row_bias_every_rank": [r"bias\W+(\w+\W+){0,6}(every|each|all|both|per)[- ]ranks?",
                                   r"bias\W+(\w+\W+){0,6}(before|inside|within)\W+(\w+\W+){0,3}(all[- ]?reduc|reduc)",
                                   r"bias\W+(\w+\W+){0,4}(twice|counted|world size|times)"],
    "tp_mlp.local_init": [START, r"seed"],
    "tp_mlp.dp_allreduce_all": [_names(rf"({SLICE}|tensor[- ]parallel|fc1|fc2)", r"(averag|all[- ]?reduc|mix|summed|data[- ]parallel)")],
    "tp_mlp.sp_ln_not_reduced": [_names(r"\b(ln|layer ?norm|norm)\b", rf"({NOT}|differ between ranks|ranks? differ|replicas? differ|only)"),
                                 r"sequence[- ]parallel\W+(\w+\W+){0,6}(gradient|norm)"],
    "tp_mlp.sp_loss_not_scaled": [W_FACTOR, r"loss\W+(\w+\W+){0,6}(not divided|world size|not averaged)",
                                  r"(divid|averag)\w*\W+(\w+\W+){0,4}(world size|ranks)"],
    "tp_attn.heads_not_divided": [r"heads\b", r"head[_ ]?dim", r"attention head", r"per[- ]head", r"num[_ ]heads"],
    "tp_attn.reduce_avg": [r"((factor|times|x|×)\s*(of\s*)?(0\.50*\b|1/2|1 ?/ ?(the )?world|the inverse)|halved|inverse of the world)",
                           r"divided by (2\b|the world size|world)", r"averag\w* (instead|rather|not)",
                           r"mean (instead|rather) of (a )?sum", _names(r"o_proj", r"(all[- ]?reduc|reduc|averag|divid)")],
    "tp_attn.v_strided_slice": [_names(r"v_proj", rf"({SLICE}|{START})"), rf"(wrong|different|mis\w*|another) {SLICE}"],
    "tp_attn.swapped_mappings": [r"(copy|reduce)[- _]?(to|from)", r"(swap|revers|exchang)",
                                 r"forward\W+(\w+\W+){0,5}all[- ]?reduc", r"all[- ]?reduc\w*\W+(\w+\W+){0,5}(forward|output|activation)",
                                 r"(partial|not summed|unsummed|missing)\W+(\w+\W+){0,4}(output|o_proj|all[- ]?reduc)"],
    "tp_attn.o_bias_every_rank": [r"bias\W+(\w+\W+){0,6}(every|each|all|both|per)[- ]ranks?",
                                  r"bias\W+(\w+\W+){0,6}(before|inside|within)\W+(\w+\W+){0,3}(all[- ]?reduc|reduc)",
                                  r"bias\W+(\w+\W+){0,4}(twice|counted|world size|times)"],
    "tp_fused.contiguous_slice": [_names(r"(c_attn|qkv|fused)", rf"({SLICE}|{START})"), rf"(wrong|different|mis\w*|another) {SLICE}"],
    "tp_fused.per_head_split": [_names(r"(c_attn|qkv|fused|attention)", r"(layout|split|interleav|per[- ]head|view|order|heads\b)"),
                                r"(wrong|different|mis\w*|another) (split|layout)"],
    "moe_ep.gate_not_allreduced": [_names(r"\b(gate|router)\b", rf"({NOT}|differ between ranks|ranks? differ|replicas? differ)"),
                                   r"\b(gate|router)\b\W+(\w+\W+){0,6}(all[- ]?reduc|synchroni|averag)"],
    "moe_ep.capacity_per_rank": [r"capacity", r"(tokens? (are |were )?dropped|token drop|drop\w* tokens)"],
    "moe_ep.router_noise_local": [r"(random|\brng\b|noise|jitter|seed|generator)"],
    "moe_ep.aux_local_fraction": [r"(\baux|auxiliary|load[- ]balanc|balanc\w* loss)", r"fraction"],
    "moe_ep.expert_grads_not_scaled": [_names(r"expert", r"(factor|times|world size|multiplied|scaled|divid|twice|2x|×|doubled)")],
    "moe_ep.experts_allreduced": [_names(r"expert", r"(averag|all[- ]?reduc|synchroni|mix|shared|replica|other ranks)")],
    "amp_timm.clip_before_unscale": [r"unscal", r"clip\w*\W+(\w+\W+){0,6}(scaled|scale\b|before)", r"scaled\W+(\w+\W+){0,4}clip"],
    "amp_timm.backward_unscaled_loss": [r"(grad ?scaler|unscal|loss scal|scaler)", r"(1\.5\d*e-0?5|65536|2\^-?16|1/65536)"],
    "amp_timm.sched_per_micro": [LR],
    "amp_timm.warmup_not_scaled": [r"warm[- ]?up", LR],
    "amp_timm.lr_local_batch": [LR],
    "amp_timm.no_sync_last_micro": [rf"{NOT}\W+(\w+\W+){{0,4}}{SYNC}", r"no_sync", r"accumul\w*\W+(\w+\W+){0,6}(sync|all[- ]?reduc)",
                                    r"(sync|all[- ]?reduc)\w*\W+(\w+\W+){0,6}(micro|accumul)"],
    "val_plateau.left_in_eval": [r"eval\(\)|eval mode|\beval\b|\.train\(\)|training mode",
                                 r"dropout\W+(\w+\W+){0,4}(off|disabled|inactive|not active|inference)"],
    "val_plateau.no_eval_mode": [r"eval|dropout|random|\brng\b|generator|mask|train(ing)? mode"],
    "val_plateau.val_not_allreduced": [LR, r"plateau", r"validation"],
    "val_plateau.val_backward": [r"validation\W+(\w+\W+){0,6}(backward|gradient)", r"(extra|additional|second|more|2) backward",
                                 r"backward passes", r"no_grad", r"gradients?\W+(\w+\W+){0,3}(left|leak|accumulat|stale|not zeroed|carried)",
                                 r"zero_grad", r"accumulat"],
    "val_plateau.val_from_train_rows": [r"validation", r"plateau", LR],
    "val_plateau.plateau_every_step": [LR, r"plateau"],
    "val_plateau.val_rank0_only": [LR, r"plateau", r"validation"],
    "onecycle_ls.total_steps_dataset": [LR, r"onecycle|total[_ ]steps|steps_per_epoch"],
    "onecycle_ls.sched_per_epoch": [LR, r"onecycle"],
    "onecycle_ls.no_set_epoch": [r"set_epoch|shuffl|sampler|\bepoch",
                                 r"(rows|inputs|batch(es)?|data)\W+(\w+\W+){0,4}(differ|other|another)"],
    "onecycle_ls.smoothing_twice": [r"smooth|label|target|soft", r"loss (function|computed|itself|differs)|criterion|another loss",
                                    r"the loss with the same"],
    "onecycle_ls.max_lr_times_world": [LR, r"max_lr"],
}


def right(bug_id: str, cause: str | None) -> bool:
    """Whether ``cause`` (the first likely-cause line) names bug ``bug_id``'s expected cause."""
    if not cause or bug_id not in RUBRIC:
        return False
    low = cause.lower()
    return any(re.search(p, low) for p in RUBRIC[bug_id])
