"""The expected first cause of every heldout6 bug, and the regexes that accept a diagnosis naming it.

Written from what each bug is (the families' code), before any run of the plugin on this set, and
not changed after. ``EXPECTED``: the first cause in words. ``RUBRIC``: regexes matched against the
lower-cased first "likely cause" line; any match is a right diagnosis. A regex names the cause (the
mechanism, the layer or the call that is wrong, or the exact factor with what has that value in this
run), not a symptom every bug shares ("the parameters differ", "the gradients differ between ranks").
"""
from __future__ import annotations

import re

EXPECTED = {
    # vocab_ce: vocab-parallel embedding tied to the output layer + vocab-parallel cross entropy
    "vocab_ce.emb_no_mask": "the vocab-parallel embedding does not zero the rows of token ids outside the rank's vocab "
                            "range (the input mask): each rank adds a wrong row before the all-reduce",
    "vocab_ce.emb_no_allreduce": "the vocab-parallel embedding's output is not all-reduced over the tensor-parallel ranks",
    "vocab_ce.ce_local_max": "the cross entropy's logits max is not all-reduced (MAX) over the vocab shards: each rank "
                             "shifts by its own max",
    "vocab_ce.ce_local_sumexp": "the sum of exps (the softmax denominator) is not all-reduced: each rank normalises over "
                                "its own vocab slice",
    "vocab_ce.ce_onehot_every_rank": "the vocab-parallel cross entropy's backward subtracts the target one-hot on every "
                                     "rank, not only on the rank that owns the target (target mask ignored)",
    "vocab_ce.head_no_copy": "the LM head's input gradient is not all-reduced over the tensor-parallel ranks (no "
                             "copy-to-region before the vocab-parallel output layer): the replicated layers get partial, "
                             "rank-dependent gradients",
    "vocab_ce.shard_grads_averaged": "the vocab shards' gradients (different rows) are averaged over the tensor-parallel "
                                     "ranks as if they were replicas",
    "vocab_ce.shard_fresh_init": "each rank initialises its embedding shard on its own instead of slicing the full "
                                 "initialisation: the shards do not make the reference's starting embedding",
    # pipe_1f1b: two stages by hand, 1F1B, send/recv
    "pipe_1f1b.loss_not_div_micro": "each micro-batch's loss is not divided by the number of micro-batches (4x gradients)",
    "pipe_1f1b.lifo_backward": "stage 0 pairs each received gradient with the wrong micro-batch's activation (newest "
                               "instead of oldest)",
    "pipe_1f1b.step_last_stage_only": "stage 0 never takes an optimizer step (the step only on the last stage)",
    "pipe_1f1b.grad_div_again": "stage 0 divides the received activation gradient by the number of micro-batches again "
                                "(stage 0's gradients 1/4 of the reference's)",
    "pipe_1f1b.zero_grad_per_micro": "the last stage clears its gradients before each micro-batch's backward: only the "
                                     "last micro-batch's gradient is kept",
    "pipe_1f1b.warmup_last_stage_only": "stage 0's lr schedule is never stepped (warm-up only on the last stage): stage "
                                        "0 keeps the first warm-up lr",
    "pipe_1f1b.clip_local_norm": "each stage clips with its own gradient norm, not the norm over the whole model",
    "pipe_1f1b.stage_seed_rank": "stage 1 is built under another seed (SEED + rank): its starting weights are not the "
                                 "reference's",
    # moe_a2a: expert parallel, top-2, all_to_all, data parallel dense layers
    "moe_a2a.gate_not_allreduced": "the router gate's gradient is not all-reduced across the ranks",
    "moe_a2a.experts_not_scaled": "the experts' gradients are not divided by the world size (summed over every rank's "
                                  "loss: 2x)",
    "moe_a2a.dense_sum_not_mean": "the dense gradients are summed over the ranks, not averaged (not divided by the world "
                                  "size: 2x)",
    "moe_a2a.no_renorm": "the top-2 gate weights are not renormalised to sum to 1",
    "moe_a2a.capacity_global": "the expert capacity is computed from the global token count, not the routing group's "
                               "(fewer tokens dropped)",
    "moe_a2a.second_no_offset": "second-choice tokens are not offset by the first choices' counts: they take slots of "
                                "first-choice tokens",
    "moe_a2a.a2a_wrong_view": "the tokens received by the all-to-all are read expert-major instead of source-rank-major: "
                              "tokens go through the wrong local expert",
    # amp_skip: DDP + float16 autocast + GradScaler with skipped steps + OneCycleLR
    "amp_skip.sched_on_skipped": "the OneCycleLR schedule is stepped on the iterations the GradScaler skipped: the lr "
                                 "runs ahead of the reference's",
    "amp_skip.scaler_per_step": "a new GradScaler every iteration: the scale never backs off, every step overflows and "
                                "is skipped (no optimizer step)",
    "amp_skip.clip_before_unscale": "the gradients are clipped while still scaled (clip before scaler.unscale_)",
    "amp_skip.onecycle_total_dataset": "OneCycleLR's total_steps is twice the rank's loader length: the schedule runs at "
                                       "half the reference's rate",
    "amp_skip.sched_before_step": "scheduler.step() is called before the optimizer step: the lr runs one step ahead",
    # fabric_timm: Fabric DDP, timm ResMLP, timm CosineLRScheduler with warm-up, accumulation, clipping, validation
    "fabric_timm.step_update_micro": "the timm scheduler's step_update gets the micro-batch count: the warm-up runs 2x "
                                     "fast (the lr at update s is the reference's at 2s)",
    "fabric_timm.sched_step_epoch": "scheduler.step() (per epoch) used instead of step_update(): the lr never leaves the "
                                    "warm-up's start value",
    "fabric_timm.accum_sync_first": "the gradient sync is skipped on the last micro-batch of each update "
                                    "(no_backward_sync off by one): the ranks step with unsynchronised gradients",
    "fabric_timm.loss_not_div_accum": "the micro-batch loss is not divided by the accumulation steps (2x gradients)",
    "fabric_timm.clip_per_micro": "the gradients are clipped after every micro-batch's backward, not once before the step",
    "fabric_timm.lr_local_batch": "the lr is scaled with the per-rank batch, not the global one: 1/W of the reference's",
    "fabric_timm.val_mid_accum": "the validation pass runs mid-accumulation and its zero_grad clears the accumulated "
                                 "gradient",
    # accel_lora: accelerate + peft LoRA on a tiny Llama, prepared warm-up schedule, accumulation
    "accel_lora.sched_len_after_prepare": "the schedule's lengths come from the per-process loader (after prepare) and "
                                          "the prepared scheduler steps W times per update: the lr runs 2x ahead",
    "accel_lora.sched_not_prepared": "the scheduler is not prepared and steps once per update: the lr runs at half the "
                                     "reference's rate",
    "accel_lora.loader_not_prepared": "the dataloader is not prepared: every process reads the same batches, not its "
                                      "block of the global batch",
    "accel_lora.backward_not_accelerator": "loss.backward() instead of accelerator.backward(loss): the loss is not "
                                           "divided by the accumulation steps (2x gradients)",
    "accel_lora.optimizer_before_peft": "the optimizer holds the base model's frozen parameters, not the LoRA adapters: "
                                        "the adapters are never updated",
    "accel_lora.labels_shifted_twice": "the labels are shifted by hand and again by the model: the ranks train on other "
                                       "targets (a different loss)",
}

_SCHED = r"(schedul|warm[- ]?up|\blr\b|learning rate|one[- ]?cycle)"
_ACCUM = [r"accumulat.{0,80}(divid|normali[sz]|scal|factor)", r"(divid|normali[sz]|scal).{0,80}accumulat",
          r"micro[- ]?batch.{0,60}(divid|normali[sz]|scal|mean)", r"\b(2|two) (backward|micro)",
          r"backward (passes|calls).{0,80}(divid|normali[sz]|scal|mean)"]
_START = r"(start|initiali[sz]|\binit).{0,80}(differ|not the (same|reference))"

RUBRIC = {
    "vocab_ce.emb_no_mask": [r"(embedding|lookup|\bids\b|tokens?).{0,80}mask", r"mask.{0,80}(embedding|\bids\b|tokens?|vocab)",
                             r"outside (the |its |this )?(rank'?s? )?(vocab|range|shard)", r"out[- ]of[- ](range|vocab|shard)"],
    "vocab_ce.emb_no_allreduce": [r"embedding.{0,80}(not|never|missing|without).{0,30}(all[- ]?reduc|reduc|summed)",
                                  r"(missing|no|without) all[- ]?reduce.{0,80}embedding",
                                  r"(all[- ]?reduce|reduce[_ ]from).{0,60}(embedding|lookup)"],
    "vocab_ce.ce_local_max": [r"\bmax\b.{0,80}(not|never|missing|without|local|own).{0,40}(all[- ]?reduc|reduc|shared|rank)",
                              r"(local|own|per[- ]rank) max", r"logits?[_ ]max"],
    "vocab_ce.ce_local_sumexp": [r"sum.{0,10}(of )?exp", r"(softmax|normali[sz]).{0,80}(own|local|its|one) (vocab|slice|shard|partition)",
                                 r"log[- ]?sum[- ]?exp", r"(denominator|partition function).{0,60}(not|local|all[- ]?reduc)"],
    "vocab_ce.ce_onehot_every_rank": [r"one[- ]?hot", r"target.{0,60}(mask|owning|owns|own shard|not on this rank)",
                                      r"(subtract|minus).{0,60}(every|all|each) ranks?"],
    "vocab_ce.head_no_copy": [r"copy[_ -]?to", r"(missing|no|without|not) .{0,40}all[- ]?reduce.{0,40}(in|of|on|during) (the )?backward",
                              r"backward.{0,40}(not|never|missing|without).{0,20}all[- ]?reduc",
                              r"(input|activation) gradients?.{0,60}(not|never) (all[- ]?)?reduc"],
    "vocab_ce.shard_grads_averaged": [r"(shard|slice|partition)s?'?.{0,40}(averag|summed|mixed|all[- ]?reduced (with|over|across))",
                                      r"averag.{0,80}(shard|slice|different rows|tensor[- ]parallel)",
                                      r"(treated|as if|like|mistaken for) .{0,20}replica", r"data[- ]parallel.{0,60}tensor[- ]parallel"],
    "vocab_ce.shard_fresh_init": [_START, r"(shard|slice)s?.{0,60}(init|start)", r"(same|identical) (shards?|slices?|rows)",
                                  r"not (a )?slices? of", r"different (initial|starting) (weights|parameters|values)"],
    "pipe_1f1b.loss_not_div_micro": [r"micro[- ]?batch.{0,80}(divid|normali[sz]|scal|mean|averag)",
                                     r"(divid|normali[sz]|scal).{0,80}micro[- ]?batch", r"num_?micro",
                                     r"\b(4|four) (backward|micro)", r"backward (passes|calls).{0,80}(divid|normali[sz]|scal|mean)"],
    "pipe_1f1b.lifo_backward": [r"(wrong|mismatch|other|another|different) micro[- ]?batch", r"\blifo\b|\bfifo\b|stack|queue|\bpop",
                                r"(activation|output)s?.{0,60}(paired|matched|mismatch|wrong|order)",
                                r"micro[- ]?batch(es)?.{0,40}(order|swapped|reversed|paired)"],
    "pipe_1f1b.step_last_stage_only": [r"(stage ?0|rank 0|first stage|some ranks|one rank).{0,80}(no |never|without|skip)\w*.{0,20}"
                                       r"(optimizer[. ]step|updat|(takes?|took|taken) (an? )?(optimizer )?step)",
                                       r"(optimizer[. ]step|updates?)\w*.{0,60}(only|taken) on (some|one|rank 1|the last|stage 1)",
                                       r"(never|not) (takes?|took|taken) (an? )?(optimizer )?step",
                                       r"(no|never|without|missing|skipped) (optimizer )?(steps?|updates?) on"],
    "pipe_1f1b.grad_div_again": [r"(received|incoming|activation|boundary|sent|p2p|recv).{0,60}grad.{0,80}(divid|scal|factor|normali[sz])",
                                 r"(stage ?0|first stage|rank 0).{0,80}(divid|scal|factor|0\.25|1/4|quarter)",
                                 r"(divid|normali[sz]).{0,40}(twice|again|second time|double)"],
    "pipe_1f1b.zero_grad_per_micro": [r"zero_?grad", r"(only|just) (the )?last micro[- ]?batch",
                                      r"(gradients?|grads?).{0,40}(cleared|zeroed|reset|discarded|lost|overwritten)",
                                      r"accumulat.{0,60}(lost|reset|cleared|broken|missing)"],
    "pipe_1f1b.warmup_last_stage_only": [_SCHED + r".{0,80}(stage ?0|rank 0|first stage|some ranks|one rank|not stepped|never stepped)",
                                         r"(stage ?0|rank 0|first stage).{0,80}" + _SCHED],
    "pipe_1f1b.clip_local_norm": [r"clip", r"(grad(ient)?[- ]?)?norm.{0,80}(local|own|stage|not all[- ]?reduc|per[- ](rank|stage))"],
    "pipe_1f1b.stage_seed_rank": [r"seed", _START, r"different (initial|starting) (weights|parameters|values)"],
    "moe_a2a.gate_not_allreduced": [r"(gate|router|routing).{0,80}(not|never|missing|without|skipped|left out).{0,40}(all[- ]?reduc|sync|averag)",
                                    r"(all[- ]?reduc|sync|averag).{0,80}(gate|router)", r"(gate|router).{0,60}(unsynchroni|unsync)"],
    "moe_a2a.experts_not_scaled": [r"expert.{0,100}(divid|scal|factor|2x|twice|times|summed|averag|normali[sz])",
                                   r"(factor|times|x) ?(of )?2(\.0+)?\b.{0,80}expert", r"(divid|scal|normali[sz]).{0,60}expert"],
    "moe_a2a.dense_sum_not_mean": [r"(sum|summed|added).{0,60}(not|instead of|rather than|without).{0,30}(averag|mean|divid)",
                                   r"(not|never|without|missing) .{0,30}(divid|averag).{0,60}(world|ranks?|size)",
                                   r"world[_ ]size.{0,60}(divid|factor|times|scal)", r"reduce[_ ]?op\.?sum"],
    "moe_a2a.no_renorm": [r"renormali[sz]", r"(top[- ]?2|top[- ]?k|routing|gate|gating) (weights|probabilit).{0,80}(normali[sz]|sum to (1|one))",
                          r"(not|never|without) normali[sz].{0,40}(gate|routing|top)", r"norm_topk"],
    "moe_a2a.capacity_global": [r"capacit", r"(dropped|drop) tokens?|token drop", r"overflow.{0,40}expert"],
    "moe_a2a.second_no_offset": [r"second[- ](choice|expert|slot)", r"(slot|position|location)s?.{0,80}(collid|overlap|offset|clash|shared|overwrit)",
                                 r"locations?2", r"offset.{0,60}(first|top[- ]?1)"],
    "moe_a2a.a2a_wrong_view": [r"all[_ -]?to[_ -]?all", r"(wrong|another|different|other) (local )?expert",
                               r"(view|layout|reshape|permut).{0,80}(expert|rank|token|receiv)", r"(expert|rank)[- ]major"],
    "amp_skip.sched_on_skipped": [r"skip", _SCHED + r".{0,80}(ahead|shifted|extra|early|advanced|runs? fast)",
                                  r"(overflow|\binf\b|scaler).{0,80}" + _SCHED, _SCHED + r".{0,80}(overflow|\binf\b|scaler)"],
    "amp_skip.scaler_per_step": [r"gradscaler.{0,80}(new|every|each|inside|re-?creat|construct|reset)",
                                 r"scale.{0,60}(reset|never (backs? off|decreas|updat)|re-?initiali[sz])",
                                 r"(no|never|without|zero) (optimizer )?(steps?|updates?) (taken|were taken|ran)",
                                 r"every (step|iteration).{0,40}(skipped|overflow)", r"(skipped|overflow).{0,40}every"],
    "amp_skip.clip_before_unscale": [r"unscale", r"clip.{0,80}(scaled|before|order)", r"(scaled|order).{0,80}clip",
                                     r"(65536|2\*\*16|loss scale).{0,80}clip"],
    "amp_skip.onecycle_total_dataset": [r"total[_ ]steps", _SCHED + r".{0,100}(slower|half|longer|stretched|0\.5|twice|2x|per rank)",
                                        r"steps?[_ ]per[_ ]epoch|len\((the )?(loader|dataset|dataloader)"],
    "amp_skip.sched_before_step": [_SCHED + r".{0,100}(ahead|one step|off[- ]by[- ]one|shifted|early|before|order|skip)"],
    "fabric_timm.step_update_micro": [_SCHED + r".{0,100}(micro|twice|2x|faster|ahead|2 ?[·x*] ?s\b|accumulat)",
                                      r"micro[- ]?batch(es)? (count|index|number)"],
    "fabric_timm.sched_step_epoch": [r"t_in_epochs", _SCHED + r".{0,80}(never|constant|stuck|frozen|unchanged|stays|not (stepped|advanc|chang))",
                                     r"epoch.{0,60}(schedul|step\(\))"],
    "fabric_timm.accum_sync_first": [r"no_backward_sync|no_sync|backward[_ ]sync",
                                     r"(sync|all[- ]?reduc).{0,80}(last|final|off[- ]by[- ]one|wrong micro|skipped|missing)",
                                     r"(not|never|without|missing|skipped).{0,40}(sync|all[- ]?reduc)", r"accumulat.{0,80}(sync|all[- ]?reduc)"],
    "fabric_timm.loss_not_div_accum": _ACCUM,
    "fabric_timm.clip_per_micro": [r"clip"],
    "fabric_timm.lr_local_batch": [r"(\blr\b|learning rate).{0,100}(global batch|per[- ]rank batch|local batch|batch size|world|half|0\.5|1/2|smaller|lower)",
                                   r"(global|per[- ]rank|local) batch.{0,60}(\blr\b|learning rate)", r"scaling rule"],
    "fabric_timm.val_mid_accum": [r"validat", r"\beval", r"zero_?grad",
                                  r"(gradient|grads?).{0,60}(cleared|zeroed|reset|discarded|lost|wiped)",
                                  r"(only|just) (the )?(last|second) micro[- ]?batch"],
    "accel_lora.sched_len_after_prepare": [_SCHED + r".{0,100}(ahead|faster|twice as fast|2x fast|2 ?[·x*] ?s\b|shorter|per[- ]process)",
                                           r"len\((the )?(train_)?(loader|dataloader)\).{0,40}after"],
    "accel_lora.sched_not_prepared": [_SCHED + r".{0,100}(slower|half|behind|0\.5|longer|stretched)",
                                      r"acceleratedscheduler|scheduler.{0,40}(not prepared|without prepare|kept out)"],
    "accel_lora.loader_not_prepared": [r"(same|identical|duplicate).{0,40}(batch|rows|data|inputs?|samples)",
                                       r"(shard|sampler|split|prepare).{0,80}(data|loader|rows|batch)",
                                       r"(data|loader|batch|rows|inputs?).{0,80}(not (sharded|split|distributed|prepared)|every rank|each rank reads)"],
    "accel_lora.backward_not_accelerator": [r"accelerator\.backward"] + _ACCUM,
    "accel_lora.optimizer_before_peft": [r"(optimizer|param(eter)? groups?).{0,80}(frozen|base|adapter|lora|requires_grad|not (hold|contain|include)|missing)",
                                         r"(lora|adapter)s?.{0,80}(not|never) (updat|train|stepp|in the optimizer)",
                                         r"frozen|requires_grad", r"(never|not) (updated|moved|changed|trained)"],
    "accel_lora.labels_shifted_twice": [r"shift", r"label", r"target", r"(different|wrong|other) (loss|objective)",
                                        r"(two|2) (tokens? )?ahead"],
}


def right(bug_id: str, cause: str | None) -> bool:
    """Whether ``cause`` (the first likely-cause line, or its cause part) names the bug's cause."""
    if not cause:
        return False
    low = cause.lower()
    return any(re.search(p, low) for p in RUBRIC[bug_id])
