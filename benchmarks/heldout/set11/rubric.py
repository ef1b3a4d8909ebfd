"""The expected first cause of every heldout10 bug, and the regexes that accept a diagnosis naming it.

Written from what each bug is (the families' ``BUGS``), before any run of the plugin on this set, and not
changed after. ``right(bug_id, cause)`` applies the bug's regexes to the lower-cased "likely cause" line
(the location it names already removed by the caller); any match accepts. The regexes take the usual
wordings of the mechanism (what is wrong and where), not one phrase; where a bug is a pure scale of the
loss, a diagnosis naming that scale and its factor is accepted too.
"""
from __future__ import annotations

import re

_RANK = r"(rank|per[- ]rank|local|own|differ|global|slice|shard)"
_LOSS_SCALE = r"(loss|gradient)s?.{0,50}(scaled?|factor|multiplied|divided)"
_COUNT = r"(token|label|item|target)s?.{0,80}(count|number|normali[sz]|divid|denominator|num_items)"
_BETA = [r"\bbeta\b", r"kl[- ]?(weight|coefficient|anneal|warm|term weight|scale)", r"anneal", r"warm[- ]?up"]
_LLRD = (r"(layer[- ]?wise|llrd|lr[_ ]scale|layer[ _]decay|per[- ]layer|param(eter)?[_ ]groups?|layer[ _]ids?|"
         r"(lr|learning rate)s? (of|per|for) (each |the )?(group|layer))")

EXPECTED = {
    "moco_queue.enqueue_local": "the queue of negatives is refreshed with the rank's own keys, not the keys gathered from every rank",
    "moco_queue.ptr_local": "the queue pointer advances by the local batch size while the gathered keys are written",
    "moco_queue.shuffle_per_rank": "the batch-shuffle permutation is drawn per rank instead of shared (broadcast)",
    "moco_queue.unshuffle_wrong": "the keys are unshuffled with the permutation instead of its inverse (argsort)",
    "moco_queue.momentum_swapped": "the key encoder's momentum (EMA) update has m and 1 - m swapped",
    "moco_queue.enqueue_before": "the keys are enqueued before the negative logits are computed",
    "moco_queue.normalize_dim0": "the queries are normalised over the batch dimension (dim 0)",
    "retina_focal.num_pos_local": "the loss normaliser is the rank's own positive-anchor count, not reduced over ranks",
    "retina_focal.num_pos_summed": "the positive count is all-reduced as a sum instead of a mean (loss scaled by 1/W)",
    "retina_focal.ignore_as_negative": "ignored anchors (between IoU thresholds) are not masked out of the focal loss",
    "retina_focal.alpha_swapped": "the focal loss's alpha weights positives and negatives the wrong way round",
    "retina_focal.bbox_all_anchors": "the box loss is taken over all anchors instead of the foreground ones",
    "retina_focal.label_offset": "the one-hot class targets are shifted by one (wrong background column dropped)",
    "retina_focal.box_loss_mean": "the box loss uses a mean reduction instead of a sum over the positive count",
    "ctc_asr.lengths_offset": "the input lengths are sliced at the wrong (rank 0's) offset",
    "ctc_asr.input_lengths_full": "the CTC input lengths count the padded frames",
    "ctc_asr.no_log_softmax": "the CTC loss gets raw logits instead of log_softmax outputs",
    "ctc_asr.reduction_sum": "the CTC reduction is 'sum' instead of 'mean'",
    "ctc_asr.blank_last": "the CTC blank index is wrong",
    "ctc_asr.out_lengths_floor": "the conv output lengths are computed wrong (off by one frame)",
    "ctc_asr.token_mean_local": "the CTC loss is normalised by the rank's target-token count",
    "ctc_asr.specaug_rank_seed": "the time masks are drawn per rank (own seed) instead of sliced from the global draw",
    "vae_anneal.eps_rank_seed": "the reparameterisation noise is drawn per rank (own seed) instead of sliced from the global draw",
    "vae_anneal.beta_sample_units": "the KL annealing counter counts samples, not optimizer steps (beta wrong)",
    "vae_anneal.warmup_len_local": "the KL warm-up length uses the per-rank batch (beta wrong)",
    "vae_anneal.beta_off_by_one": "beta is computed one step ahead (beta wrong)",
    "vae_anneal.kld_sum_batch": "the KL term is summed over the batch while the reconstruction is averaged",
    "vae_anneal.sum_reduction": "the loss is summed over the rank's rows instead of averaged",
    "vae_anneal.std_not_half": "the reparameterisation uses exp(logvar) instead of exp(0.5 logvar) as the std",
    "t5_seq2seq.no_shift": "decoder_input_ids are not shifted right",
    "t5_seq2seq.pad_not_masked": "label padding is not -100, so pad tokens enter the loss",
    "t5_seq2seq.start_token_eos": "the decoder start token is wrong (EOS instead of pad)",
    "t5_seq2seq.count_local": "the loss is divided by the rank's token count, not the global one",
    "t5_seq2seq.count_includes_pad": "the token count includes the padded (-100) positions",
    "t5_seq2seq.enc_mask_missing": "the encoder attention mask is missing",
    "t5_seq2seq.double_shift": "the labels are shifted twice (loss misaligned by one position)",
    "vit_llrd.lr_world_missing": "the lr scaling's effective batch size omits the world size",
    "vit_llrd.decay_reversed": "the layer-wise lr decay is reversed",
    "vit_llrd.wd_on_all": "weight decay is applied to norms, biases and embeddings",
    "vit_llrd.sched_int_epoch": "the lr schedule is evaluated at integer epochs, not per iteration",
    "vit_llrd.groups_from_ddp": "the parameter groups are built from the DDP-wrapped names ('module.'), so layer ids and no-decay names miss",
    "vit_llrd.num_layers_off": "the layer count of the lr decay is off by one",
    "vit_llrd.lr_scale_dropped": "the schedule drops each group's lr_scale",
}

RUBRIC: dict[str, list[str]] = {
    "moco_queue.enqueue_local": [r"queue.{0,80}(rank|local|gather|own|only|replica|differ|diverg)",
                                 r"(concat_all_gather|all[-_ ]?gather).{0,60}(key|queue|enqueue)",
                                 r"keys?.{0,40}(not|without|never|missing).{0,20}gather"],
    "moco_queue.ptr_local": [r"queue[_ ]?ptr", r"pointer", r"\bptr\b",
                             r"queue.{0,60}(overlap|overwrit|index|offset|advance|position|slot)"],
    "moco_queue.shuffle_per_rank": [r"(shuffle|permutation|randperm|\bperm\b).{0,80}(rank|broadcast|shared|differ|own|seed|generator|random)",
                                    r"(rank|seed|generator|random).{0,60}(shuffle|permutation|randperm)"],
    "moco_queue.unshuffle_wrong": [r"unshuffle", r"(argsort|inverse).{0,60}(perm|shuffle|index)",
                                   r"(shuffle|permutation).{0,60}(undo|undone|inverse|restor|argsort|revers|order)"],
    "moco_queue.momentum_swapped": [r"(\bema\b|moving average|momentum (update|encoder|copy|coefficient)|key encoder|teacher update)",
                                    r"1 ?- ?m\b", r"1 ?- ?momentum",
                                    r"(updated|changed|written|modified) (in[- ]place )?outside (of )?(the )?optimi[sz]er"],
    "moco_queue.enqueue_before": [r"(enqueue|queue).{0,80}(before|order|own (key|positive)|current (key|batch)|positive)",
                                  r"(positive|own key).{0,60}(negative|queue)"],
    "moco_queue.normalize_dim0": [r"normali[sz]\w*.{0,80}(dim|batch|rows|sample|axis)", r"dim ?=? ?0",
                                  r"(normali|l2).{0,60}(over|across) (the )?(local |rank'?s? )?(batch|rows|samples)"],
    "retina_focal.num_pos_local": [
        r"(num_pos|positive|foreground|normali[sz]er|avg_factor|count|denominator).{0,100}"
        r"(local|this rank|rank'?s|per[- ]rank|not (all[- ]?)?reduced|without (an? )?(all[- ]?)?reduce|reduce_mean|across ranks|over ranks|global)",
        r"(local|per[- ]rank|rank'?s (own )?).{0,40}(num_pos|positive|foreground|count|normali[sz]er|denominator)"],
    "retina_focal.num_pos_summed": [
        r"(num_pos|positive|foreground|normali[sz]er|avg_factor|count|denominator).{0,100}"
        r"(sum|world[ _]size|reduce_mean|mean over ranks|averag|divid|twice|double)",
        r"(scale|factor|divided|multiplied|ratio).{0,60}(world[ _]size|number of ranks|\bw\b|1/2|0\.5|half)",
        r"(world[ _]size|number of ranks).{0,60}(scale|factor|divid|multipl)"],
    "retina_focal.ignore_as_negative": [r"ignor", r"(between|iou) thresholds?", r"-2\b",
                                        r"(mask|valid).{0,60}(anchor|focal|classification)",
                                        r"anchors?.{0,60}(treated|counted|kept|included).{0,30}(background|negative)"],
    "retina_focal.alpha_swapped": [r"alpha", r"(class|positive|negative)[- ]weight",
                                   r"weight(ing)?.{0,60}(positive|negative|foreground|background)"],
    "retina_focal.bbox_all_anchors": [
        r"(box|bbox|regression|l1|smooth).{0,80}(all anchors|every anchor|background|negative|not masked|unmasked|mask|foreground|positive)",
        r"(background|negative) anchors?.{0,60}(box|bbox|regression)"],
    "retina_focal.label_offset": [
        r"(label|class|target|one[- ]hot).{0,80}(offset|shift|off[- ]by[- ]one|column|index|wrong class|background (index|column))",
        r"off[- ]by[- ]one"],
    "retina_focal.box_loss_mean": [r"(box|bbox|regression|l1).{0,80}(mean|average|reduction|normali[sz]|divid|num_pos|count|avg_factor|sum)",
                                   r"reduction.{0,40}(mean|sum)"],
    "ctc_asr.lengths_offset": [r"lengths?.{0,80}(offset|slice|sliced|rank 0|first rank|wrong rows|misalign|other rank|index|shard)",
                               r"(slice|offset|shard).{0,60}lengths?"],
    "ctc_asr.input_lengths_full": [r"lengths?.{0,80}(pad|full|max|all frames|constant|every utterance|same)",
                                   r"pad(ding|ded)? (frames?|positions?).{0,60}(count|includ|loss)"],
    "ctc_asr.no_log_softmax": [r"log[_ ]?softmax", r"(raw|unnormali[sz]ed) (logits|scores|outputs)", r"log[- ]?prob"],
    "ctc_asr.reduction_sum": [r"reduction", r"(sum|summed).{0,60}(instead|rather|mean|average)", r"(mean|average).{0,60}\bsum",
                              r"(target length|utterances?).{0,60}(divid|normali[sz]|mean|averag)", _LOSS_SCALE],
    "ctc_asr.blank_last": [r"blank"],
    "ctc_asr.out_lengths_floor": [r"(output|out|frame|conv|feat\w*)[_ ]lengths?",
                                  r"lengths?.{0,80}(conv|stride|floor|round|off[- ]by[- ]one|frame|downsampl)", r"off[- ]by[- ]one"],
    "ctc_asr.token_mean_local": [_COUNT + r".{0,80}(rank|local|global|all[- ]?reduce)",
                                 r"(normali[sz]er|denominator|divid\w*).{0,80}(rank|local|token|target length)",
                                 r"(per[- ]rank|local|rank'?s).{0,60}(token|count|mean|normali[sz]er|denominator)"],
    "ctc_asr.specaug_rank_seed": [r"(mask|specaugment|spec ?aug|augment|random|draw|noise|seed|generator|rng).{0,80}" + _RANK,
                                  r"rank[- ]?(dependent|specific|own|seeded).{0,60}(random|draw|mask|seed|generator|rng)",
                                  r"(seed|generator|\brng\b)"],
    "vae_anneal.eps_rank_seed": [r"(eps|epsilon|noise|random|draw|sample|seed|generator|rng|reparameteri[sz]).{0,80}" + _RANK,
                                 r"(seed|generator|\brng\b)", r"rank[- ]dependent"],
    "vae_anneal.beta_sample_units": _BETA,
    "vae_anneal.warmup_len_local": _BETA,
    "vae_anneal.beta_off_by_one": _BETA,
    "vae_anneal.kld_sum_batch": [r"(\bkl\b|kld|kullback|divergence).{0,80}(sum|mean|reduction|batch|scale|normali[sz]|divid|averag)",
                                 r"(sum|mean|reduction).{0,60}(\bkl\b|kld)"],
    "vae_anneal.sum_reduction": [r"(sum|summed|reduction).{0,80}(mean|averag|instead|rows|batch|sample)", r"(mean|averag).{0,60}\bsum",
                                 _LOSS_SCALE, r"(batch size|local batch|rows).{0,60}(scale|factor|normali[sz]|divid)"],
    "vae_anneal.std_not_half": [r"(\bstd\b|standard deviation|logvar|log[- ]?var|variance|reparameteri[sz]|exp\(|0\.5|half)"],
    "t5_seq2seq.no_shift": [r"shift", r"decoder[_ ]input", r"(label|target)s?.{0,60}(leak|decoder|teacher forcing|offset|align)"],
    "t5_seq2seq.pad_not_masked": [r"-100", r"(pad|padding).{0,80}(label|loss|mask|ignore|count|token|train)", r"ignore[_ ]index",
                                  r"(label|target)s?.{0,60}(pad|padding)"],
    "t5_seq2seq.start_token_eos": [r"(decoder[_ ]start|start token|\bbos\b|first decoder token|\beos\b)", r"shift"],
    "t5_seq2seq.count_local": [_COUNT, r"(normali[sz]er|denominator|num_items_in_batch)",
                               r"(per[- ]rank|local|rank'?s).{0,60}(mean|average|count|tokens)"],
    "t5_seq2seq.count_includes_pad": [_COUNT, r"(normali[sz]er|denominator|num_items_in_batch)",
                                      r"(pad|padding|-100).{0,80}(count|normali[sz]|denominator|divid|numel)", r"numel"],
    "t5_seq2seq.enc_mask_missing": [r"mask", r"(pad|padding).{0,60}(attend|attention|encoder|source)"],
    "t5_seq2seq.double_shift": [r"shift", r"(label|target|logit)s?.{0,80}(offset|align|misalign|off[- ]by[- ]one|one position)",
                                r"off[- ]by[- ]one"],
    "vit_llrd.lr_world_missing": [r"(\blr\b|learning rate|step size).{0,100}(world[ _]size|scal|batch|rank|factor|smaller|larger|half|double)",
                                  r"(world[ _]size|effective batch|eff_batch|global batch|number of ranks).{0,80}(\blr\b|learning rate)",
                                  r"linear scaling"],
    "vit_llrd.decay_reversed": [_LLRD, r"(\blr\b|learning rate)s?.{0,60}(group|layer|depth|block|head)"],
    "vit_llrd.wd_on_all": [r"weight[_ ]decay", r"\bwd\b", r"(no[_ ]decay|decay).{0,60}(norm|bias|pos_embed|cls_token|1-?d)"],
    "vit_llrd.sched_int_epoch": [r"(schedul|warm[- ]?up|cosine|lr_sched|adjust_learning_rate)",
                                 r"(\blr\b|learning rate).{0,80}(step|iteration|epoch|fraction|constant|held)"],
    "vit_llrd.groups_from_ddp": [r"(module\.|prefix|\bddp\b|wrapper|named_parameters)", _LLRD, r"weight[_ ]decay"],
    "vit_llrd.num_layers_off": [_LLRD, r"num_layers", r"off[- ]by[- ]one"],
    "vit_llrd.lr_scale_dropped": [_LLRD, r"(per[- ]group|every group|same lr|each group)", r"schedul"],
}

assert set(RUBRIC) == set(EXPECTED)


def right(bug_id: str, cause: str | None) -> bool:
    """Whether ``cause`` (a likely-cause line) names the bug ``family.bug``."""
    if not cause:
        return False
    low = cause.lower()
    return any(re.search(p, low) for p in RUBRIC[bug_id])
