"""The rubric of heldout14: per bug, the first cause a right diagnosis names (``EXPECTED``) and the regexes
that accept it (``RUBRIC``), applied lower-cased to the diagnosis's first "likely cause" line (the location
it names removed by the caller). Written from what each bug is, before any run of the plugin on this set,
and not changed after. A diagnosis is right when any of the bug's regexes matches.
"""
from __future__ import annotations

import re

EXPECTED = {
    # muon_dist
    "muon_dist.share_not_gathered": "the Muon weights updated by the other ranks are never all-gathered/broadcast: each rank keeps stale copies (replicas diverge after the optimizer step)",
    "muon_dist.shape_scale_inverted": "the Muon update's shape scale is inverted (cols/rows instead of rows/cols): non-square matrices get a wrongly scaled update",
    "muon_dist.nesterov_dropped": "Nesterov momentum dropped: the update is the momentum buffer, not the Nesterov blend",
    "muon_dist.orthogonalised_before_momentum": "the orthogonalisation (Newton-Schulz) is applied to the gradient before the momentum instead of to the momentum",
    "muon_dist.adam_group_muon_lr": "the AdamW group (embedding, biases, head) has the wrong learning rate (Muon's)",
    "muon_dist.assignment_differs": "the round-robin assignment of matrices to ranks differs between ranks: the all-gather writes one matrix into another's slot",
    # barlow_twins
    "barlow_twins.c_not_all_reduced": "the cross-correlation matrix is not summed (all-reduced) over the ranks: each rank's loss uses its local batch only",
    "barlow_twins.c_div_local_batch": "the cross-correlation is divided by the local batch size instead of the global one (world-size times too large)",
    "barlow_twins.offdiag_scaled_twice": "the off-diagonal (redundancy) term is scaled by lambda twice",
    "barlow_twins.plain_batchnorm": "plain BatchNorm instead of SyncBatchNorm: per-rank batch statistics",
    "barlow_twins.c_reduce_without_grad": "the all-reduce of c is invisible to autograd (in-place, no gradient): the gradient is 1/world of the global one",
    "barlow_twins.aug_noise_same_per_rank": "every rank draws the same augmentation noise (same seed): the ranks' random draws are not the global batch's",
    # dit_cfg
    "dit_cfg.label_drop_per_rank": "the label-dropout (classifier-free guidance) mask is drawn per rank instead of from the global draw",
    "dit_cfg.timesteps_same_seed": "the diffusion timesteps are the same on every rank (same seed) instead of the global batch's",
    "dit_cfg.noise_same_seed": "the diffusion noise is the same on every rank (same seed) instead of the global batch's",
    "dit_cfg.null_label_class0": "dropped labels become class 0 instead of the null class",
    "dit_cfg.sampler_seed_per_rank": "the ranks' data rows overlap (sampler/permutation seeded per rank): the global batch is not split",
    "dit_cfg.noise_coef_no_sqrt": "the noising formula's noise coefficient lacks the square root",
    # two_tower
    "two_tower.gather_no_grad": "the item embeddings are all-gathered without gradient: the other ranks' negatives send no gradient back",
    "two_tower.logq_local_counts": "the logQ item frequencies are counted from the local batch only (not all-reduced)",
    "two_tower.temperature_twice": "the temperature is applied twice to the scores",
    "two_tower.labels_no_rank_offset": "the positives' labels lack the rank offset into the gathered items",
    "two_tower.lr_swapped": "the sparse and dense optimizers' learning rates are swapped",
    "two_tower.logq_sign": "the logQ correction has the wrong sign",
    # packed_lm
    "packed_lm.position_ids_not_reset": "position ids are not reset at each packed document",
    "packed_lm.mask_crosses_docs": "the attention mask crosses documents (causal over the row, not block-diagonal)",
    "packed_lm.labels_cross_docs": "labels cross document boundaries (the last token of a document predicts the next document)",
    "packed_lm.loss_local_tokens": "the loss is normalised by the local token count instead of the global one",
    "packed_lm.loss_mean_per_microbatch": "each micro-batch's loss is its own mean over the accumulation steps, not normalised by the global token count",
    "packed_lm.warmup_in_micro_steps": "the lr scheduler steps every micro-batch: warm-up counted in micro-steps",
    # pipe_tied
    "pipe_tied.tied_grad_not_allreduced": "the tied embedding / output-layer gradients are not all-reduced over the embedding group",
    "pipe_tied.tied_allreduce_wrong_group": "the tied embedding gradients are all-reduced over the wrong group (data-parallel instead of embedding)",
    "pipe_tied.tied_grad_averaged": "the tied embedding gradients are averaged instead of summed over the embedding group",
    "pipe_tied.output_init_not_synced": "the last stage's output-layer copy of the embedding is not initialised from the first stage's (initial weights differ)",
    "pipe_tied.microbatch_not_scaled": "the micro-batch losses are not divided by the number of micro-batches",
    "pipe_tied.dp_average_missing": "the data-parallel gradients are summed, not averaged over the replicas",
    # ohem_seg
    "ohem_seg.threshold_local": "the OHEM threshold / kept pixels are chosen from the rank's own pixels, not the global batch",
    "ohem_seg.batch_kept_local": "the OHEM min-kept count uses the local batch size, not the global",
    "ohem_seg.kept_count_local": "the loss is normalised by the local kept-pixel count, not the global",
    "ohem_seg.ignore_in_sort": "ignore-index pixels enter the OHEM selection and the kept count",
    "ohem_seg.prob_of_argmax": "the OHEM hardness uses the predicted class's probability, not the ground-truth class's",
    "ohem_seg.class_weights_dropped": "the class weights are missing from the pixel loss",
}

_AG = r"(all[_ -]?gather|gather|broadcast)"
_AR = r"(all[_ -]?reduc\w*|allreduc\w*)"
_LR = r"(learning[ -]rate|\blr\b)"
_TIED = r"(tied|shared|tying|tie\b|word[_ ]embedding|embedding|output[_ ]layer)"
_OHEM = (r"(threshold|ohem|hard[- ]?(example|pixel|negative)|top[- ]?k|min[_ ]kept|batch[_ ]kept|kept|sort(ed|ing)?\b|"
         r"quantile|percentile|mining|pixel (selection|sampl\w*)|select\w* .{0,20}pixels?)")
_SAME = r"(same|identical|duplicat\w*|repeat\w*|every rank|each rank|per[- ]rank|rank 0|seed\w*|rng|generator)"

RUBRIC = {
    "muon_dist.share_not_gathered": [
        rf"(never|not|missing|skipp\w*|without|no|left out) .{{0,40}}{_AG}", rf"{_AG}.{{0,60}}(missing|skipped|left out|never|not )",
        r"replicas? (diverge|differ|drift|disagree|out of sync)", r"(stale|out[- ]of[- ]sync) (copies|copy|weights|parameters|replicas?)",
        r"(shard|share|partition|owner)\w*.{0,60}(not|never) .{0,20}(gather|broadcast|sync)",
        r"(parameters?|weights?).{0,40}(differ|diverge) (across|between) (ranks|replicas)"],
    "muon_dist.shape_scale_inverted": [
        r"shape[ -]?(scale|factor|ratio)", r"(rows?/col|cols?/row|columns?/rows?|rows?/columns?|fan[_ -]?(in|out)|aspect ratio)",
        r"(update|step)s? .{0,50}scal\w* .{0,40}(factor|constant|wrong|differ|inverse|invert)", r"(invert|swap)\w* .{0,30}(scale|ratio|dimension)",
        r"non[- ]?square"],
    "muon_dist.nesterov_dropped": [r"nesterov", r"look[- ]?ahead", r"momentum (buffer )?(itself|alone|instead)",
                                   r"momentum .{0,40}(variant|formula|update rule|blend)"],
    "muon_dist.orthogonalised_before_momentum": [
        r"orthogonali[sz]\w*", r"newton[- ]?schulz", r"(order|before|after) .{0,40}momentum", r"momentum .{0,40}(order|before|after)"],
    "muon_dist.adam_group_muon_lr": [
        rf"{_LR}.{{0,80}}(adam|group|embed\w*|bias\w*|head)", rf"(adam|group|embed\w*|bias\w*|head).{{0,80}}{_LR}",
        r"param(eter)?[ _-]?group"],
    "muon_dist.assignment_differs": [
        r"(assign\w*|owner\w*|round[- ]?robin|order(ing)?|mapping|permut\w*).{0,60}(rank|differ|mismatch|inconsisten)",
        r"ranks?.{0,40}(assign\w*|owner\w*|round[- ]?robin|order(ing)?|mapping)",
        rf"{_AG}.{{0,60}}(wrong|swap\w*|mismatch\w*|different|another|other) .{{0,30}}(param|weight|matri|tensor|slot|position)",
        r"(swapped|overwritten|copied|replaced) .{0,40}(weight|param|matri|tensor)",
        r"(weight|param\w*|matri\w*|tensor).{0,40}(overwritten|swapped|replaced|copied from)"],
    "barlow_twins.c_not_all_reduced": [
        rf"(cross[- ]?correlation|\bc\b|correlation matrix).{{0,60}}(not|never|without|missing|local).{{0,30}}({_AR}|sum|reduc|aggregat|sync|rank)",
        rf"({_AR}|sum over (the )?ranks).{{0,60}}(missing|skipped|left out|never|not)",
        r"(local|per[- ]rank) (cross[- ]?correlation|correlation|statistic|batch)", r"(cross[- ]?correlation|correlation).{0,40}(local|per[- ]rank)",
        r"loss.{0,40}(local|per[- ]rank) (batch|rows|shard|data)"],
    "barlow_twins.c_div_local_batch": [
        r"(divid\w*|normali[sz]\w*|scal\w*).{0,60}(local|per[- ]rank) (batch|rows|size|count)", r"(local|per[- ]rank) batch[- ]size",
        r"world[_ -]?size (times|x|×)", r"(too large|scaled|larger) by .{0,20}(world|the number of ranks|2\b)",
        r"(global|whole) batch.{0,40}(instead|not)", r"(cross[- ]?correlation|correlation).{0,60}(scal|normali[sz]|divid)"],
    "barlow_twins.offdiag_scaled_twice": [r"off[- ]?diag", r"lambd?a?\b", r"(redundancy|decorrelation)[- ](term|reduction|penalty)"],
    "barlow_twins.plain_batchnorm": [
        r"sync[_ -]?batch[_ -]?norm|syncbn|sync[_ -]?bn", r"batch[_ -]?norm.{0,60}(local|per[- ]rank|statistic|stats|sync)",
        r"(local|per[- ]rank) (batch[- ])?(statistic|stats|mean|variance|moments)",
        rf"(batch )?(statistic|stats).{{0,40}}(local|per[- ]rank|not (synchron\w*|{_AR}|shared|global))"],
    "barlow_twins.c_reduce_without_grad": [
        rf"(autograd|gradient|backward).{{0,60}}({_AR}|collective|gather)", rf"({_AR}|collective).{{0,60}}(autograd|gradient|backward|in[- ]place|detach\w*|no[_ -]grad)",
        r"1 ?/ ?(world|2\b|w\b)", r"divided by (the )?world", r"gradients?.{0,40}(scaled|factor|smaller|too small|half|halved|0\.5)"],
    "barlow_twins.aug_noise_same_per_rank": [
        rf"{_SAME}.{{0,60}}(noise|random|augment\w*|draw\w*|view)", rf"(noise|random\w*|augment\w*|draw\w*|views?).{{0,60}}{_SAME}",
        r"(random|rng) (state|stream)", r"(input|data|batch|rows?).{0,40}(differ|mismatch|not the same|wrong)"],
    "dit_cfg.label_drop_per_rank": [
        r"(label|class|token)[- ]?(drop\w*|dropout|mask)", r"classifier[- ]free|\bcfg\b",
        r"(drop\w*|dropout|mask).{0,60}(per[- ]rank|rank[- ]seed\w*|seed\w*|random|rng|generator|draw\w*)"],
    "dit_cfg.timesteps_same_seed": [r"time ?steps?", r"\bt\b .{0,10}(draw|sampl)", r"diffusion (step|time)", r"noise level"],
    "dit_cfg.noise_same_seed": [
        rf"noise.{{0,60}}({_SAME}|draw\w*|random|sampl\w*)", rf"({_SAME}|draw\w*|random|sampl\w*).{{0,60}}noise"],
    "dit_cfg.null_label_class0": [
        r"null (class|label|token|row|embedding|index)", r"(drop\w*|dropout).{0,60}(class 0|label 0|zero|\b0\b)",
        r"(unconditional|cfg|classifier[- ]free).{0,60}(class|label|embedding|index)", r"(label|class)[- ]?(drop\w*|dropout)",
        r"(label|class) (index|embedding)"],
    "dit_cfg.sampler_seed_per_rank": [
        r"(sampler|shuffl\w*|permutation|data (order|split|shard\w*)|rows?|samples?).{0,60}(overlap\w*|duplicat\w*|same|repeat\w*|seed\w*|per[- ]rank|missing|never)",
        r"(overlap\w*|duplicat\w*).{0,40}(rows|samples|data|batch)", r"(input|data|batch|rows?).{0,40}(differ|mismatch|not the same|wrong)",
        r"distributedsampler"],
    "dit_cfg.noise_coef_no_sqrt": [
        r"sqrt|square[- ]root", r"(noise|nois(ing|ed|y)|forward process|x_?t\b|alpha|abar|schedule).{0,60}(coef\w*|scale|wrong|formula)",
        r"(coef\w*|scal\w*).{0,40}(noise|x_?t\b)", r"(noised|noisy) (input|sample|data)"],
    "two_tower.gather_no_grad": [
        rf"{_AG}.{{0,60}}(without|no|not|lose|lost|detach\w*|drop\w*|missing).{{0,20}}(grad|autograd|backward)",
        rf"(grad\w*|backward|autograd).{{0,60}}({_AG}|collective)", r"(detach\w*|no[_ -]grad).{0,40}(gather|embedding|negative|item)",
        r"(negatives?|other ranks?'?).{0,60}(no|without|not|lose|receive no) .{0,20}grad"],
    "two_tower.logq_local_counts": [
        r"log ?q\b|logq|sampling[- ](bias|probabilit\w*|correction)|(item|candidate) (frequenc|count|probabilit|popularit)\w*|frequenc\w*|popularit",
        rf"(count|histogram|bincount)\w*.{{0,60}}(local|per[- ]rank|not ({_AR}|summed|global))"],
    "two_tower.temperature_twice": [r"temperature|\btemp\b|\btau\b", r"(logits?|scores?|similarit\w*).{0,40}(scal\w*|divid\w*)"],
    "two_tower.labels_no_rank_offset": [
        r"(labels?|targets?|positives?|indices|index|offset).{0,60}(rank|offset|shift\w*|wrong|mismatch\w*)", r"ranks?.{0,40}(offset|index)",
        r"arange"],
    "two_tower.lr_swapped": [_LR, r"(sparse|dense).{0,40}(optim\w*|adam)", r"(optim\w*|adam).{0,40}(sparse|dense)", r"swap"],
    "two_tower.logq_sign": [
        r"log ?q\b|logq|sampling[- ](bias|correction)|frequenc\w*|popularit", r"correction.{0,30}sign|sign.{0,30}correction"],
    "packed_lm.position_ids_not_reset": [r"position[_ -]?(ids?|index|indices|embedding|encoding)", r"positions?.{0,40}(reset|restart|document|per doc)"],
    "packed_lm.mask_crosses_docs": [
        r"(attention|attn)[_ -]?mask", r"\bmask\b", r"block[- ]?diagonal|cu_?seq_?lens|cross[- ]document|across documents|document boundar",
        r"attend\w*.{0,40}(other|previous|earlier|neighbou?ring) (doc|sequence)"],
    "packed_lm.labels_cross_docs": [
        r"labels?", r"(target|shift).{0,40}(document|boundar|next doc)", r"-100|ignore[_ -]?index", r"(document|boundar).{0,40}(target|label|predict)"],
    "packed_lm.loss_local_tokens": [
        r"(tokens?|items?).{0,40}(count|number|normali[sz]\w*|divis\w*|divid\w*)", r"(local|per[- ]rank).{0,40}(token|count|normali[sz]|denominator|divisor)",
        r"num_items_in_batch", r"(normali[sz]\w*|denominator|divisor|divid\w*).{0,60}(local|global|rank|token)"],
    "packed_lm.loss_mean_per_microbatch": [
        r"micro[- ]?batch", r"accumulat\w*.{0,60}(mean|average|normali[sz]|scal|divid|token)",
        r"(mean|average|normali[sz]\w*|divid\w*|token).{0,60}accumulat", r"per[- ]micro"],
    "packed_lm.warmup_in_micro_steps": [r"schedul", r"warm[- ]?up", rf"{_LR}.{{0,60}}(step|advance|too (fast|early)|schedule)"],
    "pipe_tied.tied_grad_not_allreduced": [
        rf"{_TIED}.{{0,80}}({_AR}|sync\w*|sum\w*|grad\w*|drift|copies|copy|differ)", r"embedding group",
        r"(tied|shared) (weight|parameter|embedding)"],
    "pipe_tied.tied_allreduce_wrong_group": [
        rf"{_TIED}.{{0,80}}(group|{_AR}|sync\w*|grad\w*)", r"(wrong|data[- ]parallel|\bdp\b|embedding|process) group"],
    "pipe_tied.tied_grad_averaged": [
        rf"{_TIED}.{{0,80}}(averag\w*|divid\w*|halv\w*|half|scal\w*|sum\w*|{_AR}|grad\w*)", r"(averag\w*|mean) instead of (a )?(sum|summ)"],
    "pipe_tied.output_init_not_synced": [
        r"(init\w*|start\w*|step 0|before (the first|any) step).{0,60}(output|embedding|tied|shared|copy|copies|differ|sync|broadcast|equal)",
        r"(output[_ ]layer|tied|shared|embedding|copy|copies).{0,60}(init\w*|start\w*|differ|not (synced|equal|the same))",
        r"(not|never) (broadcast|synchroni[sz]ed) .{0,30}(init|start)"],
    "pipe_tied.microbatch_not_scaled": [
        r"micro[- ]?batch", r"accumulat\w*.{0,60}(scal|divid|mean|average|normali)", r"(divid\w*|scal\w*).{0,40}(number of )?(micro|accumulation)",
        r"gradients?.{0,40}(4x|4 ?times|×4|x4|factor (of )?4)"],
    "pipe_tied.dp_average_missing": [
        rf"(data[- ]parallel|\bdp\b|replica\w*).{{0,60}}(averag\w*|divid\w*|mean|sum\w*|{_AR}|scal\w*)",
        r"(averag\w*|divid\w*|mean).{0,60}(data[- ]parallel|\bdp\b|replica|world)", r"(sum|summed) instead of (averag|mean)",
        r"gradients?.{0,40}(2x|2 ?times|twice|doubled|×2|x2|factor (of )?2)", r"(not|never|without) (divided|averaged)"],
    "ohem_seg.threshold_local": [_OHEM, r"(local|per[- ]rank).{0,40}(select\w*|threshold|statistic|sort\w*|pixels)"],
    "ohem_seg.batch_kept_local": [_OHEM],
    "ohem_seg.kept_count_local": [
        r"(kept|selected|valid|pixel)s?.{0,40}(count|number|normali[sz]\w*|denominator|divisor)",
        r"(normali[sz]\w*|denominator|divisor|divid\w*|count).{0,60}(local|per[- ]rank|global|kept|pixels)",
        r"(local|per[- ]rank) (count|normali[sz]\w*|denominator|mean)"],
    "ohem_seg.ignore_in_sort": [r"ignore", r"(void|unlabel\w*|invalid) pixels?", r"valid (mask|pixels?)"],
    "ohem_seg.prob_of_argmax": [
        r"argmax|max(imum)? (softmax|prob\w*)|predicted class|ground[- ]truth (class|label|prob\w*)|\bgt\b class|target class",
        r"(hardness|confidence|probabilit\w*).{0,60}(wrong|class|label)"],
    "ohem_seg.class_weights_dropped": [
        r"class[_ -]?weight", r"(weight|weighting).{0,40}(class|loss|cross[- ]entropy|pixel)", r"(cross[- ]entropy|loss).{0,40}weight"],
}


def right(bug_id: str, cause: str | None) -> bool:
    """True when ``cause`` (a first likely-cause line) matches one of ``bug_id``'s regexes."""
    if not cause:
        return False
    low = cause.lower()
    return any(re.search(rx, low) for rx in RUBRIC[bug_id])
