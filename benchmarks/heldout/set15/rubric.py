"""The rubric of heldout15: per bug, the first cause a right diagnosis names (``EXPECTED``) and the regexes
that accept it (``RUBRIC``), applied lower-cased to the diagnosis's first "likely cause" line (the location
it names removed by the caller). Written from what each bug is, before any run of the plugin on this set,
and not changed after. A diagnosis is right when any of the bug's regexes matches.
"""
from __future__ import annotations

import re

EXPECTED = {
    # mean_teacher
    "mean_teacher.ce_mean_over_local_labeled": "the classification loss is averaged over the rank's own labelled rows (ignore_index mean) instead of summed / batch size: the normalisation is local",
    "mean_teacher.teacher_update_rank0_only": "the EMA teacher is updated on rank 0 only: the other ranks' teachers stay at their initial weights",
    "mean_teacher.ema_before_step": "the EMA teacher update runs before optimizer.step() (from the previous student weights)",
    "mean_teacher.ema_no_alpha_warmup": "the EMA decay lacks its warm-up (min(1 - 1/(step+1), decay)): a fixed decay from the first step",
    "mean_teacher.teacher_noise_same_seed": "every rank draws the same teacher input noise (rank 0's rows): the noise is not the global batch's",
    "mean_teacher.consistency_not_ramped": "the consistency weight is not ramped up (full weight from the first step)",
    "mean_teacher.teacher_copied_before_ddp": "the teacher is copied before DDP broadcasts rank 0's weights while the seed is per rank: the teachers start from different weights on each rank",
    # moe_bias_ep
    "moe_bias_ep.load_counted_locally": "the expert load (tokens per expert) for the bias update is counted locally, not all-reduced: the routing biases differ per rank",
    "moe_bias_ep.bias_in_gate_weights": "the load-balancing bias enters the gate (combine) weights instead of only the expert choice",
    "moe_bias_ep.expert_grads_not_divided": "the expert gradients are not divided by the world size (not averaged like the replicated parameters)",
    "moe_bias_ep.router_grads_not_allreduced": "the router (gate) gradients are not all-reduced: the replicated router diverges across ranks",
    "moe_bias_ep.dispatch_without_autograd": "the token dispatch all-to-all has no autograd: no gradient flows back through the experts to the tokens",
    "moe_bias_ep.expert_rank_round_robin": "the expert-to-rank mapping of the dispatch (e % W) does not match where the experts live (blocks): tokens go to the wrong experts",
    "moe_bias_ep.bias_update_sign_flipped": "the bias update has the wrong sign (overloaded experts get a larger bias)",
    # amp_plateau
    "amp_plateau.val_loss_local": "ReduceLROnPlateau is stepped on the rank's local validation loss, not the all-reduced one: the learning rates differ per rank",
    "amp_plateau.val_rank0_only": "validation and the plateau scheduler step run on rank 0 only: the other ranks' learning rates are never reduced",
    "amp_plateau.train_mode_not_restored": "model.train() is not restored after validation: dropout stays off (eval mode) during training",
    "amp_plateau.clip_after_step": "gradient clipping happens after the optimizer step: the step uses unclipped gradients",
    "amp_plateau.clip_before_unscale": "gradients are clipped before scaler.unscale_: the clip sees the scaled gradients",
    "amp_plateau.plateau_on_train_loss": "the plateau scheduler is stepped with the (local) training loss instead of the validation loss",
    "amp_plateau.dropout_mask_per_rank": "the dropout masks are drawn per rank (rank-seeded) instead of from the global batch's draw",
    # accel_gpt2
    "accel_gpt2.clip_every_micro": "the gradient clipping runs on every micro-batch (not only when sync_gradients): the accumulated partial gradient is clipped",
    "accel_gpt2.no_accumulate_ctx": "the accumulate context is missing: the optimizer steps after every micro-batch (no gradient accumulation)",
    "accel_gpt2.warmup_in_micro_steps": "the warm-up/decay schedule lengths are counted in micro-batches, not optimizer updates (not divided by the accumulation steps)",
    "accel_gpt2.zero_grad_before_backward": "optimizer.zero_grad() inside the accumulation before backward wipes the accumulated gradient of the earlier micro-batch",
    "accel_gpt2.split_batches_true": "split_batches=True with a per-process batch size: the batch is split over the processes, the global batch is W times smaller",
    "accel_gpt2.no_decay_by_name": "the LayerNorm weights (GPT-2's ln_*) get weight decay: the no-decay group's name match misses them",
    "accel_gpt2.loader_not_prepared": "the dataloader is not prepared/sharded: every process reads the same batches",
    # fabric_convnext
    "fabric_convnext.onecycle_len_before_setup": "OneCycleLR's total steps come from the loader length before setup_dataloaders (the whole dataset): the schedule is W times too long",
    "fabric_convnext.lr_scaled_local_batch": "the learning rate is scaled with the local (per-rank) batch size instead of the global batch",
    "fabric_convnext.clip_before_backward": "gradient clipping is called before backward: the step uses unclipped gradients",
    "fabric_convnext.clip_val_not_norm": "the gradients are clipped by value (clip_val) instead of by their total norm",
    "fabric_convnext.onecycle_per_epoch": "the OneCycleLR scheduler is stepped once per epoch instead of every batch",
    "fabric_convnext.no_distributed_sampler": "no DistributedSampler: every rank reads the whole dataset in the same order (duplicated data)",
    "fabric_convnext.seed_everything_per_rank": "the seed is set per rank, so the DistributedSampler's shuffle seed differs across ranks: the ranks' shards overlap",
    # peft_dora
    "peft_dora.clip_each_micro": "the gradient is clipped after every micro-batch (the first micro-batch's local, unsynchronised gradient), not once per update",
    "peft_dora.dora_magnitude_not_optimized": "the DoRA magnitude vectors (and the head) are left out of the optimizer: only lora_A/lora_B are stepped",
    "peft_dora.no_sync_on_last_micro": "no_sync is on the last micro-batch instead of the first: the last micro-batch's gradients are never all-reduced (replicas diverge)",
    "peft_dora.lr_scaled_world": "the learning rate is multiplied by the world size",
    "peft_dora.adapter_left_merged": "the adapter stays merged after validation (merge_adapter without unmerge_adapter): the LoRA/DoRA parameters stop training",
    "peft_dora.attention_mask_dropped": "the attention mask is not passed: tokens attend to the padding",
    "peft_dora.pad_lengths_per_rank": "the padding lengths are drawn per rank (rank-seeded) instead of from the global batch's draw",
}

_AR = r"(all[_ -]?reduc\w*|allreduc\w*)"
_LR = r"(learning[ -]rate|\blr\b)"
_SAME = r"(same|identical|duplicat\w*|repeat\w*|every rank|each rank|per[- ]rank|rank 0|rank[- ]seed\w*|seed\w*|rng|generator)"
_CLIP = r"(clip\w*|grad(ient)?[- ]norm|max[_ ]norm)"
_SCHED = r"(schedul\w*|warm[- ]?up|one[- ]?cycle|onecycle|decay|annealing|total[_ ]steps|lr[_ ]lambda)"
_PLATEAU = r"(plateau|reducelronplateau|schedul\w*)"
_VAL = r"(validation|val[_ ]loss|\bval\b|eval\w*|metric)"
_EMA = r"(ema|teacher|moving average|momentum (encoder|model|teacher))"
_DROP = r"(dropout|drop[- ]?mask|mask)"
_NOSYNC = r"(no[_ ]sync|accumulat\w*|micro[- ]?batch)"

RUBRIC = {
    # mean_teacher
    "mean_teacher.ce_mean_over_local_labeled": [
        r"(labell?ed|ignore[_ ]index|unlabell?ed|no_label|-1)", r"(local|per[- ]rank) (count|normali[sz]\w*|mean|denominator|divisor)",
        r"(normali[sz]\w*|denominator|divisor|divid\w*|mean|averag\w*).{0,60}(local|per[- ]rank|rank's own)",
        r"(cross[- ]?entropy|classification loss|class loss|\bce\b).{0,60}(mean|averag\w*|normali[sz]\w*|reduction|divid\w*)"],
    "mean_teacher.teacher_update_rank0_only": [
        rf"{_EMA}.{{0,60}}updat\w*.{{0,60}}(rank 0|only one rank|one rank|other ranks|per[- ]rank|skipp\w*|missing|never)",
        rf"(rank 0|only on rank|other ranks).{{0,60}}{_EMA}.{{0,40}}(updat\w*|stale|initial|never)",
        rf"{_EMA} (weights|parameters|copies).{{0,40}}(stale|not updated|never updated)"],
    "mean_teacher.ema_before_step": [
        rf"{_EMA}.{{0,80}}(before|after) (the )?(optimi[sz]er|step|update)", rf"{_EMA}.{{0,60}}(order\w*|previous (student )?weights|stale|lag\w*|one step (behind|late))",
        rf"(before|order\w*).{{0,30}}(optimi[sz]er|step).{{0,40}}{_EMA}", r"(update|step).{0,40}(order|before the optimi[sz]er)"],
    "mean_teacher.ema_no_alpha_warmup": [
        rf"{_EMA}.{{0,80}}(decay|alpha|momentum|warm[- ]?up|ramp|rate|coefficient|schedule)",
        r"(decay|alpha).{0,60}(warm[- ]?up|ramp|fixed|constant|1 ?- ?1 ?/|global[_ ]step|schedule)"],
    "mean_teacher.teacher_noise_same_seed": [
        rf"{_SAME}.{{0,60}}(noise|random|augment\w*|draw\w*|perturb\w*)", rf"(noise|random\w*|augment\w*|draw\w*|perturb\w*).{{0,60}}{_SAME}",
        r"(random|rng) (state|stream)", r"(teacher|ema).{0,40}(input|noise)"],
    "mean_teacher.consistency_not_ramped": [
        r"consistency", r"ramp[- ]?up|rampup|ramp\b", r"(unsupervised|unlabell?ed) (loss )?weight"],
    "mean_teacher.teacher_copied_before_ddp": [
        rf"{_EMA}.{{0,80}}(copied|copy|before (ddp|the broadcast|broadcast)|broadcast|seed\w*|(init\w*|start\w*).{{0,30}}differ\w*)",
        r"(init\w*|start\w*).{0,60}(differ\w*|per[- ]rank|not (broadcast|synchroni[sz]ed|the same))",
        r"(seed\w*).{0,40}(rank|differ\w*)", r"deep ?copy.{0,40}(before|ddp)"],
    # moe_bias_ep
    "moe_bias_ep.load_counted_locally": [
        rf"(load|count\w*|tokens[- ]per[- ]expert|histogram|bincount|usage).{{0,60}}(local|per[- ]rank|not ({_AR}|summed|global|synchroni[sz]ed)|differ\w*)",
        rf"(local|per[- ]rank) (load|count|tokens[- ]per[- ]expert|expert (load|count|usage))",
        r"(routing|expert|balanc\w*) bias(es)?.{0,40}(differ|diverge|rank|local)", r"(load[- ]balanc\w*).{0,40}(local|rank)"],
    "moe_bias_ep.bias_in_gate_weights": [
        r"bias.{0,60}(gate|gating|combine|routing|expert|mixing)\w*.{0,20}(weight|prob\w*|score|coefficient)",
        r"(gate|gating|combine|routing) (weight|prob\w*|score|coefficient)s?.{0,60}bias",
        r"(biased|unbiased) (score|affinit\w*|prob\w*)"],
    "moe_bias_ep.expert_grads_not_divided": [
        r"expert.{0,60}(grad\w*).{0,60}(scal\w*|divid\w*|averag\w*|world|factor|normali[sz]\w*|too large|double|2x|times)",
        r"(scal\w*|divid\w*|averag\w*|normali[sz]\w*).{0,60}expert", r"expert.{0,40}(world[_ ]size|averag\w*)",
        r"(w1|w2).{0,40}(grad|scal|divid|averag)"],
    "moe_bias_ep.router_grads_not_allreduced": [
        rf"(router|gate|gating).{{0,80}}({_AR}|sync\w*|averag\w*|reduc\w*|diverg\w*|differ\w*|replica\w*)",
        rf"({_AR}|sync\w*).{{0,60}}(router|gate|gating)", r"replicas? (diverge|differ|drift|disagree|out of sync)"],
    "moe_bias_ep.dispatch_without_autograd": [
        r"(all[_ -]?to[_ -]?all|a2a|dispatch\w*).{0,80}(autograd|grad\w*|backward|detach\w*)",
        r"(autograd|grad\w*|backward|detach\w*).{0,80}(all[_ -]?to[_ -]?all|a2a|dispatch\w*)",
        r"(no|without|missing|lost) gradient.{0,60}(token|input|expert|router|inp)"],
    "moe_bias_ep.expert_rank_round_robin": [
        r"expert.{0,60}(rank|placement|mapping|assign\w*|index|order\w*|permut\w*|layout|wrong)",
        r"(rank|placement|mapping|assign\w*|layout|order\w*|permut\w*).{0,60}expert",
        r"(round[- ]?robin|modulo|e ?% ?w|block)", r"(all[_ -]?to[_ -]?all|a2a|dispatch\w*).{0,60}(order|wrong|mismatch|split|layout|destination)"],
    "moe_bias_ep.bias_update_sign_flipped": [
        r"bias.{0,60}(sign|direction|invert\w*|flip\w*|revers\w*|wrong way|opposite)",
        r"(sign|direction|invert\w*|flip\w*|revers\w*|opposite).{0,60}bias", r"(overloaded|busy).{0,40}(favou?r|bias|more)"],
    # amp_plateau
    "amp_plateau.val_loss_local": [
        rf"{_VAL}.{{0,80}}(local|per[- ]rank|not ({_AR}|averaged|reduced|synchroni[sz]ed|global))",
        rf"(local|per[- ]rank|rank's own) {_VAL}", rf"{_PLATEAU}.{{0,80}}(local|per[- ]rank|rank's own) (val\w*|metric)"],
    "amp_plateau.val_rank0_only": [
        rf"({_VAL}|{_PLATEAU}).{{0,80}}(rank 0|only one rank|main process|other ranks)",
        rf"(rank 0|only on rank|main process|other ranks).{{0,80}}({_VAL}|{_PLATEAU}|{_LR})"],
    "amp_plateau.train_mode_not_restored": [
        r"(train|training)[ (-]?(mode)?.{0,60}(not restored|not (re)?set|never|missing|left|stays?|remain\w*)",
        r"eval(\(\))? mode.{0,60}(train|left|stays?|remain\w*|during)", r"model\.train\(\)", r"(dropout).{0,60}(off|disabled|inactive|not applied|eval)",
        r"(left|stays?|remains?|stuck) in eval"],
    "amp_plateau.clip_after_step": [
        rf"{_CLIP}.{{0,80}}(after|order\w*|too late|post)", rf"(after|order\w*).{{0,60}}(step).{{0,60}}{_CLIP}",
        rf"(unclipped|not clipped|without clipping)", rf"{_CLIP}.{{0,40}}(no effect|ineffective|missing|skipped)"],
    "amp_plateau.clip_before_unscale": [
        rf"{_CLIP}.{{0,80}}(scaled|unscal\w*|before|loss scale|grad ?scaler|scaler)", rf"(unscal\w*|scaler|loss scale).{{0,80}}{_CLIP}"],
    "amp_plateau.plateau_on_train_loss": [
        rf"{_PLATEAU}.{{0,80}}(train\w* loss|batch loss|wrong (metric|loss|value))",
        rf"(train\w* loss|batch loss).{{0,60}}({_PLATEAU}|instead of (the )?{_VAL})"],
    "amp_plateau.dropout_mask_per_rank": [
        rf"{_DROP}.{{0,60}}{_SAME}", rf"{_SAME}.{{0,60}}{_DROP}", r"dropout.{0,60}(mask|draw\w*|random|rng|seed\w*)",
        r"(random|rng) (state|stream)"],
    # accel_gpt2
    "accel_gpt2.clip_every_micro": [
        rf"{_CLIP}.{{0,80}}(micro[- ]?batch|every (step|batch|iteration|backward)|sync[_ ]gradients|accumulat\w*|partial|before (the )?(sync|all[_ -]?reduce))",
        rf"(micro[- ]?batch|accumulat\w*|partial).{{0,60}}{_CLIP}"],
    "accel_gpt2.no_accumulate_ctx": [
        r"accumulat\w*.{0,60}(missing|skipped|not used|disabled|context|ctx|no effect|ignored)", r"(no|without|missing|not using|forg\w*) .{0,20}accumulat",
        r"(optimi[sz]er|step)\w*.{0,60}(every|each) (micro[- ]?batch|batch|iteration|backward)",
        r"(too many|extra|more|twice as many|double) (optimi[sz]er )?(steps|updates)"],
    "accel_gpt2.warmup_in_micro_steps": [
        rf"{_SCHED}.{{0,80}}(micro[- ]?(batch|step)\w*|accumulat\w*|length|too long|num_training_steps|total|steps? count)",
        rf"(micro[- ]?(batch|step)\w*|accumulat\w*).{{0,60}}{_SCHED}", rf"{_LR}.{{0,60}}(schedul\w*|warm[- ]?up|too (low|small|high|large)|differ\w*)"],
    "accel_gpt2.zero_grad_before_backward": [
        r"zero[_ ]?grad", r"(grad\w*).{0,60}(wiped|cleared|reset|zeroed|discarded|lost)",
        r"(accumulat\w*).{0,60}(wiped|cleared|reset|zeroed|discarded|lost|overwrit\w*)"],
    "accel_gpt2.split_batches_true": [
        r"split[_ ]batch\w*", r"(global )?batch( size)?.{0,40}(split|smaller|halv\w*|half|shrink\w*)",
        r"(each|every) (process|rank).{0,40}(half|part|fraction|fewer rows)", r"(data|rows|samples|batch).{0,40}(differ|mismatch|not the same|wrong)"],
    "accel_gpt2.no_decay_by_name": [
        r"weight[_ ]decay", r"no[_ ]decay", r"(layer[_ ]?norm|ln_|\bln\b|norm weights?).{0,60}(decay|group)",
        r"param(eter)?[ _-]?group"],
    "accel_gpt2.loader_not_prepared": [
        r"(data ?loader|loader|sampler|shard\w*|data).{0,60}(not (prepared|sharded|split|distributed)|prepare|same|duplicat\w*|identical|every (process|rank))",
        rf"{_SAME}.{{0,40}}(batch|batches|data|rows|samples)", r"(overlap\w*|duplicat\w*).{0,40}(rows|samples|data|batch)",
        r"(input|data|batch|rows?).{0,40}(differ|mismatch|not the same|wrong)"],
    # fabric_convnext
    "fabric_convnext.onecycle_len_before_setup": [
        rf"{_SCHED}.{{0,80}}(total|length|len\(|steps|too long|dataset|setup|loader|world)",
        rf"(total[_ ]steps|steps[_ ]per[_ ]epoch|len\(|length).{{0,60}}({_SCHED}|loader|setup|dataset)",
        rf"{_LR}.{{0,60}}(schedul\w*|warm[- ]?up|too (low|small|high|large)|differ\w*)"],
    "fabric_convnext.lr_scaled_local_batch": [
        rf"{_LR}.{{0,80}}(scal\w*|batch|world|global|local|factor|too (low|small|high|large)|half|halved)",
        rf"(scal\w*|linear scaling).{{0,60}}{_LR}", r"(local|per[- ]rank) batch[- ]size"],
    "fabric_convnext.clip_before_backward": [
        rf"{_CLIP}.{{0,80}}(before|order\w*|no effect|ineffective|missing|skipped|too early|nothing)",
        r"(unclipped|not clipped|without clipping)", rf"(before|order\w*).{{0,40}}backward.{{0,40}}{_CLIP}"],
    "fabric_convnext.clip_val_not_norm": [
        rf"{_CLIP}.{{0,80}}(value|element|per[- ]element|clip[_ ]val|norm)", r"clip[_ ]val(ue)?", r"(value|element)[- ]?wise"],
    "fabric_convnext.onecycle_per_epoch": [
        rf"{_SCHED}.{{0,80}}(epoch|per[- ]epoch|once|every batch|not stepped|step\w* (too )?(rarely|seldom|less))",
        rf"(epoch).{{0,60}}{_SCHED}", rf"{_LR}.{{0,60}}(schedul\w*|warm[- ]?up|stuck|constant|too (low|small|high|large)|differ\w*)"],
    "fabric_convnext.no_distributed_sampler": [
        r"distributed ?sampler", r"(data ?loader|loader|data).{0,40}not (sharded|split|distributed)",
        r"(same|identical|duplicat\w*) (batch|batches|data|rows|samples)", r"(every|each) rank .{0,40}(whole|entire|full|same) (dataset|data)",
        r"(overlap\w*|duplicat\w*).{0,40}(rows|samples|data|batch)"],
    "fabric_convnext.seed_everything_per_rank": [
        r"seed\w*.{0,60}(rank|sampler|shuffl\w*|permutation|differ\w*)", r"(sampler|shuffl\w*|permutation).{0,60}(seed\w*|overlap\w*|differ\w*|rank)",
        r"(overlap\w*|duplicat\w*).{0,40}(rows|samples|data|batch|shard)", r"(input|data|batch|rows?).{0,40}(differ|mismatch|not the same|wrong)"],
    # peft_dora
    "peft_dora.clip_each_micro": [
        rf"{_CLIP}.{{0,80}}(micro[- ]?batch|every (step|batch|iteration|backward)|accumulat\w*|partial|local|unsynchroni[sz]ed|before (the )?(sync|all[_ -]?reduce))",
        rf"(micro[- ]?batch|accumulat\w*|partial).{{0,60}}{_CLIP}"],
    "peft_dora.dora_magnitude_not_optimized": [
        r"magnitude", r"dora.{0,40}(magnitude|optimi[sz]er)", r"(optimi[sz]er).{0,60}(missing|omit\w*|left out|exclud\w*|not (include|contain|cover)\w*|lacks?)",
        r"(param\w*|head|score|weights?).{0,60}(not (in|part of) the optimi[sz]er|never (stepped|updated)|not stepped)"],
    "peft_dora.no_sync_on_last_micro": [
        r"no[_ ]sync.{0,80}(last|final|wrong|first)", rf"(last|final) micro[- ]?batch.{{0,60}}({_AR}|sync\w*|reduc\w*)",
        rf"({_AR}|sync\w*).{{0,60}}(last|final) micro", r"replicas? (diverge|differ|drift|disagree|out of sync)"],
    "peft_dora.lr_scaled_world": [
        rf"{_LR}.{{0,80}}(scal\w*|world|factor|too (high|large)|times|double\w*|2x|multipl\w*)", rf"(scal\w*|linear scaling).{{0,60}}{_LR}"],
    "peft_dora.adapter_left_merged": [
        r"merg\w*", r"(adapter|lora|dora).{0,60}(no (gradient|grad)|not (trained|updated)|frozen|disabled|stop\w*)"],
    "peft_dora.attention_mask_dropped": [
        r"(attention|attn)[_ -]?mask", r"\bmask\b", r"pad\w*.{0,60}(attend\w*|attention|mask\w*)", r"attend\w*.{0,40}pad\w*"],
    "peft_dora.pad_lengths_per_rank": [
        rf"pad\w*.{{0,60}}({_SAME}|draw\w*|random|length)", rf"({_SAME}).{{0,60}}pad\w*",
        r"(input|data|batch|rows?|lengths?).{0,40}(differ|mismatch|not the same|wrong)", r"(random|rng) (state|stream)"],
}

assert set(EXPECTED) == set(RUBRIC)


def right(bug_id: str, cause: str | None) -> bool:
    """Whether the first cause (lower-cased) matches one of the bug's patterns."""
    if not cause:
        return False
    text = cause.lower()
    return any(re.search(p, text) for p in RUBRIC[bug_id])
