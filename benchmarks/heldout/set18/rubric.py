"""The rubric of heldout18: per bug, the first cause a right diagnosis names (``EXPECTED``) and the regexes
that accept it (``RUBRIC``), applied lower-cased to the diagnosis's first "likely cause" line (the location
it names removed by the caller). Written from what each bug is, before any run of the plugin on this set,
and not changed after. A diagnosis is right when any of the bug's regexes matches.
"""
from __future__ import annotations

import re

EXPECTED = {
    # fabric_bf16_kd
    "fabric_bf16_kd.teacher_in_train_mode": "the frozen teacher is left in train mode: its batch norm uses each micro-batch's statistics instead of its running statistics",
    "fabric_bf16_kd.kd_missing_t_squared": "the distillation (KL) term is not multiplied by T**2: the soft-target gradients are T**2 times too small",
    "fabric_bf16_kd.kl_reduction_mean": "kl_div uses reduction='mean' instead of 'batchmean': the KL is also divided by the number of classes",
    "fabric_bf16_kd.teacher_not_softened": "the teacher's softmax is not divided by the temperature T (only the student's logits are softened)",
    "fabric_bf16_kd.sync_on_first_micro": "no_backward_sync's enabled flag is inverted: gradients are all-reduced on the first micro-batch, the last micro-batch's gradient stays local (replicas diverge)",
    "fabric_bf16_kd.scheduler_per_micro_batch": "the LR scheduler is stepped on every micro-batch instead of once per optimizer update: warm-up and cosine run ACC times too fast",
    "fabric_bf16_kd.kl_args_swapped": "the kl_div arguments are swapped (teacher log-probs as input, student probs as target): the reverse KL",
    # pseudo_label_eval
    "pseudo_label_eval.pseudo_labels_in_train_mode": "the pseudo-label pass is run in train mode (model.eval() missing): batch-norm batch statistics and dropout on the weak view",
    "pseudo_label_eval.train_mode_not_restored": "model.train() is not restored after the eval-mode pseudo-label pass: training runs in eval mode (running BN statistics, no dropout)",
    "pseudo_label_eval.confident_count_local": "the unlabelled loss is normalised by the rank's local count of confident pseudo-labels instead of the all-reduced global count",
    "pseudo_label_eval.confident_count_not_times_world": "the unlabelled loss divided by the global confident count is not multiplied by the world size: the unlabelled term is W times too small after DDP averaging",
    "pseudo_label_eval.threshold_on_logits": "the confidence threshold is applied to the raw logits instead of the softmax probabilities",
    "pseudo_label_eval.pseudo_labels_from_strong_view": "the pseudo-labels (and mask) are computed from the strong view instead of the weak view",
    "pseudo_label_eval.strong_noise_seeded_per_rank": "the strong augmentation noise is drawn from a per-rank seeded generator instead of the rank's rows of the global draw",
    # mixtral_moe_aux
    "mixtral_moe_aux.tokens_per_expert_local": "the load-balancing loss's tokens-per-expert fractions are local to the rank (not all-reduced over the global batch)",
    "mixtral_moe_aux.aux_ignores_padding": "the load-balancing loss ignores the attention mask: padding tokens are counted",
    "mixtral_moe_aux.topk_weights_not_renormalized": "the top-2 routing weights are not renormalised to sum to one",
    "mixtral_moe_aux.aux_probs_from_topk_weights": "the aux loss uses the top-k (renormalised) routing weights instead of the full router softmax probabilities",
    "mixtral_moe_aux.aux_not_times_world": "the rank's share of the global aux loss is not multiplied by the world size: the load-balancing gradient is W times too small after DDP averaging",
    "mixtral_moe_aux.onecycle_before_optimizer_step": "OneCycleLR.step() is called before optimizer.step(): each update uses the next step's learning rate / momentum",
    "mixtral_moe_aux.jitter_seeded_per_rank": "the router jitter noise is drawn from a per-rank seeded generator instead of the rank's rows of the global draw",
    # partial_fc_margin
    "partial_fc_margin.allgather_grad_not_times_world": "the embedding all-gather's backward is not multiplied by the world size: the backbone gradient is W times too small after DDP averaging",
    "partial_fc_margin.allgather_grad_not_reduced": "the embedding all-gather's backward does not all-reduce the gradient: each rank's backbone gets only its own class shard's gradient",
    "partial_fc_margin.max_not_all_reduced": "the distributed softmax uses the local max instead of the all-reduced global max before summing exponentials across ranks",
    "partial_fc_margin.labels_not_offset": "the gathered labels are not offset by the rank's class_start: the target column is wrong on ranks > 0",
    "partial_fc_margin.centers_not_normalized": "the class centres (classifier weights) are not L2-normalised before the cosine logits",
    "partial_fc_margin.fc_shard_inside_ddp": "the sharded classifier is wrapped in DDP: rank 0's shard is broadcast to all ranks and the different shards' gradients are averaged",
    "partial_fc_margin.ce_mean_over_local_batch": "the distributed cross entropy is divided by the local batch size instead of the global (gathered) batch size",
    # nnunet_dice_ds
    "nnunet_dice_ds.dice_stats_not_gathered": "the batch dice's tp/fp/fn (intersection and sums) are not all-gathered: the dice is computed over the local batch only",
    "nnunet_dice_ds.gather_without_grad": "the dice statistics are all-gathered without gradient (plain all_gather): the dice gradient misses the other ranks' terms (W times too small)",
    "nnunet_dice_ds.background_in_dice": "the background class is included in the dice (do_bg=True)",
    "nnunet_dice_ds.ds_weights_not_normalized": "the deep-supervision weights are not normalised to sum to one: the loss is scaled up",
    "nnunet_dice_ds.ds_weights_reversed": "the deep-supervision weights are applied in reverse order (largest weight on the lowest resolution)",
    "nnunet_dice_ds.poly_lr_off_by_one": "the poly learning-rate schedule is off by one (set from step + 1)",
    "nnunet_dice_ds.softmax_missing": "the soft dice is computed on raw logits: the softmax nonlinearity is missing",
    # yolo_nbs_warmup
    "yolo_nbs_warmup.loss_not_times_world": "the loss is not multiplied by WORLD_SIZE: with the per-rank batch-size scaling, DDP's averaging makes gradients W times too small",
    "yolo_nbs_warmup.accumulate_from_local_batch": "the accumulation count is computed from the per-rank batch size instead of the total batch: W times too many accumulated iterations per step",
    "yolo_nbs_warmup.weight_decay_not_scaled": "the weight decay is not scaled by batch_size * accumulate / nbs",
    "yolo_nbs_warmup.bias_warmup_on_wrong_group": "the warm-up bias lr is applied to the wrong parameter group (BN weights instead of biases)",
    "yolo_nbs_warmup.momentum_warmup_missing": "the momentum is not warmed up (not interpolated from warmup_momentum)",
    "yolo_nbs_warmup.warmup_len_from_dataset_size": "the warm-up length uses the dataset size over the per-rank batch instead of the per-process loader length: warm-up W times too long",
    "yolo_nbs_warmup.last_opt_step_not_updated": "last_opt_step is not updated after an optimizer step: the optimizer steps every iteration instead of every accumulate iterations",
}

_AR = r"(all[_ -]?reduc\w*|allreduc\w*|reduce[_ ]mean|synchroni[sz]\w*|sync\w*)"
_GATHER = r"(all[_ -]?gather\w*|allgather\w*|gather\w*)"
_LR = r"(learning[ -]rate|\blr\b)"
_SCHED = r"(schedul\w*|warm[- ]?up|cosine|one[_ ]?cycle\w*|poly\w*|decay\w*|anneal\w*)"
_LOCAL = r"(local\w*|per[- ]rank|each rank|own rank|this rank|rank'?s own|not (global|all[_ -]?reduc\w*|reduced|synchroni[sz]ed|averaged|gathered)|instead of (the )?global)"
_SCALE = r"(scal\w*|divid\w*|averag\w*|normali[sz]\w*|too (large|big|small)|double\w*|twice|half|\d+ ?x|times|factor|multipl\w*|world[_ ]size|\bw\b)"
_WORLD = r"(world[_ ]?size|\bw\b|number of (ranks|processes|replicas|workers|gpus|devices)|num[_ ]?(ranks|processes|replicas)|ranks)"
_BEFORE = r"(before|order\w*|too early|early|stale|previous|prior to|ahead of|one step ahead|next step)"
_MODE = r"(train(ing)?[- ]mode|eval(uation)?[- ]mode|\.train\(\)|\.eval\(\)|model\.train|model\.eval|\bmode\b)"
_BN = r"(batch[_ ]?norm\w*|\bbn\b|running (mean|var\w*|stat\w*)|batch stat\w*)"
_SEED = r"(seed\w*|generator|rng|random (state|stream|draw|noise)|per[- ]rank (noise|draw|random\w*)|different (noise|draws?|random))"
_REPL = r"replicas? (diverge\w*|differ\w*|drift\w*|disagree\w*|out of sync)"
_KL = r"(\bkl\b|kl[_ ]?div\w*|kullback|distill\w*|soft[- ]?(target|label)s?|kd\b|kd[_ ]loss)"
_AUX = r"(aux\w*|load[- ]?balanc\w*|balance loss|balancing loss|\blbl\b|router loss)"
_DS = r"(deep[- ]?supervision|ds[_ ]weights?|supervision weights?|(scale|resolution|output) weights?|multi[- ]?scale)"
_DICE = r"(dice|\btp\b|\bfp\b|\bfn\b|intersect\w*|sum_pred|sum_gt)"

RUBRIC = {
    # fabric_bf16_kd
    "fabric_bf16_kd.teacher_in_train_mode": [
        rf"teacher.{{0,80}}({_MODE}|not (in )?eval\w*|{_BN}|batch stat\w*)", rf"{_MODE}.{{0,60}}teacher",
        rf"{_BN}.{{0,80}}(teacher|micro[- ]?batch stat\w*|batch stat\w*)"],
    "fabric_bf16_kd.kd_missing_t_squared": [
        r"(t\s?\*\*\s?2|t\^2|t²|t\s?\*\s?t|temperature squared|squared temperature|square of (the )?temperature)",
        rf"{_KL}.{{0,80}}(temperature|\bt\b).{{0,40}}({_SCALE}|missing|not)", rf"(temperature|\bt\b).{{0,60}}{_KL}.{{0,40}}({_SCALE}|missing)"],
    "fabric_bf16_kd.kl_reduction_mean": [
        r"batchmean", rf"{_KL}.{{0,80}}(reduction|mean over (all )?(elements|classes)|number of classes|divid\w* by (the )?(classes|elements))",
        r"reduction ?= ?['\"]?mean"],
    "fabric_bf16_kd.teacher_not_softened": [
        r"teacher.{0,80}(temperature|soften\w*|\bt\b|/ ?t\b|unsoftened|not (divided|scaled))",
        r"(temperature|\bt\b).{0,60}(teacher'?s? (logits|softmax|probabilit\w*|distribution|outputs?)|only (on|to) the student|one side|asymmetr\w*)"],
    "fabric_bf16_kd.sync_on_first_micro": [
        r"(no_backward_sync|no_sync|backward[_ ]sync|enabled).{0,80}(invert\w*|revers\w*|wrong|flip\w*|first|last|swap\w*|opposite)",
        rf"(last|final) micro[- ]?batch.{{0,80}}({_AR}|local|not (synced|reduced|averaged))", rf"(grad\w*).{{0,60}}({_AR}|sync\w*).{{0,40}}(first|wrong) micro",
        rf"(accumulat\w*|micro[- ]?batch\w*).{{0,80}}({_AR}|sync\w*)", _REPL],
    "fabric_bf16_kd.scheduler_per_micro_batch": [
        rf"({_SCHED}|schedulers?).{{0,80}}(micro[- ]?batch\w*|every (batch|iteration|step|backward)|per (micro|batch|iteration)|accumulat\w*|too (fast|often|early)|twice|\d+ ?x|more often)",
        rf"{_LR}.{{0,60}}(too (fast|early|quick\w*)|ahead|decay\w* (too )?fast)", rf"(micro[- ]?batch\w*|accumulat\w*).{{0,60}}{_SCHED}"],
    "fabric_bf16_kd.kl_args_swapped": [
        rf"{_KL}.{{0,80}}(swap\w*|revers\w*|order|direction|argument\w*|invert\w*|wrong (way|input|target))",
        r"(reverse|backward|wrong[- ]direction) kl", r"(student|teacher).{0,60}(swap\w*|revers\w*|as (the )?(input|target))"],
    # pseudo_label_eval
    "pseudo_label_eval.pseudo_labels_in_train_mode": [
        rf"(pseudo[- ]?label\w*|weak (view|augment\w*)|teacher pass|label(ling)? pass).{{0,80}}(train(ing)?[- ]mode|not (in )?eval\w*|without (model\.)?eval|batch stat\w*|dropout (active|on|enabled|applied))",
        r"(missing|without|no|forg\w*) (the )?(model\.)?eval\(?\)?", rf"eval\(\).{{0,40}}(missing|not called|forg\w*)"],
    "pseudo_label_eval.train_mode_not_restored": [
        rf"(\.train\(\)|train(ing)?[- ]mode).{{0,40}}(not (restored|called|reset|re-?enabled|set back|switched back)|never (restored|called|set)|forg\w*)",
        r"(model\.)?train\(\)\s*(is )?(missing|never called|not called)",
        rf"(stays?|left|remains?|stuck|runs?) in eval\w*", rf"eval[- ]mode.{{0,60}}(training|rest of|for the (remaining|subsequent))",
        r"(dropout|batch[- ]?norm).{0,60}(disabled|off|running stat\w*).{0,40}(training|train)"],
    "pseudo_label_eval.confident_count_local": [
        rf"(confiden\w*|mask\w*|pseudo[- ]?label\w*|count|normali[sz]\w*|denominator|unlabel\w*).{{0,80}}({_LOCAL}|per[- ]rank|rank)",
        rf"(not|never|no|without|missing) {_AR}.{{0,60}}(count|mask|confiden\w*|denominator)"],
    "pseudo_label_eval.confident_count_not_times_world": [
        rf"(unlabel\w*|confiden\w*|count|mask\w*|normali[sz]\w*|denominator|consisten\w*).{{0,80}}({_WORLD}|w times|too small|multipl\w*|factor)",
        rf"({_WORLD}).{{0,60}}(missing|not multipl\w*|factor|scal\w*)", rf"(ddp|averag\w*).{{0,60}}(compensat\w*|w times|too small|divid\w*)"],
    "pseudo_label_eval.threshold_on_logits": [
        r"(threshold\w*|confiden\w*|mask|tau).{0,80}(logit\w*|softmax|probabilit\w*|raw|unnormali[sz]\w*)",
        r"(logit\w*).{0,60}(threshold\w*|instead of (the )?(softmax|probabilit\w*))", r"(softmax|probabilit\w*).{0,40}(missing|not applied|skip\w*)"],
    "pseudo_label_eval.pseudo_labels_from_strong_view": [
        r"pseudo[- ]?label\w*.{0,80}(strong\w*|wrong (view|input|augment\w*))", r"(strong|weak) (view|augment\w*).{0,40}(instead of|rather than|swapped|used for (the )?pseudo)",
        r"(weak|strong) and (strong|weak) (views?|augment\w*).{0,40}(swap\w*|confus\w*|mixed)"],
    "pseudo_label_eval.strong_noise_seeded_per_rank": [
        rf"(noise|augment\w*|strong\w*|random\w*).{{0,80}}({_SEED}|per[- ]rank|each rank|rank[- ]seeded|rank[- ]dependent|local)",
        rf"{_SEED}.{{0,60}}(rank|per[- ]rank|each rank|global)", r"(rank|per[- ]rank)[- ](seed\w*|generator|rng)"],
    # mixtral_moe_aux
    "mixtral_moe_aux.tokens_per_expert_local": [
        rf"(tokens?[_ ]per[_ ]expert|token (fraction|count)s?|expert (load|count|fraction)s?|routing (fraction|count)s?|{_AUX}).{{0,80}}({_LOCAL}|per[- ]rank|{_AR}|global)",
        rf"(not|never|no|without|missing) {_AR}.{{0,60}}(token\w*|expert\w*|count\w*|fraction\w*|{_AUX})"],
    "mixtral_moe_aux.aux_ignores_padding": [
        r"(pad\w*|attention[_ ]mask|mask\w*).{0,80}(aux\w*|load[- ]?balanc\w*|router|count\w*|included|ignor\w*|not (excluded|masked))",
        rf"{_AUX}.{{0,80}}(pad\w*|attention[_ ]mask|mask\w*)"],
    "mixtral_moe_aux.topk_weights_not_renormalized": [
        r"(top[- ]?(k|2)|routing|gate|gating|router|expert) (weight|prob\w*|score)s?.{0,80}(renormali[sz]\w*|normali[sz]\w*|sum to (one|1)|not (re)?normali[sz]ed)",
        r"(renormali[sz]\w*|normali[sz]\w*).{0,30}(missing|skipp\w*|not (done|applied))", r"not (re)?normali[sz]ed"],
    "mixtral_moe_aux.aux_probs_from_topk_weights": [
        rf"{_AUX}.{{0,80}}(top[- ]?(k|2)|routing weights|full softmax|router prob\w*|softmax|selected|renormali[sz]\w*)",
        r"(router[_ ]prob\w*|router_prob_per_expert|prob\w* per expert|mean (router )?prob\w*).{0,80}(top[- ]?(k|2)|routing weights|instead|wrong|softmax)"],
    "mixtral_moe_aux.aux_not_times_world": [
        rf"{_AUX}.{{0,80}}({_WORLD}|w times|too small|multipl\w*|factor|scal\w*)", rf"({_WORLD}).{{0,60}}{_AUX}",
        rf"(router|gate|gating).{{0,60}}grad\w*.{{0,40}}(too small|{_SCALE})"],
    "mixtral_moe_aux.onecycle_before_optimizer_step": [
        rf"({_SCHED}|schedulers?|scheduler\.step).{{0,80}}{_BEFORE}.{{0,60}}(optimi[sz]er|opt\b|step|update)",
        rf"(optimi[sz]er\.?step|opt\.step).{{0,60}}(after|order\w*).{{0,40}}({_SCHED}|scheduler)",
        rf"({_SCHED}|scheduler\w*).{{0,60}}(order\w*|one step (ahead|early)|off[- ]by[- ]one|skips? the (first|initial))"],
    "mixtral_moe_aux.jitter_seeded_per_rank": [
        rf"(jitter\w*|router noise|noise).{{0,80}}({_SEED}|per[- ]rank|each rank|rank[- ]seeded|rank[- ]dependent|local)",
        rf"{_SEED}.{{0,60}}(rank|per[- ]rank|each rank|global)", r"(rank|per[- ]rank)[- ](seed\w*|generator|rng)"],
    # partial_fc_margin
    "partial_fc_margin.allgather_grad_not_times_world": [
        rf"({_GATHER}|backward|embedding|backbone).{{0,80}}(world[_ ]?size|\bw\b|number of (ranks|processes)|w times|too small|multipl\w*|factor|scal\w*)",
        rf"(grad_out|backbone grad\w*|embedding grad\w*).{{0,60}}({_SCALE}|{_WORLD})", rf"{_WORLD}.{{0,60}}(missing|not multipl\w*|factor)"],
    "partial_fc_margin.allgather_grad_not_reduced": [
        rf"{_GATHER}.{{0,80}}(backward|grad\w*).{{0,60}}((not|never|no|without|missing) ({_AR}|reduc\w*|sum\w*)|(own|local) (slice|shard|part|gradient))",
        rf"(backward|grad\w*).{{0,80}}(not|never|no|without|missing) ({_AR}|reduc\w*|sum\w*)",
        rf"(embedding|backbone) grad\w*.{{0,60}}({_LOCAL}|own (class )?shard|partial|only)", r"(other ranks'?|remote) (class )?(shards?|centres|centers).{0,60}grad\w*",
        rf"(not|never) (summed|reduced|all[_ -]?reduced).{{0,60}}(backward|{_GATHER})", r"(backward|grad\w*).{0,80}(other ranks|remote)"],
    "partial_fc_margin.max_not_all_reduced": [
        rf"(max|maximum|logit max|stabili[sz]\w*|shift\w*).{{0,80}}({_LOCAL}|{_AR}|global|per[- ]rank|each rank)",
        rf"(softmax|log[- ]?sum[- ]?exp|normali[sz]\w*|partition).{{0,80}}(max|maximum).{{0,40}}({_LOCAL}|{_AR}|global)",
        rf"(not|never|no|without|missing) {_AR}.{{0,40}}(max|maximum)"],
    "partial_fc_margin.labels_not_offset": [
        r"(label|target|class (index|id))s?.{0,80}(offset|class_start|shift\w*|local (index|column|id)|rank|remap\w*|wrong column|misalign\w*)",
        r"(class_start|offset).{0,60}(label|target|missing|not (subtracted|applied))"],
    "partial_fc_margin.centers_not_normalized": [
        r"(weight|cent(er|re)s?|class cent(er|re)s?|classifier|prototype|fc)\w*.{0,80}(normali[sz]\w*|l2|unit|norm\b|cosine)",
        r"(normali[sz]\w*|l2[- ]?norm\w*).{0,60}(weight|cent(er|re)|classifier|missing)", r"not (a )?cosine"],
    "partial_fc_margin.fc_shard_inside_ddp": [
        rf"(ddp|distributeddataparallel).{{0,80}}(shard\w*|classifier|partial[_ ]?fc|fc|cent(er|re)s?|head|broadcast\w*|model[- ]parallel)",
        rf"(shard\w*|classifier|partial[_ ]?fc|cent(er|re)s?|model[- ]parallel).{{0,80}}(ddp|broadcast\w*|averag\w*|{_AR}|replicat\w*|wrapped)",
        r"broadcast\w*.{0,60}(rank ?0|shard|weight)"],
    "partial_fc_margin.ce_mean_over_local_batch": [
        rf"(cross[- ]?entropy|\bce\b|loss|mean|denominator|divid\w*|normali[sz]\w*).{{0,80}}({_LOCAL}|local batch|batch size|global batch|gathered)",
        rf"(local|per[- ]rank) batch.{{0,60}}({_SCALE}|instead|denominator)", rf"{_SCALE}.{{0,40}}(local|global) batch"],
    # nnunet_dice_ds
    "nnunet_dice_ds.dice_stats_not_gathered": [
        rf"{_DICE}.{{0,80}}({_LOCAL}|per[- ]rank|local batch)", rf"{_DICE}.{{0,60}}not (all[_ -]?)?(gathered|reduced)",
        rf"(not|never|no|without|missing) ({_GATHER}|{_AR}).{{0,60}}{_DICE}", r"batch[_ ]dice.{0,40}(local|per[- ]rank|ddp)"],
    "nnunet_dice_ds.gather_without_grad": [
        rf"{_GATHER}.{{0,80}}(without (autograd|grad\w*)|no (autograd|grad\w*)|not differentiable|non[- ]?differentiable|detach\w*|autograd|gradient\w*|allgathergrad)",
        rf"{_DICE}.{{0,80}}(grad\w*).{{0,60}}({_SCALE}|missing|other ranks|too small)", r"allgathergrad",
        rf"(no|without|missing|lost|drop\w*) (autograd|gradient\w*).{{0,60}}({_GATHER}|other ranks|remote)"],
    "nnunet_dice_ds.background_in_dice": [
        r"(background|do_bg|bg\b|class 0|label 0)", r"dice.{0,60}(all classes|every class|includ\w*)"],
    "nnunet_dice_ds.ds_weights_not_normalized": [
        rf"{_DS}.{{0,80}}(normali[sz]\w*|sum to (one|1)|{_SCALE}|not divided)", rf"(weights?).{{0,60}}(not normali[sz]ed|sum to (one|1)|unnormali[sz]ed)",
        rf"loss.{{0,60}}(too (large|big)|{_SCALE}).{{0,40}}(weight|supervision)"],
    "nnunet_dice_ds.ds_weights_reversed": [
        rf"{_DS}.{{0,80}}(revers\w*|order\w*|flip\w*|swap\w*|wrong|lowest|highest|mismatch\w*)",
        r"(weights?).{0,60}(revers\w*|wrong order|flipped|lowest resolution|mismatch\w*)", r"(output|resolution|scale)s?.{0,60}(order|revers\w*|mismatch\w*)"],
    "nnunet_dice_ds.poly_lr_off_by_one": [
        rf"({_SCHED}|{_LR}|schedulers?).{{0,80}}(off[- ]by[- ]one|one step (ahead|early|late)|step ?\+ ?1|next (step|update|epoch)|index\w*|shifted|wrong (step|epoch))",
        r"off[- ]by[- ]one", rf"{_LR}.{{0,60}}(too (low|small|early)|ahead|decay\w* (too )?(early|fast))"],
    "nnunet_dice_ds.softmax_missing": [
        r"(softmax|apply_nonlin|nonlinearit\w*|sigmoid|probabilit\w*)", r"(raw|unnormali[sz]ed) (logits|outputs|scores)", r"logits.{0,60}dice"],
    # yolo_nbs_warmup
    "yolo_nbs_warmup.loss_not_times_world": [
        rf"(loss|grad\w*).{{0,80}}({_WORLD}).{{0,40}}(missing|not|never|multipl\w*|scal\w*|factor)?",
        rf"({_WORLD}).{{0,60}}(missing|not multipl\w*|factor|scal\w*|loss)", rf"(ddp|averag\w*).{{0,60}}(compensat\w*|too small|divid\w*)"],
    "yolo_nbs_warmup.accumulate_from_local_batch": [
        rf"(accumulat\w*|nbs|nominal batch).{{0,80}}({_LOCAL}|per[- ](rank|process|device|gpu)|local|batch[_ ]size|total batch|global batch|too (many|large|much))",
        rf"(per[- ](rank|process|device|gpu)|local) batch.{{0,60}}(accumulat\w*|nbs)", r"(fewer|too few) (optimi[sz]er )?(steps|updates)"],
    "yolo_nbs_warmup.weight_decay_not_scaled": [
        r"(weight[_ ]decay|\bwd\b|decay).{0,80}(scal\w*|nbs|nominal|batch[_ ]size|accumulat\w*|not adjusted)"],
    "yolo_nbs_warmup.bias_warmup_on_wrong_group": [
        r"(warm[- ]?up[_ ]bias[_ ]lr|bias (lr|learning rate|warm[- ]?up))", r"(param(eter)? groups?|group (index|order|0|2)|j ?== ?0).{0,80}(wrong|bias\w*|order\w*|mismatch\w*|swap\w*|bn|batch[- ]?norm)",
        rf"(warm[- ]?up).{{0,80}}(wrong|bias\w*|group\w*|bn|batch[- ]?norm)"],
    "yolo_nbs_warmup.momentum_warmup_missing": [
        r"momentum.{0,80}(warm[- ]?up|interp\w*|ramp\w*|not (warmed|interpolated|ramped)|missing|from the (first|start)|full)",
        r"warm[- ]?up.{0,60}momentum"],
    "yolo_nbs_warmup.warmup_len_from_dataset_size": [
        rf"(warm[- ]?up|\bnw\b|\bnb\b|iterations per epoch|loader len\w*|len\(train_loader\)).{{0,80}}(too (long|many)|length|{_WORLD}|dataset|per[- ](rank|process)|global|local|loader|iterations|longer)",
        r"(dataset size|len\(dataset\)|number of (batches|iterations)).{0,60}(warm[- ]?up|loader|per[- ](rank|process)|instead)"],
    "yolo_nbs_warmup.last_opt_step_not_updated": [
        r"last[_ ]opt[_ ]step", rf"(optimi[sz]er|opt\b|step\w*).{{0,80}}(every (iteration|batch|step)|each (iteration|batch)|too (often|many)|more often|accumulat\w*)",
        rf"accumulat\w*.{{0,80}}(ignored|not (respected|applied|honou?red)|broken|skipp\w*|bypass\w*|never|counter)"],
}

assert set(EXPECTED) == set(RUBRIC)


def right(bug_id: str, cause: str | None) -> bool:
    """Whether the first cause (lower-cased) matches one of the bug's patterns."""
    if not cause:
        return False
    text = cause.lower()
    return any(re.search(p, text) for p in RUBRIC[bug_id])
