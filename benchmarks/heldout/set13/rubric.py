"""The rubric of heldout13, written from what each bug is before the plugin was first run on the set:
per bug the expected first cause (``EXPECTED``) and regexes (``RUBRIC``), any of which, found in the
lower-cased "likely cause" line, accepts the diagnosis as naming the bug.
"""
from __future__ import annotations

import re

# Wordings shared by several bugs.
RANDOM_PER_RANK = (r"(noise|random|rng|generator|seed|draw|sampl|jitter|latent)\w*.{0,80}(per[- ]rank|each rank|every rank|"
                   r"differ\w* (across|between|on) (the )?ranks|rank[- ](dependent|specific|local|own)|not (the same|shared|synchron))"
                   r"|(per[- ]rank|each rank'?s?|every rank'?s?|rank[- ](dependent|specific|local)) .{0,40}(noise|random|rng|generator|seed|draw|sampl|jitter|latent)")
NO_REDUCE = (r"(not|never|missing|without|no|forgot\w*|skipp?\w*) .{0,40}(all[- ]?reduc|synchroni[sz]|averag|sync)"
             r"|(all[- ]?reduc|synchroni[sz]|sync)\w* .{0,30}(missing|skipped|forgotten|absent)|local (gradient|grad)"
             r"|(rank'?s? own|unsynchroni[sz]ed|unreduced|un-reduced) (gradient|grad)")
LR_WORLD = (r"(learning rate|\blr\b).{0,80}(world[ _]size|number of (ranks|processes|gpus)|scal\w* by (the )?(world|ranks|\d))"
            r"|(world[ _]size|number of ranks).{0,60}(learning rate|\blr\b)|lr (too|\d+x) (large|big|high)")
DIVISOR = (r"(divid|normali[sz]|scal|averag)\w* .{0,60}(local|per[- ]rank|rank'?s?|world[ _]size|batch size|global)"
           r"|(local|per[- ]rank) (batch|sample|token)s? (size|count)|(world[ _]size|\d+x|factor of \d).{0,40}(larger|smaller|too|gradient)"
           r"|missing .{0,20}(division|divide)|not divided")
SUM_MEAN = (r"(reduction|sum\b|summed|\bmean\b|averag).{0,60}(sum|mean|averag)|(sum|summed) instead of (the )?(mean|averag)"
            r"|(mean|averag)\w* instead of (the )?sum|loss (scale|scaling|normali[sz])")
ZERO_GRAD = (r"zero_grad|accumulat\w* .{0,40}(gradient|grad)|(gradient|grad)s? (accumulat|not (zeroed|cleared|reset)|left over|stale|leak)"
             r"|not (zeroed|cleared|reset)")
WARMUP = r"warm[- ]?up|(schedule|scheduler|lr)\w* .{0,60}(off[- ]by[- ]one|one step|shift|late|early|zero)|off[- ]by[- ]one|first step .{0,30}(lr|learning rate) (of )?0"
OPT_MATH = (r"optimi[sz]er\w*.{0,60}(update|step|state|math|rule|formula|moment|statistic|implement)"
            r"|(update|step) (rule|formula|direction)|optimi[sz]er (step|update) differ")

EXPECTED = {
    "dp_sgd.noise_every_rank": "the DP noise is drawn and added on every rank (seeded per rank) instead of once for the global batch",
    "dp_sgd.clip_summed_grad": "clipping of the summed gradient instead of per-sample clipping",
    "dp_sgd.local_batch_divisor": "averaging: divided by the local batch and all-reduced without dividing by the world size",
    "dp_sgd.no_all_reduce": "the gradients set by hand are never all-reduced",
    "dp_sgd.per_layer_clip": "per-layer clipping instead of one per-sample norm over all parameters",
    "dp_sgd.noise_std_no_clip": "the noise std misses the max_grad_norm factor",
    "lion_adafactor.af_row_col_swapped": "Adafactor's factored row/column statistics swapped",
    "lion_adafactor.warmup_from_zero": "the lr warm-up is one step late (counted from 0)",
    "lion_adafactor.lion_wrong_interp": "Lion's update uses the beta2 interpolation (momentum updated first)",
    "lion_adafactor.lion_lr_world": "Lion's lr scaled by the world size",
    "lion_adafactor.af_no_rms_clip": "Adafactor's update-RMS clipping dropped",
    "lion_adafactor.head_no_zero_grad": "the head's gradients are never zeroed (accumulate)",
    "schedfree.train_not_restored": "optimizer.train() not called after evaluation: the gradient taken at x, not y",
    "schedfree.warmup_off_by_one": "the optimizer's warm-up counted from 0 (one step late, first lr 0)",
    "schedfree.no_bias_correction": "Adam's bias correction missing from the lr",
    "schedfree.y_interp_flipped": "y's interpolation weights between x and z swapped",
    "schedfree.uniform_average": "the x average weighted uniformly instead of by lr_max ** 2",
    "schedfree.lr_world_scaled": "the lr scaled by the world size",
    "gnn_sampled.subgraph_degree": "GCN normalisation by the sampled subgraph's degree instead of the full graph's",
    "gnn_sampled.seeds_overlap": "the seed split overlaps: boundary seeds counted twice across ranks",
    "gnn_sampled.loss_all_nodes": "the loss over all sampled nodes instead of the seeds only",
    "gnn_sampled.no_self_loops": "the self-loops missing from the aggregation",
    "gnn_sampled.sampler_per_rank": "the neighbour sampling seeded per rank",
    "gnn_sampled.loss_sum": "the loss summed instead of averaged",
    "sngan_hinge.hinge_sign_flipped": "the hinge loss's fake term has the wrong sign",
    "sngan_hinge.d_grads_leak_into_g": "the D step's gradients leak into G (fakes not detached, G not zeroed before its step)",
    "sngan_hinge.d_zero_grad_once": "D's gradients not zeroed between the n_dis steps (accumulate)",
    "sngan_hinge.g_betas_default": "the generator's Adam betas are the defaults, not (0, 0.9)",
    "sngan_hinge.z_per_rank": "the latents drawn per rank instead of from the global draw",
    "sngan_hinge.d_lr_world": "D's lr scaled by the world size",
    "mtl_uncert.log_vars_grad_reduced_twice": "the log_vars gradient all-reduced a second time by hand (summed, doubled)",
    "mtl_uncert.log_vars_in_model_group": "log_vars in the network's param group (its lr and weight decay)",
    "mtl_uncert.regulariser_dropped": "the + log_var regulariser missing from the weighted loss",
    "mtl_uncert.precision_sign": "the precision exp(+s) instead of exp(-s)",
    "mtl_uncert.cls_loss_sum": "the classification loss summed instead of averaged",
    "mtl_uncert.weights_detached": "the task weights exp(-s) detached: no gradient into log_vars from the task losses",
    "switch_moe.capacity_local": "the expert capacity from the rank's tokens (local) instead of the global tokens",
    "switch_moe.aux_local_fraction": "the load-balancing loss's fractions from the rank's tokens only (missing all-reduce)",
    "switch_moe.aux_counts_over_local": "the load-balancing fractions divided by the local token count (wrong normalisation, doubled)",
    "switch_moe.z_loss_scaled_twice": "the router z-loss coefficient applied twice",
    "switch_moe.jitter_per_rank": "the router jitter noise drawn per rank",
    "switch_moe.no_gate_scale": "the expert output not scaled by the router probability (router gets no task gradient)",
}

LOSS_WRONG = r"loss (function|term|formula|computation|differ)|(different|wrong|changed) loss|loss .{0,30}(differs|changed|wrong)"
RUBRIC = {
    "dp_sgd.noise_every_rank": [RANDOM_PER_RANK, r"noise .{0,60}(every|each|all|both) ranks?|noise .{0,40}(added|drawn) (more than )?(once|twice|per rank)"],
    "dp_sgd.clip_summed_grad": [r"clip\w*.{0,80}(sum|batch|aggregat|whole|total|per[- ]sample|each sample|instead)|per[- ]sample .{0,40}clip"],
    "dp_sgd.local_batch_divisor": [DIVISOR, r"(gradient|grad)s? .{0,40}(\d+x|world[ _]size|times|scaled)"],
    "dp_sgd.no_all_reduce": [NO_REDUCE],
    "dp_sgd.per_layer_clip": [r"clip\w*.{0,80}(per[- ](layer|param|tensor)|each (layer|param|tensor)|layer[- ]wise|norm over|global norm|one norm|flat)"],
    "dp_sgd.noise_std_no_clip": [r"noise.{0,60}(std|scale|magnitude|sigma|standard deviation|multiplier|max_grad_norm|clip)|(std|sigma|scale) .{0,30}noise"],
    "lion_adafactor.af_row_col_swapped": [r"(row|col)\w*.{0,60}(col|row|swap|transpos|dim)|factor\w* .{0,40}(second moment|statistic|swap)|adafactor.{0,60}(factor|row|col|second moment)"],
    "lion_adafactor.warmup_from_zero": [WARMUP],
    "lion_adafactor.lion_wrong_interp": [r"lion.{0,80}(beta|interpol|momentum|sign|order|update)|(beta1|beta2|interpolation|momentum).{0,60}(beta2|beta1|swap|wrong|order|before)|sign of"],
    "lion_adafactor.lion_lr_world": [LR_WORLD],
    "lion_adafactor.af_no_rms_clip": [r"(rms|update)\w*.{0,40}(clip|clamp|threshold)|clip\w*.{0,40}(update|rms)|adafactor.{0,60}(clip|rms)"],
    "lion_adafactor.head_no_zero_grad": [ZERO_GRAD],
    "schedfree.train_not_restored": [r"(optimizer|opt)\w*\.?train\(\)|train\(\).{0,60}(not|never|missing|restor|forgot)|(eval|evaluation).{0,80}(not restored|restor|switch\w* back|left in|x instead of y|averaged weights|weights (stay|left))|\bx\b.{0,30}instead of .{0,10}\by\b|schedule[- ]free.{0,60}(mode|train|eval|swap)"],
    "schedfree.warmup_off_by_one": [WARMUP],
    "schedfree.no_bias_correction": [r"bias[- ]correct"],
    "schedfree.y_interp_flipped": [r"interpol\w*|\by\b.{0,40}(x|z|beta)|beta1? .{0,40}(swap|flip|wrong term|other term)|(x|z) and (z|x)"],
    "schedfree.uniform_average": [r"(averag|weight)\w*.{0,60}(uniform|lr_max|ckp1|1 ?/ ?\(?k|weighted|weights of)|uniform .{0,30}(averag|weight)"],
    "schedfree.lr_world_scaled": [LR_WORLD],
    "gnn_sampled.subgraph_degree": [r"degree|normali[sz]ation .{0,60}(subgraph|sampled|full graph|neighbo)|gcn[_ ]norm"],
    "gnn_sampled.seeds_overlap": [r"(seed|sample|row|node|shard|slice|split|batch|partition)\w*.{0,80}(overlap|twice|duplicat|double|more than once|off[- ]by[- ]one|one past|both ranks|two ranks)|overlap"],
    "gnn_sampled.loss_all_nodes": [r"loss.{0,80}(all (the )?(sampled )?nodes|neighbo|non-seed|every node|seed|target nodes|batch_size)|(seed|target) nodes? only"],
    "gnn_sampled.no_self_loops": [r"self[- ]?loop|(own|its own) (feature|embedding|representation)|add_self_loops"],
    "gnn_sampled.sampler_per_rank": [RANDOM_PER_RANK, r"neighbo\w*.{0,60}(sampl|differ|rank)|sampl\w*.{0,60}(neighbo|rank|differ)"],
    "gnn_sampled.loss_sum": [SUM_MEAN],
    "sngan_hinge.hinge_sign_flipped": [r"hinge|sign .{0,40}(flip|wrong|invert|revers)|(flip|wrong|invert|revers)\w* sign|relu\(1 ?[-+]"],
    "sngan_hinge.d_grads_leak_into_g": [r"detach|leak|(discriminator|\bd\b)'?s? (loss|step|gradient|grad)s? .{0,60}(generator|\bg\b)|(generator|\bg\b)'?s? .{0,40}(gradient|grad)s? .{0,60}(discriminator|\bd\b|accumulat|not zero|stale)", ZERO_GRAD],
    "sngan_hinge.d_zero_grad_once": [ZERO_GRAD],
    "sngan_hinge.g_betas_default": [r"beta|adam\w* .{0,40}(hyper|param|setting|default|momentum)|momentum"],
    "sngan_hinge.z_per_rank": [RANDOM_PER_RANK, r"latent|\bz\b.{0,40}(rank|seed|draw|differ)|noise input"],
    "sngan_hinge.d_lr_world": [LR_WORLD],
    "mtl_uncert.log_vars_grad_reduced_twice": [r"(all[- ]?reduc|averag|synchroni[sz]|reduc)\w*.{0,60}(twice|double|again|second|extra|\d+x|sum)|doubl\w*|twice"],
    "mtl_uncert.log_vars_in_model_group": [r"(param(eter)?[ _-]?group|group)\w*.{0,80}(log_vars|lr|learning rate|weight[ _]decay|wrong|different)|weight[ _]decay.{0,60}log_vars|log_vars.{0,60}(weight[ _]decay|group|lr|learning rate|decay)"],
    "mtl_uncert.regulariser_dropped": [r"regulari[sz]|log[_ ]?var|\+ ?s\b|uncertainty (weight|term)|task weight", LOSS_WRONG],
    "mtl_uncert.precision_sign": [r"precision|exp\(|sign|log[_ ]?var|uncertainty (weight|term)|task weight", LOSS_WRONG],
    "mtl_uncert.cls_loss_sum": [SUM_MEAN],
    "mtl_uncert.weights_detached": [r"detach|no (gradient|grad)|stop[- ]?gradient|log[_ ]?var.{0,60}(gradient|grad)|(gradient|grad).{0,60}log[_ ]?var|requires_grad|cut .{0,20}graph"],
    "switch_moe.capacity_local": [r"capacit|drop\w* .{0,30}token|token\w* .{0,30}drop|(local|per[- ]rank|rank'?s?) tokens"],
    "switch_moe.aux_local_fraction": [r"(aux|load[- ]balanc|balance)\w*.{0,80}(local|rank|all[- ]?reduc|global|fraction|count)|(fraction|count)s?.{0,60}(local|rank|all[- ]?reduc)", NO_REDUCE],
    "switch_moe.aux_counts_over_local": [r"(aux|load[- ]balanc|balance)\w*.{0,80}(local|rank|divid|normali[sz]|count|fraction|doubl|scal)|(fraction|count)s?.{0,60}(divid|normali[sz]|local|doubl)", DIVISOR],
    "switch_moe.z_loss_scaled_twice": [r"z[- _]?loss|coefficient.{0,40}(twice|double|squared|applied)|(twice|double)\w*.{0,30}(scal|coefficient)|logsumexp"],
    "switch_moe.jitter_per_rank": [RANDOM_PER_RANK, r"jitter"],
    "switch_moe.no_gate_scale": [r"gate|gating|router (prob|probabilit|weight)|(router|routing)\w*.{0,60}(gradient|grad|scale|multipl|prob)|combine (weight|tensor)|top[- ]?1 prob"],
}


def right(bug_id: str, cause: str | None) -> bool:
    """Whether the (lower-cased) likely-cause line names ``bug_id``'s bug."""
    if not cause:
        return False
    c = cause.lower()
    return any(re.search(rx, c) for rx in RUBRIC.get(bug_id, ()))
