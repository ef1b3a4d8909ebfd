"""The rubric of heldout17: per bug, the first cause a right diagnosis names (``EXPECTED``) and the regexes
that accept it (``RUBRIC``), applied lower-cased to the diagnosis's first "likely cause" line (the location
it names removed by the caller). Written from what each bug is, before any run of the plugin on this set,
and not changed after. A diagnosis is right when any of the bug's regexes matches.
"""
from __future__ import annotations

import re

EXPECTED = {
    # clip_contrastive
    "clip_contrastive.gather_without_grad": "the embeddings are all-gathered without autograd (gather_with_grad=False): the other ranks' rows get no gradient from this rank's loss",
    "clip_contrastive.labels_not_offset_by_rank": "the contrastive labels are not offset by rank * local_batch: on ranks > 0 each row is paired with the wrong (rank 0's) column",
    "clip_contrastive.local_negatives_only": "the embeddings are not all-gathered: each rank contrasts against its local batch only (the global negatives are missing)",
    "clip_contrastive.logit_scale_not_exponentiated": "the logits are scaled by logit_scale instead of logit_scale.exp() (the temperature is used in log space)",
    "clip_contrastive.image_to_text_only": "the loss is one-directional: the text-to-image cross entropy of the symmetric CLIP loss is missing",
    "clip_contrastive.features_not_normalized": "the image/text embeddings are not L2-normalised before the similarity",
    "clip_contrastive.loss_times_world_size": "the loss is multiplied by the world size: gradients W times too large",
    # t5_seq2seq
    "t5_seq2seq.loss_mean_per_rank": "the loss is the per-rank mean over local target tokens instead of being normalised by the global (all-reduced) token count",
    "t5_seq2seq.labels_padded_with_pad_id": "the labels are padded with the pad id instead of -100: padding positions are included in the loss",
    "t5_seq2seq.decoder_inputs_not_shifted": "the decoder inputs are the unshifted labels (not shift-right): the decoder sees the token it must predict",
    "t5_seq2seq.no_attention_mask": "the encoder attention mask is not passed: padding tokens are attended to",
    "t5_seq2seq.attention_mask_inverted": "the attention mask is inverted (1 on padding, 0 on real tokens)",
    "t5_seq2seq.schedule_total_from_global_samples": "the linear schedule's num_training_steps is world times too large (computed from the global sample count): the lr decays too slowly",
    "t5_seq2seq.decay_on_layer_norm": "weight decay is applied to the layer-norm weights (the no-decay parameter group is missing)",
    # swa_averaged
    "swa_averaged.swa_start_off_by_one": "the SWA phase starts one update late (off by one in the swa_start comparison)",
    "swa_averaged.base_scheduler_still_stepped": "the base (cosine) scheduler is still stepped after SWA starts, alongside SWALR",
    "swa_averaged.swa_update_before_optimizer_step": "swa_model.update_parameters runs before optimizer.step(): the average takes the stale weights",
    "swa_averaged.bn_not_synced": "the batch norm is not synchronised: each rank normalises with its local batch statistics",
    "swa_averaged.averaged_model_in_train_mode": "the averaged (SWA) model is run in train mode: its batch norm uses batch statistics instead of its running statistics",
    "swa_averaged.averaged_buffers_not_tracked": "the averaged model's batch-norm running statistics are never updated (no use_buffers=True, no update_bn)",
    "swa_averaged.swa_update_on_rank0_only": "the SWA average is updated on rank 0 only: the other ranks' averaged models (and consistency targets) are stale",
    # zero_redundancy
    "zero_redundancy.clip_local_shard_norm": "the gradient norm for clipping is computed over the rank's local ZeRO shard only, not the global norm",
    "zero_redundancy.clip_shard_norms_summed": "the global gradient norm is the sum of the shards' norms instead of the root of the summed squares",
    "zero_redundancy.clip_after_step": "gradient clipping runs after optimizer.step(): the update is unclipped",
    "zero_redundancy.clip_per_tensor": "each parameter is clipped separately (per-tensor norm) instead of by the total norm",
    "zero_redundancy.cosine_t_max_in_epochs": "the cosine schedule's T_max is in epochs while it is stepped per iteration: the lr cycles too fast",
    "zero_redundancy.scheduler_on_inner_optimizer": "the LR scheduler is attached to ZeRO's inner local optimizer, whose lr ZeRO overwrites: the schedule has no effect",
    "zero_redundancy.no_ddp_gradient_averaging": "the model is not wrapped in DDP: the gradients are never averaged across ranks (ZeRO does not sync gradients)",
    # focal_dense
    "focal_dense.num_pos_local": "the loss normaliser uses the local number of positive anchors instead of the all-reduced (averaged) count",
    "focal_dense.num_pos_summed_not_averaged": "the all-reduced positive-anchor count is not divided by the world size: the normaliser is W times too large",
    "focal_dense.normalizer_ema_missing": "the loss normaliser is the current positive count, not its EMA (the moving average is skipped)",
    "focal_dense.pos_mask_includes_ignored": "the positive mask does not exclude ignored anchors (-1): they are counted as positives and get a box loss",
    "focal_dense.focal_alpha_swapped": "the focal loss alpha weighting is swapped between positives and negatives",
    "focal_dense.box_loss_on_all_anchors": "the box regression loss is computed on all anchors, not only the positive (foreground) anchors",
    "focal_dense.one_hot_wrong_slice": "the one-hot classification targets drop the wrong column (the first instead of the background one): classes are shifted",
    # dino_centering
    "dino_centering.center_not_all_reduced": "the DINO center is updated from the local teacher outputs only (the batch center is not all-reduced)",
    "dino_centering.center_divided_by_local_count": "the all-reduced batch center is divided by the local batch size, not the global (missing world size): the center is W times too large",
    "dino_centering.center_updated_before_loss": "the center is updated before the loss is computed: the teacher is centred with the current batch's center",
    "dino_centering.teacher_temp_warmup_in_iterations": "the teacher temperature warm-up is indexed by iteration instead of epoch: the warm-up ends too early",
    "dino_centering.momentum_schedule_per_epoch": "the teacher EMA momentum schedule is per epoch instead of per iteration: the wrong momentum is used",
    "dino_centering.teacher_ema_before_optimizer_step": "the teacher EMA update runs before optimizer.step(): the teacher follows the previous student weights",
    "dino_centering.same_view_pairs_not_skipped": "the DINO loss includes the same-view pairs (teacher and student on the same crop are not skipped)",
}

_AR = r"(all[_ -]?reduc\w*|allreduc\w*|reduce[_ ]mean|synchroni[sz]\w*|sync\w*)"
_GATHER = r"(all[_ -]?gather\w*|allgather\w*|gather\w*)"
_LR = r"(learning[ -]rate|\blr\b)"
_SCHED = r"(schedul\w*|warm[- ]?up|cosine|t_max|linear decay|decay\w*|num_training_steps|total steps|swalr|anneal\w*)"
_LOCAL = r"(local\w*|per[- ]rank|each rank|own rank|this rank|rank'?s own|not (global|all[_ -]?reduc\w*|reduced|synchroni[sz]ed|averaged|gathered)|instead of (the )?global)"
_SCALE = r"(scal\w*|divid\w*|averag\w*|normali[sz]\w*|too (large|big|small)|double\w*|twice|\d+ ?x|times|factor|sum\w*|world[_ ]size|\bw\b)"
_EMA = r"(\bema\b|moving average|momentum|teacher|averaged (model|weights))"
_SWA = r"(\bswa\b|swa[_ ]model|averagedmodel|averaged[_ ]model|averag\w* model|update_parameters|weight averag\w*|stochastic weight)"
_CLIP = r"(clip\w*|grad(ient)?[_ ]norm|clip_grad_norm\w*|max[_ ]norm)"
_CENTER = r"(cent(er|re)\w*)"
_BEFORE = r"(before|order\w*|too early|early|stale|previous|prior to|ahead of)"
_REPL = r"replicas? (diverge\w*|differ\w*|drift\w*|disagree\w*|out of sync)"

RUBRIC = {
    # clip_contrastive
    "clip_contrastive.gather_without_grad": [
        rf"{_GATHER}.{{0,80}}(without (autograd|grad\w*)|no (autograd|grad\w*)|not differentiable|non[- ]?differentiable|detach\w*|autograd|gradients?\b)",
        r"gather[_ ]with[_ ]grad", rf"(no|without|missing|lost|drop\w*) (autograd|gradient\w*).{{0,60}}({_GATHER}|other ranks|remote|negatives)",
        r"(other ranks'?|remote|gathered) (rows|embeddings|features|samples).{0,60}(no grad\w*|not receiv\w*|detach\w*|without grad\w*)"],
    "clip_contrastive.labels_not_offset_by_rank": [
        r"(label|target|ground[- ]truth)s?.{0,80}(offset|rank|shift\w*|misalign\w*|wrong|arange|index\w*)",
        r"(offset|shift\w*).{0,60}(rank|label|target)", r"arange\(.{0,30}\).{0,40}(rank|offset)", r"(positive pairs?|diagonal).{0,60}(wrong|misalign\w*|offset|rank)"],
    "clip_contrastive.local_negatives_only": [
        rf"(not|never|no|missing|without|skip\w*) (all[_ -]?)?gather\w*", rf"{_GATHER}.{{0,60}}(missing|skipp\w*|absent|not (done|performed|called))",
        r"(local|own|per[- ]rank) (batch|negatives|features|embeddings).{0,60}(only|instead|contrast\w*)", r"(global|cross[- ]rank) negatives", r"negatives.{0,60}(local|missing|fewer|only)"],
    "clip_contrastive.logit_scale_not_exponentiated": [
        r"(logit[_ ]scale|temperature).{0,80}(exp\w*|log[- ]?(space|scale|param\w*)|raw|not exponent\w*)",
        r"exp\(\)", r"(exponent\w*|\.exp).{0,40}(missing|not|forgot\w*)"],
    "clip_contrastive.image_to_text_only": [
        r"(symmetric|both directions|two directions|one[- ]direction\w*|single direction|bidirectional|asymmetric\w*)",
        r"(text[- ]?(to|2)[- ]?image|logits[_ ]per[_ ]text|i2t|t2i|image[- ]?(to|2)[- ]?text)", r"(second|other) (cross[- ]entropy|loss term|term|direction)"],
    "clip_contrastive.features_not_normalized": [
        r"(normali[sz]\w*|l2[- ]?norm\w*|unit[- ]norm|f\.normalize)", r"(embedding|feature)s?.{0,60}(norm\w*|magnitude|length|unnormali[sz]ed)", r"cosine"],
    "clip_contrastive.loss_times_world_size": [
        rf"(loss|grad\w*).{{0,80}}(multipl\w*|scal\w*|times|\d+ ?x|too (large|big)|factor|double\w*).{{0,60}}(world|rank|\bw\b|size)?",
        r"world[_ ]size.{0,60}(multipl\w*|scal\w*|factor|loss|grad\w*)", rf"(undo|compensat\w*|counter\w*).{{0,40}}(ddp|averag\w*)"],
    # t5_seq2seq
    "t5_seq2seq.loss_mean_per_rank": [
        r"(token|item)s?.{0,80}(count|number|normali[sz]\w*|global|all[_ -]?reduc\w*|per[- ]rank|local|weigh\w*)",
        rf"(loss|mean|normali[sz]\w*|denominator).{{0,80}}({_LOCAL}|per[- ]rank|tokens?)", r"num_items_in_batch",
        r"(unequal|different|varying) (number of )?(tokens|lengths|counts)"],
    "t5_seq2seq.labels_padded_with_pad_id": [
        r"-100", r"ignore[_ ]index", r"(label|target)s?.{0,80}(pad\w*|mask\w*|ignor\w*)", r"pad\w*.{0,60}(loss|label|target|counted|trained|included|not (masked|ignored))"],
    "t5_seq2seq.decoder_inputs_not_shifted": [
        r"shift\w*", r"decoder[_ ]input\w*", r"(teacher forcing|sees? the (target|label|token it)|copy\w* the (target|label)|leak\w*)",
        r"(label|target)s?.{0,60}(decoder|as input)"],
    "t5_seq2seq.no_attention_mask": [
        r"(attention[_ ]?mask|attn[_ ]?mask|\bmask\w*).{0,80}(missing|not passed|absent|none|omitted|dropped|forg\w*|without|no\b)",
        r"(missing|no|without|omitted|forg\w*) (the )?(encoder )?(attention[_ ]?mask|mask)", r"pad\w*.{0,60}(attend\w*|attention|not masked|unmasked)"],
    "t5_seq2seq.attention_mask_inverted": [
        r"(attention[_ ]?mask|attn[_ ]?mask|\bmask\w*).{0,80}(invert\w*|flip\w*|revers\w*|wrong|swap\w*|negat\w*|opposite|== ?pad|polarity|1 on pad)",
        r"(invert\w*|flipped|reversed|opposite) (attention[_ ]?)?mask", r"(real tokens?|content).{0,40}(masked|hidden)"],
    "t5_seq2seq.schedule_total_from_global_samples": [
        rf"{_SCHED}.{{0,80}}(total|num[_ ]training[_ ]steps|length|too (long|slow)|world|global|steps|horizon|decay\w* (too )?slow)",
        r"num[_ ]training[_ ]steps", rf"{_LR}.{{0,60}}(too (high|large|slow)|decay\w*|schedul\w*)"],
    "t5_seq2seq.decay_on_layer_norm": [
        r"(weight[_ ]decay|no[_ ]decay|decay).{0,80}(layer[_ ]?norm|norm|bias\w*|group\w*|all param\w*|every param\w*|excluded|exclusion)",
        r"(layer[_ ]?norm|norm) (weight|param\w*)s?.{0,60}(decay\w*)", r"param(eter)? groups?"],
    # swa_averaged
    "swa_averaged.swa_start_off_by_one": [
        rf"({_SWA}|swa[_ ]start|averag\w*).{{0,80}}((starts?|begins?|phase) (one (step|update|iteration) )?(too )?(late|early)|off[- ]by[- ]one|one (step|update|iteration) (late|early)|>=|boundar\w*|start condition|wrong (start|step))",
        r"off[- ]by[- ]one", r"swa[_ ]start\b"],
    "swa_averaged.base_scheduler_still_stepped": [
        rf"({_SCHED}|schedulers?).{{0,80}}(both|still|also|twice|alongside|conflict\w*|fight\w*|together|after (the )?swa|continu\w*|not stopped|double)",
        r"(two|both) schedulers", rf"(cosine|base|main) schedul\w*.{{0,60}}({_SWA}|swa|after)", rf"{_LR}.{{0,60}}(overwrit\w*|conflict\w*|both|wrong)"],
    "swa_averaged.swa_update_before_optimizer_step": [
        rf"({_SWA}|averag\w*).{{0,80}}{_BEFORE}.{{0,60}}(optimi[sz]er|opt|step|update)",
        rf"update_parameters.{{0,60}}{_BEFORE}", rf"({_SWA}|averag\w*).{{0,60}}((stale|previous|old|pre[- ]step) (weights|parameters|params)|one step behind|lags?\b)"],
    "swa_averaged.bn_not_synced": [
        r"(batch[_ ]?norm\w*|\bbn\b|normali[sz]ation stat\w*|batch stat\w*).{0,80}(sync\w*|local|per[- ]rank|each rank|global|all[_ -]?reduc\w*|not shared)",
        r"sync[_ ]?batch[_ ]?norm\w*", rf"(running|batch) (mean|var\w*|stat\w*).{{0,60}}{_LOCAL}"],
    "swa_averaged.averaged_model_in_train_mode": [
        rf"({_SWA}|averag\w*|teacher|target).{{0,80}}(train(ing)?[- ]mode|\.train\(|not (in )?eval\w*|batch stat\w*)",
        r"(train(ing)? mode|eval(uation)? mode|\.eval\(\))", r"batch stat\w*.{0,60}(instead|rather|not running)"],
    "swa_averaged.averaged_buffers_not_tracked": [
        r"(use[_ ]buffers|update[_ ]bn|buffers?)",
        rf"({_SWA}|averag\w*).{{0,80}}(running (mean|var\w*|stat\w*)|bn stat\w*|batch[- ]?norm (running )?(stat\w*|buffers?)).{{0,60}}(stale|initial|never|not (updated|averaged|recomputed|tracked)|default|reset)",
        r"(running (mean|var\w*|stat\w*)|bn stat\w*|batch[_ ]?norm stat\w*).{0,60}(stale|initial|never|not (updated|averaged|recomputed)|default)"],
    "swa_averaged.swa_update_on_rank0_only": [
        rf"({_SWA}|averag\w*).{{0,80}}(rank ?0|one rank|single rank|main (process|rank)|only on|other ranks|per[- ]rank|differ\w*|not (on )?all|diverg\w*)",
        r"(rank ?0|is_main_process|main process|master).{0,60}(only|guard\w*|update\w*)", _REPL],
    # zero_redundancy
    "zero_redundancy.clip_local_shard_norm": [
        rf"{_CLIP}.{{0,80}}({_LOCAL}|shard only|own (shard|partition)|subset|own param\w*)",
        rf"(local|own|rank'?s?) (zero )?(shard|partition)\w*.{{0,60}}(norm|clip\w*)", r"(norm|clip\w*).{0,40}not (global|all[_ -]?reduc\w*)"],
    "zero_redundancy.clip_shard_norms_summed": [
        rf"{_CLIP}.{{0,80}}(sum\w*|add\w*|square\w*|sqrt|root|l2|norm of norms|combin\w*|wrong|too (large|small))",
        r"(sum|add\w*) (of )?(the )?(shard|local|partial)?\w* ?norms", r"(square|sqrt|root)\w*.{0,60}(norm|shard)",
        rf"(norm|clip\w*).{{0,60}}({_AR}).{{0,40}}(norm|wrong|sum)"],
    "zero_redundancy.clip_after_step": [
        rf"{_CLIP}.{{0,80}}(after|order\w*|too late|late|no effect|ineffective|not applied|unclipped)",
        rf"(after|following) (the )?(optimi[sz]er|opt)\.?\s?step.{{0,60}}{_CLIP}", r"unclipped"],
    "zero_redundancy.clip_per_tensor": [
        rf"{_CLIP}.{{0,80}}(per[- ](tensor|param\w*|layer)|each (tensor|param\w*|layer)|separate\w*|individual\w*|loop)",
        r"(per[- ]tensor|per[- ]param\w*|each param\w*) (norm|clip\w*)"],
    "zero_redundancy.cosine_t_max_in_epochs": [
        rf"({_SCHED}).{{0,80}}(epoch\w*|iteration\w*|per[- ](step|update|iteration)|t_max|units?|too (short|fast)|cycl\w*|period\w*|restart\w*)",
        r"t_max", rf"{_LR}.{{0,60}}(cycl\w*|oscillat\w*|climb\w*|ris\w*|goes back|too (low|small|fast)|eta_min|minimum)"],
    "zero_redundancy.scheduler_on_inner_optimizer": [
        rf"({_SCHED}|schedulers?).{{0,80}}(inner|local|wrapped|underlying|optimizer\.optim|\.optim\b|no effect|ignored|overwrit\w*|never appl\w*|not appl\w*|wrong optimi[sz]er)",
        r"(inner|local|wrapped|underlying) optimi[sz]er", rf"{_LR}.{{0,60}}(constant|never (changes|decays|annealed)|not (decay\w*|schedul\w*|updated)|overwrit\w*|fixed)"],
    "zero_redundancy.no_ddp_gradient_averaging": [
        rf"(grad\w*).{{0,80}}(not|never|no|without|missing).{{0,20}}({_AR}|averag\w*|reduc\w*)",
        rf"(no|without|missing|not wrapped (in|with)) (ddp|distributeddataparallel|gradient (sync\w*|averag\w*|all[_ -]?reduc\w*))",
        r"(ddp|distributeddataparallel).{0,60}(missing|not (used|wrapped|applied)|absent|without)", r"(local|per[- ]rank|each rank'?s?) grad\w*"],
    # focal_dense
    "focal_dense.num_pos_local": [
        rf"(num[_ ]?pos\w*|positive\w*|normali[sz]\w*|denominator|count).{{0,80}}({_LOCAL}|rank)",
        rf"(not|never|without|no|missing) {_AR}.{{0,60}}(num[_ ]?pos\w*|positive\w*|normali[sz]\w*|count)", r"reduce[_ ]mean"],
    "focal_dense.num_pos_summed_not_averaged": [
        rf"(num[_ ]?pos\w*|positive\w*|normali[sz]\w*|denominator|count).{{0,80}}(world|not (divided|averaged)|summed|sum (instead|over ranks)|\d+ ?x|w times|times too|too (large|big)|reduce[_ ]mean)",
        rf"{_AR}.{{0,60}}(not (divided|averaged)|sum\w* (instead of|not) (the )?(mean|average)|world)", r"reduce[_ ]mean"],
    "focal_dense.normalizer_ema_missing": [
        rf"(normali[sz]\w*|denominator|num[_ ]?pos\w*|loss[_ ]normali[sz]er).{{0,80}}(ema|moving average|momentum|smooth\w*|instantaneous|current|per[- ]step|raw)",
        r"(ema|moving average)\w*.{0,60}(missing|skipp\w*|not (used|applied)|normali[sz]\w*)", r"_ema_update|loss_normalizer"],
    "focal_dense.pos_mask_includes_ignored": [
        r"(ignor\w*|-1|invalid).{0,80}(positive\w*|foreground|pos[_ ]mask|count\w*|box|regression)",
        r"(pos(itive)?[_ ]mask|positive\w*|foreground).{0,80}(ignor\w*|-1|invalid|>= ?0|valid)", r"valid[_ ]mask"],
    "focal_dense.focal_alpha_swapped": [
        r"(alpha|α).{0,80}(swap\w*|revers\w*|invert\w*|wrong|1 ?- ?alpha|positive\w*|negative\w*|weight\w*|flip\w*|balanc\w*)",
        r"(class[- ]?balanc\w*|balancing) (weight|factor|term)", r"focal.{0,60}(weight\w*|alpha)"],
    "focal_dense.box_loss_on_all_anchors": [
        r"(box|bbox|regression|smooth[_ ]?l1|reg\w*)[_ ]?(loss)?.{0,80}(all|every|negative\w*|background|not (only )?positive|mask\w*|foreground)",
        r"(negative|background) anchors?.{0,60}(box|bbox|regression)"],
    "focal_dense.one_hot_wrong_slice": [
        r"one[_ -]?hot.{0,80}(slice|column|background|shift\w*|wrong|\[:, ?1:\]|\[:, ?:-1\]|off[- ]by[- ]one|index\w*)",
        r"(class|label|target)s?.{0,60}(shift\w*|off[- ]by[- ]one|misalign\w*|wrong (class|column|index))",
        r"background (column|class|index).{0,60}(wrong|kept|dropped|included)"],
    # dino_centering
    "dino_centering.center_not_all_reduced": [
        rf"{_CENTER}.{{0,80}}(local (teacher )?(outputs?|mean|statistics)|local batch (only|mean|cent\w*|outputs?)|per[- ]rank|each rank|not {_AR}|without {_AR}|no {_AR}|not (global|reduced|averaged over (the )?ranks))",
        rf"(not|never|no|without|missing) {_AR}.{{0,60}}{_CENTER}", rf"{_CENTER}.{{0,40}}differ\w* (across|between) ranks", _REPL],
    "dino_centering.center_divided_by_local_count": [
        rf"{_CENTER}.{{0,80}}(world|{_SCALE}|count|batch size|divid\w*|denominator|local (count|batch))",
        rf"(batch[_ ]center|{_AR}).{{0,60}}(not (divided|averaged)|world|local (count|batch))"],
    "dino_centering.center_updated_before_loss": [
        rf"{_CENTER}.{{0,80}}({_BEFORE}|current batch|same (step|batch)|after|order\w*)",
        rf"update[_ ]center.{{0,60}}({_BEFORE}|order\w*)"],
    "dino_centering.teacher_temp_warmup_in_iterations": [
        r"(teacher[_ ]?temp\w*|temperature).{0,80}(warm[- ]?up|schedul\w*|iteration\w*|epoch\w*|index\w*|too (early|fast|short)|wrong)",
        rf"warm[- ]?up.{{0,60}}(temperature|temp|iteration\w*|epoch\w*)"],
    "dino_centering.momentum_schedule_per_epoch": [
        rf"(momentum|ema (decay|rate)).{{0,80}}(schedul\w*|epoch\w*|iteration\w*|per[- ](step|iteration|epoch)|index\w*|wrong|cosine)",
        rf"(momentum_schedule|cosine[_ ]scheduler)"],
    "dino_centering.teacher_ema_before_optimizer_step": [
        rf"(\bema\b|moving average|teacher (ema|update|weights?)|momentum update|teacher).{{0,80}}{_BEFORE}.{{0,60}}(optimi[sz]er|opt\b|step)",
        rf"(teacher|ema).{{0,60}}(stale|previous|old|lag\w*|one step behind)"],
    "dino_centering.same_view_pairs_not_skipped": [
        r"(same[- ]view|same crop|same view|identical view|v ?== ?iq|diagonal|own view|matching view)",
        r"(view|crop)s?.{0,80}(pair\w*|skip\w*|exclud\w*|same)", r"pair\w*.{0,60}(skip\w*|exclud\w*|same|views?|crops?)"],
}

assert set(EXPECTED) == set(RUBRIC)


def right(bug_id: str, cause: str | None) -> bool:
    """Whether the first cause (lower-cased) matches one of the bug's patterns."""
    if not cause:
        return False
    text = cause.lower()
    return any(re.search(p, text) for p in RUBRIC[bug_id])
