"""The rubric of heldout10: per bug, the first cause a diagnosis should name (``EXPECTED``) and the regexes
that accept a "likely cause" line naming it (``RUBRIC``, matched lower-cased; any one suffices). Written
from what each bug is, before any run of the plugin on this set, and not changed after it.
"""
from __future__ import annotations

import re

# building blocks: the usual words for a thing
NORM = r"(normali[sz]|denominator|divis|divid|num_?pos|number of positive|positive anchor|positives|count)"
RNG = r"(random|rng|seed|generator|draw|sampl|noise|eps\b|epsilon)"
PERRANK = r"(rank|per.process|each process|each device|differ|own|local|global|broadcast|replica)"
SCHED = r"(\blr\b|learning.rate|schedul|warm.?up|cosine|lambdalr)"

EXPECTED = {
    "moco_queue.enqueue_local": "the queue is enqueued with the rank's keys only (no all-gather of the keys)",
    "moco_queue.ptr_local_batch": "the queue pointer advances by the local batch while the gathered keys are written",
    "moco_queue.no_unshuffle": "the keys are not unshuffled after the shuffled key-encoder forward",
    "moco_queue.shuffle_per_rank": "the shuffle permutation is drawn per rank instead of broadcast from rank 0",
    "moco_queue.no_shuffle_bn": "no batch shuffle for the key encoder's BatchNorm",
    "moco_queue.momentum_swapped": "the key encoder's momentum (EMA) update has m and 1 - m swapped",
    "moco_queue.labels_rank_offset": "the InfoNCE labels are offset by rank * B instead of 0 (positive at column 0)",
    "focal_numpos.numpos_local": "the loss is normalised by the rank's own num_pos, not all-reduced",
    "focal_numpos.numpos_sum_not_mean": "num_pos is all-reduced as a sum, not a mean: the loss is 1/W too small",
    "focal_numpos.clamp_before_reduce": "num_pos clamped to at least 1 per rank before the all-reduce",
    "focal_numpos.numpos_counts_ignored": "num_pos counts the ignored anchors as positives",
    "focal_numpos.label_offset": "the one-hot class targets are shifted by one (class 0 taken as background)",
    "focal_numpos.box_on_all_anchors": "the box regression loss is not masked to the positive anchors",
    "focal_numpos.focal_mean_reduction": "the focal loss uses reduction='mean' before the division by num_pos",
    "focal_numpos.alpha_swapped": "the focal alpha weights the background instead of the foreground",
    "ctc_lengths.input_lengths_padded": "the CTC input lengths are the padded length, not each utterance's output length",
    "ctc_lengths.lengths_wrong_offset": "the rank slices the lengths with the wrong offset (the first block's lengths)",
    "ctc_lengths.concat_offset": "the concatenated targets are cut at the wrong offsets",
    "ctc_lengths.mean_over_batch": "the CTC losses are averaged over the batch without dividing by the target lengths",
    "ctc_lengths.no_log_softmax": "CTCLoss gets raw logits, not log-softmax log-probabilities",
    "ctc_lengths.target_lengths_padded": "the target lengths are the padded width: padding counted as labels",
    "vae_kl_anneal.beta_per_microbatch": "the KL annealing (beta) counter advances per micro-batch, not per optimizer step",
    "vae_kl_anneal.warmup_in_samples": "the beta warmup is counted in samples instead of steps",
    "vae_kl_anneal.kld_weight_local": "the KL weight (M_N) uses the local batch size instead of the global one",
    "vae_kl_anneal.eps_per_rank": "the reparameterisation noise is drawn per rank (seeded by rank) instead of for the global batch",
    "vae_kl_anneal.eps_same_rows": "every rank takes the same (first) rows of the noise draw instead of its own block",
    "vae_kl_anneal.kld_mean_latent": "the KLD is averaged over the latent dimensions instead of summed",
    "vae_kl_anneal.logvar_as_std": "the noise is scaled by exp(log_var) instead of exp(0.5 * log_var)",
    "t5_seq2seq.labels_pad_not_ignored": "padded label positions are not set to -100: padding is trained on",
    "t5_seq2seq.decoder_inputs_unshifted": "decoder_input_ids are not shifted right (the decoder sees its own target)",
    "t5_seq2seq.shift_left": "decoder_input_ids shifted in the wrong direction (label offset)",
    "t5_seq2seq.decoder_start_eos": "the decoder start token is </s> instead of T5's pad token",
    "t5_seq2seq.token_count_local": "the token loss is normalised by the rank's own token count, not the global count",
    "t5_seq2seq.count_includes_padding": "the token-count normaliser includes the -100 padding positions",
    "t5_seq2seq.no_attention_mask": "the encoder attention mask is missing: padding attended to",
    "vit_lrd.lr_per_epoch": "the lr schedule is adjusted per epoch instead of per iteration",
    "vit_lrd.iters_per_epoch_local": "the schedule's iterations per epoch counted in local batches: warmup too long",
    "vit_lrd.layer_decay_reversed": "the layer-wise lr decay scales are reversed across layers",
    "vit_lrd.groups_from_ddp_names": "param groups built from the DDP-wrapped names ('module.' prefix): layer ids and no-decay list miss",
    "vit_lrd.decay_on_norm_bias": "weight decay applied to norm and bias parameters",
    "vit_lrd.lr_scale_ignored": "the per-group lr_scale is not applied when the lr is set",
    "vit_lrd.lr_local_batch": "the base lr is scaled by the local batch instead of the effective global batch",
    "vit_lrd.sched_before_step": "the LR scheduler is stepped before optimizer.step() (one iteration ahead)",
}

RUBRIC = {
    "moco_queue.enqueue_local": [
        r"(?=.*(queue|enqueue))(?=.*(gather|all ranks|other ranks|every rank|local|own|rank's|this rank|per.rank))",
        r"concat_all_gather"],
    "moco_queue.ptr_local_batch": [
        r"(queue.?)?(pointer|ptr)\b",
        r"(?=.*queue)(?=.*(overwrit|position|offset|index|slot|advance|batch size|wrap))"],
    "moco_queue.no_unshuffle": [
        r"unshuffl|un-shuffl|argsort|inverse perm",
        r"(?=.*(shuffl|permut|order))(?=.*(restor|undo|undone|invert|revers|not (put )?back|misalign|mismatch|pair))"],
    "moco_queue.shuffle_per_rank": [
        r"(?=.*(shuffl|permut|randperm))(?=.*" + PERRANK + r")",
        r"(?=.*" + RNG + r")(?=.*(rank|per.process|each process|broadcast))"],
    "moco_queue.no_shuffle_bn": [
        r"(?=.*shuffl)(?=.*(bn|batchnorm|batch.norm|not|missing|skip|without|no ))",
        r"(?=.*(\bbn\b|batchnorm|batch.?norm|batch statistic))(?=.*(shuffl|local|rank|per.rank|own rows|key))"],
    "moco_queue.momentum_swapped": [
        r"\bema\b|moving.average|encoder_k|momentum.encoder|momentum.update|teacher|param_k|target (network|encoder)",
        r"(?=.*key.encoder)(?=.*(update|momentum|coef|swap|weight))"],
    "moco_queue.labels_rank_offset": [
        r"(?=.*(label|target|positive))(?=.*(rank|offset|index|global|shift|arange|wrong|column))",
        r"positive.{0,20}column|column 0"],
    "focal_numpos.numpos_local": [
        r"(?=.*" + NORM + r")(?=.*(local|rank|own|all.?reduc|reduce|global|not (summed|averaged|reduced)|"
        r"per.process|world|average))"],
    "focal_numpos.numpos_sum_not_mean": [
        r"(?=.*" + NORM + r")(?=.*(world|sum|times|mean|average|scal|factor|twice|double|too (large|small)))",
        r"(?=.*(loss|grad))(?=.*(scal|factor|times|world.size|1/w|too small|smaller|halv|half))"],
    "focal_numpos.clamp_before_reduce": [
        r"clamp|max\(|at least (1|one)|zero positive|no positive|without positive|empty",
        r"(?=.*" + NORM + r")(?=.*(reduc|rank|average|mean|local|global))"],
    "focal_numpos.numpos_counts_ignored": [
        r"ignor|between.{0,20}threshold",
        r"(?=.*" + NORM + r")(?=.*(mask|label|background|-1|-2|anchor))"],
    "focal_numpos.label_offset": [
        r"(?=.*(label|class|target|one.?hot))(?=.*(offset|shift|off.by.one|index|background|column))",
        r"off.by.one"],
    "focal_numpos.box_on_all_anchors": [
        r"(?=.*(box|regression|\bl1\b|bbox|delta))(?=.*(all anchors|every anchor|mask|positive|foreground|"
        r"background|negative|unmasked))"],
    "focal_numpos.focal_mean_reduction": [
        r"reduction",
        r"(mean|averag).{0,40}(instead|rather|not).{0,20}sum|sum.{0,40}(instead|rather|not).{0,20}(mean|averag)",
        r"(divid|normali).{0,40}(twice|number of (anchors|elements))|double.{0,20}(normali|divi)"],
    "focal_numpos.alpha_swapped": [
        r"alpha|class.?balanc|focal.{0,30}(weight|balanc)",
        r"(?=.*weight)(?=.*(background|negative|foreground))"],
    "ctc_lengths.input_lengths_padded": [
        r"input.?length|output.?length|frame|time.?step|sequence.?length",
        r"(?=.*length)(?=.*padd)"],
    "ctc_lengths.lengths_wrong_offset": [
        r"(?=.*length)(?=.*(offset|slice|shard|rank|block|wrong rows|other|first|misalign|index))",
        r"(?=.*(offset|slice|shard))(?=.*(length|target))"],
    "ctc_lengths.concat_offset": [
        r"(?=.*(target|label|concat|flatten))(?=.*(offset|cumul|boundar|slice|cut|split|misalign|wrong|pad))",
        r"offset"],
    "ctc_lengths.mean_over_batch": [
        r"reduction|target.?length",
        r"(divid|normali|mean|averag).{0,40}(length|token|label)|(length|per.utterance).{0,40}(divid|normali|mean|averag)"],
    "ctc_lengths.no_log_softmax": [r"log.?softmax|log.?prob|logits|softmax"],
    "ctc_lengths.target_lengths_padded": [
        r"target.?length|label.?length",
        r"(?=.*padd)(?=.*(target|label|blank))"],
    "vae_kl_anneal.beta_per_microbatch": [
        r"\bbeta\b|anneal|kl.?(weight|coef|scale|warm)|warm.?up",
        r"(?=.*(micro|accumul))(?=.*(counter|step|schedul))"],
    "vae_kl_anneal.warmup_in_samples": [
        r"\bbeta\b|anneal|kl.?(weight|coef|scale|warm)|warm.?up"],
    "vae_kl_anneal.kld_weight_local": [
        r"kld?.?weight|m_n|kl.?(term|coef|scale)",
        r"(?=.*(\bkl|kld|kullback))(?=.*(weight|scale|coef|batch|normali|factor))"],
    "vae_kl_anneal.eps_per_rank": [
        r"(?=.*(" + RNG + r"|reparam))(?=.*" + PERRANK + r")"],
    "vae_kl_anneal.eps_same_rows": [
        r"(?=.*(" + RNG + r"|reparam))(?=.*(slice|offset|block|rows|same|first|duplicat|index|shard|rank))"],
    "vae_kl_anneal.kld_mean_latent": [
        r"kld|kl.?div|kullback|\bkl\b",
        r"(?=.*latent)(?=.*(sum|mean|averag|reduc))|reduction"],
    "vae_kl_anneal.logvar_as_std": [
        r"log.?var|\bstd\b|standard deviation|variance|exp\(|reparam|sigma"],
    "t5_seq2seq.labels_pad_not_ignored": [
        r"-100|ignore.?index",
        r"(?=.*pad)(?=.*(label|ignor|loss|mask|target))"],
    "t5_seq2seq.decoder_inputs_unshifted": [
        r"shift|decoder.?input|teacher.forc|off.by.one|causal",
        r"(?=.*(label|target))(?=.*(offset|align|copy|leak))"],
    "t5_seq2seq.shift_left": [
        r"shift|decoder.?input|teacher.forc|off.by.one",
        r"(?=.*(label|target))(?=.*(offset|align|copy|leak))"],
    "t5_seq2seq.decoder_start_eos": [
        r"decoder.?start|start.?token|\bbos\b|\beos\b|</s>|first (decoder )?token|shift|decoder.?input"],
    "t5_seq2seq.token_count_local": [
        r"(?=.*(token|label|item|num_items))(?=.*(count|number|normali|mean|averag|denominator))",
        r"(?=.*(count|normali|denominator|divid))(?=.*(local|rank|global|all.?reduc|world))"],
    "t5_seq2seq.count_includes_padding": [
        r"(?=.*(count|normali|denominator|number|divid|numel))(?=.*(pad|-100|ignor|all position|mask|token))"],
    "t5_seq2seq.no_attention_mask": [
        r"attention.?mask|(?=.*mask)(?=.*(attend|attention|encoder|pad))",
        r"(?=.*(attend|attention))(?=.*pad)"],
    "vit_lrd.lr_per_epoch": [
        r"(?=.*" + SCHED + r")(?=.*(epoch|iteration|per.?iter|per.?step|every step|unit|granular|frequen|once|"
        r"stale|constant|not updated|fraction))"],
    "vit_lrd.iters_per_epoch_local": [
        r"(?=.*(warm.?up|schedul|epoch))(?=.*(iteration|iters|len\(|loader|dataset|unit|local batch|per.epoch|"
        r"too long|slow|steps? per))"],
    "vit_lrd.layer_decay_reversed": [
        r"layer.?(wise|decay|scale|id)|lr.?scale|per.layer|depth|revers|invert"],
    "vit_lrd.groups_from_ddp_names": [
        r"param(eter)?.?group|module\.|prefix|parameter names?|layer.?id|no.?weight.?decay|lr.?scale|layer.?(decay|wise)"],
    "vit_lrd.decay_on_norm_bias": [
        r"weight.?decay|\bwd\b",
        r"(?=.*decay)(?=.*(norm|bias))"],
    "vit_lrd.lr_scale_ignored": [
        r"lr.?scale|layer.?(wise|decay|scale)|per.?group|param(eter)?.?group"],
    "vit_lrd.lr_local_batch": [
        r"(?=.*(\blr\b|learning.rate|scal))(?=.*(batch|world|global|local|rank|linear))",
        r"eff(ective)?.?batch"],
    "vit_lrd.sched_before_step": [
        r"(?=.*(schedul|sched\.step|lambdalr))(?=.*(before|order|early|off.by.one|ahead|next|call|stepped))",
        r"off.by.one|before.{0,30}optimizer"],
}


def right(bug_id: str, cause: str | None) -> bool:
    """Whether ``cause`` (a "likely cause" line) names the bug ``bug_id`` ("family.bug")."""
    if not cause:
        return False
    low = cause.lower()
    return any(re.search(p, low) for p in RUBRIC[bug_id])
