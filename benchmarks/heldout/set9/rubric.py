"""Per bug of heldout9: the first cause a right diagnosis names (``EXPECTED``) and the regexes that accept
it (``RUBRIC``), matched against the lower-cased "likely cause" line. Written from what each bug is,
before any run of the plugin on this set; not changed after.

A right cause names the mechanism, in any of its usual wordings: for a random draw made per rank where
the one-device run draws for the global batch, the random state / generator / seed / draw; for a
normaliser or reduction, the normalisation / reduction / scale; for a gather, the gather or its missing
autograd / all-reduce; for a wrong target, the targets or labels; for a changed loss formula, the loss's
formula or the term that changed.
"""
from __future__ import annotations

import re

RANDOM = r"random|\brng\b|generator|seed|\bdraw|drawn"
LOSS_FORMULA = r"loss('s)? (formula|function|terms?|definition)|criterion|objective"
TARGETS = r"target|label"

EXPECTED = {
    # mlm_mask
    "mlm_mask.mask_local_draw": "the masking is drawn per rank (same seed for the rank's rows) instead of sliced from the global batch's draw",
    "mlm_mask.random_overwrites_mask": "the random-word replacement overwrites tokens already replaced by [MASK] (the inputs' corruption differs)",
    "mlm_mask.labels_not_ignored": "labels of unselected tokens are not -100: the loss counts every token",
    "mlm_mask.labels_after_masking": "labels cloned after masking: the targets are the corrupted ids",
    "mlm_mask.special_not_excluded": "special tokens / padding are not excluded from masking",
    "mlm_mask.local_token_mean": "the loss is normalised by the rank's labelled-token count, not the global count",
    # mae_mask
    "mae_mask.noise_local_draw": "the masking noise is drawn per rank (same seed) instead of sliced from the global draw",
    "mae_mask.restore_is_shuffle": "ids_restore is the shuffle itself: the unshuffle permutation is wrong",
    "mae_mask.loss_on_visible": "the loss is taken over the visible patches instead of the removed ones (mask inverted)",
    "mae_mask.norm_pix_batch_dim": "the target normalisation uses statistics over the rank's batch rows instead of each patch",
    "mae_mask.keep_ratio_swapped": "the keep ratio is the mask ratio: the number of kept patches is wrong",
    "mae_mask.pos_after_masking": "the positional embedding is added after the masking (wrong positions for the kept patches)",
    "mae_mask.mask_not_restored": "the binary mask is not unshuffled: the loss is over the wrong patches",
    # mixup_ddp
    "mixup_ddp.lam_per_rank": "each rank draws its own mixing lam (seed + rank) instead of the shared draw",
    "mixup_ddp.flip_local": "mixing after sharding: the partner rows are the flip of the rank's rows, not of the global batch",
    "mixup_ddp.target_not_flipped": "the soft targets are not mixed with the flipped labels",
    "mixup_ddp.lam_swapped": "inputs mixed with 1 - lam while targets use lam",
    "mixup_ddp.double_smoothing": "label smoothing applied twice (CrossEntropyLoss with label_smoothing on soft targets)",
    "mixup_ddp.cutmix_lam_uncorrected": "CutMix target lam not corrected to the box area",
    # ppo_gae
    "ppo_gae.adv_local_norm": "advantages normalised with the rank's minibatch statistics instead of the global minibatch's",
    "ppo_gae.gae_ignores_done": "GAE ignores done flags (bootstraps across episode ends)",
    "ppo_gae.gae_value_offset": "GAE's next value is off by one step (values[t] instead of values[t+1])",
    "ppo_gae.returns_from_normalized": "returns computed from normalised advantages: wrong value targets",
    "ppo_gae.ratio_inverted": "the probability ratio is inverted (old minus new log-prob)",
    "ppo_gae.clip_min": "the clipped surrogate takes min instead of max (clipping objective wrong)",
    "ppo_gae.perm_per_rank": "the minibatch permutation is drawn per rank (seed + rank): the minibatches' rows / order differ",
    # simclr_ntxent
    "simclr_ntxent.gather_no_grad": "features all-gathered without autograd: other ranks' terms send no gradient back",
    "simclr_ntxent.gather_bwd_no_reduce": "the gather's backward does not all-reduce the gradient before taking the rank's slice",
    "simclr_ntxent.labels_no_offset": "positive labels lack the rank * B offset into the gathered batch",
    "simclr_ntxent.diag_not_masked": "self-similarities not masked out of the logits",
    "simclr_ntxent.no_l2_normalize": "projections not L2-normalised before the similarities",
    "simclr_ntxent.views_local_draw": "the augmentations are drawn per rank (same seed) instead of sliced from the global draw",
    "simclr_ntxent.loss_sum": "the loss is summed over the rank's rows instead of averaged (reduction)",
}

RUBRIC = {
    # mlm_mask
    "mlm_mask.mask_local_draw": [RANDOM, r"mask(ing|s)? (is |are )?(drawn|differ|chosen|per rank|rank-dependent)"],
    "mlm_mask.random_overwrites_mask": [r"random (word|token|replacement)", r"\[mask\]|mask token", r"replac",
                                        r"corrupt", r"input(s)? (differ|token|ids)|input ids"],
    "mlm_mask.labels_not_ignored": [TARGETS, r"ignore_index|-100|ignored"],
    "mlm_mask.labels_after_masking": [TARGETS],
    "mlm_mask.special_not_excluded": [r"special|padding|\bpad\b", r"mask(ing|ed)? (probabilit|position|token)",
                                      TARGETS],
    "mlm_mask.local_token_mean": [r"normali[sz]|denominator|divid|reduction", r"token count|count of|number of",
                                  r"global (count|mean|number)|local (count|mean)|per[- ]rank mean|rank's (own )?mean",
                                  r"num_items"],
    # mae_mask
    "mae_mask.noise_local_draw": [RANDOM, r"noise", r"mask(ing|s)? (is |are )?(drawn|differ|chosen|per rank|rank-dependent)"],
    "mae_mask.restore_is_shuffle": [r"restore|unshuffl|shuffl|permut|argsort", r"gather(ed)? (index|indices)|\bindex|indices"],
    "mae_mask.loss_on_visible": [r"\bmask", r"visible|removed|kept", LOSS_FORMULA, r"which (patches|rows|tokens|positions)"],
    "mae_mask.norm_pix_batch_dim": [r"normali[sz]|standardi[sz]", r"statistic", r"\bdim(ension)?\b",
                                    r"over the (rank's |local )?(batch|rows)|across (the )?(batch|rows)|batch[- ]dependent",
                                    r"\bvar(iance)?\b|mean and (std|var)", TARGETS],
    "mae_mask.keep_ratio_swapped": [r"ratio|len_keep|\bkeep|kept", r"\bmask", r"number of (patches|tokens)|fraction"],
    "mae_mask.pos_after_masking": [r"position|pos_embed|embedding"],
    "mae_mask.mask_not_restored": [r"\bmask", r"restore|unshuffl|permut", r"index|indices"],
    # mixup_ddp
    "mixup_ddp.lam_per_rank": [RANDOM, r"\blam\b|lambda|mix(ing|up)? (coefficient|weight|ratio|factor)"],
    "mixup_ddp.flip_local": [r"flip|partner|pair", r"mix(ed|ing|up)? (after|before|within|per|across|over)",
                             r"global batch|whole batch|rank's (own )?rows|other ranks' rows", r"shard"],
    "mixup_ddp.target_not_flipped": [TARGETS, r"soft|one[-_ ]hot"],
    "mixup_ddp.lam_swapped": [r"\blam\b|lambda", r"mix(ing|up)? (coefficient|weight|ratio|factor)", r"swap", r"input(s)? (differ|mix)"],
    "mixup_ddp.double_smoothing": [r"smooth", TARGETS, LOSS_FORMULA],
    "mixup_ddp.cutmix_lam_uncorrected": [r"\blam\b|lambda", r"area|box|bbox", r"cutmix", TARGETS],
    # ppo_gae
    "ppo_gae.adv_local_norm": [r"normali[sz]|standardi[sz]|whiten", r"statistic", r"mean and (std|var)|\bstd\b",
                               r"advantage"],
    "ppo_gae.gae_ignores_done": [r"done|terminal|episode", r"\bgae\b|advantage", r"bootstrap", r"return"],
    "ppo_gae.gae_value_offset": [r"\bgae\b|advantage", r"bootstrap|next value", r"off[- ]by[- ]one|offset|shift",
                                 r"return"],
    "ppo_gae.returns_from_normalized": [r"return", r"value (target|loss)", r"normali[sz]", r"advantage", TARGETS],
    "ppo_gae.ratio_inverted": [r"ratio", r"log[- _]?prob", r"sign|invert|negat", r"surrogate", LOSS_FORMULA],
    "ppo_gae.clip_min": [r"clip", r"\bmin\b|\bmax\b|minimum|maximum", r"surrogate", LOSS_FORMULA],
    "ppo_gae.perm_per_rank": [RANDOM, r"permut|shuffl", r"\border\b|sampler|minibatch|mini-batch",
                              r"rows? (differ|fed|seen)|different rows|other rows"],
    # simclr_ntxent
    "simclr_ntxent.gather_no_grad": [r"gather", r"autograd|detach|no[_ ]grad|without (a )?grad",
                                     r"all[-_ ]?reduce", r"backward", r"other ranks'? (terms|rows|features|outputs|loss)"],
    "simclr_ntxent.gather_bwd_no_reduce": [r"gather", r"autograd|detach", r"all[-_ ]?reduce", r"backward",
                                           r"other ranks'? (terms|rows|features|outputs|loss|gradients?)"],
    "simclr_ntxent.labels_no_offset": [TARGETS, r"offset", r"\bindex|indices", r"positive"],
    "simclr_ntxent.diag_not_masked": [r"diag", r"self[- ]?similar", r"\bmask", r"logit", LOSS_FORMULA],
    "simclr_ntxent.no_l2_normalize": [r"normali[sz]", r"\bl2\b", r"cosine", r"unit (norm|length|vector)",
                                      LOSS_FORMULA],
    "simclr_ntxent.views_local_draw": [RANDOM, r"augment", r"noise|dropout mask"],
    "simclr_ntxent.loss_sum": [r"reduction", r"\bsum|summed", r"scal(e|ed|ing)|factor|multiple|times",
                               r"normali[sz]|divid|averag|\bmean\b"],
}


def right(bug_id: str, cause: str | None) -> bool:
    """Whether the first likely-cause line ``cause`` names bug ``bug_id`` (family.bug)."""
    if not cause:
        return False
    low = cause.lower()
    return any(re.search(p, low) for p in RUBRIC.get(bug_id, []))
