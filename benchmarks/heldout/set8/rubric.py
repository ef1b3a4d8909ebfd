"""Per heldout8 bug: the first cause a right diagnosis names (``EXPECTED``, in words) and the regexes
that accept a "likely cause" line naming it (``RUBRIC``; matched lower-case, the location removed).
Written from what each bug is, before the plugin was first run on this set, and not changed after.
The regexes accept the usual wordings of the mechanism (or of its class: random draws, data
sharding, gradient scaling, clipping, ...), not one phrase; a line that names only a symptom (which
tensor differs, that the ranks disagree, that the loss differs) is not accepted.
"""
from __future__ import annotations

import re

NOT_DIVIDED = (r"(not|never|missing|without|forg[eo]t\w*|no)[^.]{0,40}(divid|averag|normali[sz]|mean\b)",
               r"sum(s|med)?[^.]{0,40}(instead|rather|not)[^.]{0,20}(averag|mean|divid)",
               r"(\d+|world[- _]?size|\bw\b|rank count)[- ]?(times|x|×)[^.]{0,10}(too )?(large|big)",
               r"(too large|larger|scaled up|inflated)[^.]{0,40}(world|factor|\d|ranks)",
               r"(times|×|\bx) ?(the )?(world[- _]?size|number of ranks|\bw\b)")
NO_SYNC = (r"(not|never|missing|without|no|skipp\w*|left out)[^.]{0,40}(all[- _]?reduc|synchroni[sz]|\bsync|averag|reduc)",
           r"(all[- _]?reduc\w*|gradient sync\w*|synchroni[sz]ation)[^.]{0,40}(missing|skipp|not|never|absent|left out)",
           r"unsynchroni[sz]ed|unreduced|local gradients?|own gradients?|per[- ]rank gradients?")
RNG = (r"\brng\b", r"random", r"\bseed", r"generator", r"timestep",
       r"(draw|sampl)\w*[^.]{0,30}noise", r"noise[^.]{0,30}(draw|sampl|differ|same|rank|identical)")
SCHEDULE = (r"schedul", r"learning[- ]rate", r"\blr\b", r"warm[- ]?up")
HIDDEN = (r"hidden", r"\bh0\b|\bh_0\b|init_hidden", r"recurren", r"(lstm|rnn)[^.]{0,30}state",
          r"state[^.]{0,30}(reset|carr|re-?init|detach|zero)", r"(reset|carr|re-?init)\w*[^.]{0,30}state",
          r"bptt|truncat")
DATA = (r"(data|shard|split|part|stream|batch|sampl|partition|token)\w*[^.]{0,40}(rank|same|identical|duplicat|overlap|offset|wrong|interleav|order)",
        r"(every|all|each) ranks?[^.]{0,40}(same|identical|wrong|other)[^.]{0,10}(data|batch|input|shard|tokens?|samples?|rows?)",
        r"data[- ]?(shard|split|partition|loader|order|parallel)", r"input(s)?[^.]{0,20}(differ|mismatch|order)",
        r"sampler")
CLIP = (r"clip", r"grad(ient)?[- _]?norm", r"max[_ ]norm", r"(global|total|joint) norm")
ZEROED = (r"(not|never|without|missing|forg[eo]t\w*)[^.]{0,30}(zero|clear|reset)", r"accumulat",
          r"stale (grad|buffer)", r"zero_grad|zero_\(\)", r"(leftover|left over|previous step'?s?) grad")
A2A = (r"all[- _]?to[- _]?all|\ba2a\b|alltoall",)

EXPECTED: dict[str, str] = {
    "ddpm_noise.same_noise_all_ranks": "random draws: every rank draws the same noise/timesteps (same seed, local batch)",
    "ddpm_noise.rank_seeded_timesteps": "random draws: timesteps drawn from a per-rank seed, not the global batch's draw",
    "ddpm_noise.no_sqrt_alpha_bar": "the noising formula: alphas_cumprod used without the square roots",
    "ddpm_noise.alpha_bar_off_by_one": "alphas_cumprod indexed one timestep off (t - 1)",
    "ddpm_noise.sched_before_opt": "the lr scheduler stepped before the optimizer (warm-up one step ahead)",
    "ddpm_noise.target_is_x0": "the loss target is the clean sample, not the added noise",
    "ddpm_noise.fresh_noise_target": "the loss target is a second random draw, not the noise added",
    "lstm_bptt.hidden_reset_each_batch": "hidden state re-initialised every chunk (not carried)",
    "lstm_bptt.hidden_carried_across_epochs": "hidden state not re-initialised at the epoch start",
    "lstm_bptt.same_part_all_ranks": "data sharding: every rank reads the same part of the stream",
    "lstm_bptt.interleaved_split": "data sharding: the token stream split token by token over the ranks",
    "lstm_bptt.batchify_view_wrong": "batchify layout: view(-1, bsz) columns interleave tokens",
    "lstm_bptt.targets_unshifted": "targets not shifted by one token",
    "lstm_bptt.clip_per_param": "gradient clipping per parameter instead of by the joint norm",
    "ulysses_attn.no_all_to_all": "the all_to_all left out: attention only within the rank's sequence block",
    "ulysses_attn.positions_from_zero": "position ids not offset by the rank's sequence block",
    "ulysses_attn.heads_order_swapped": "the return all_to_all regroups the heads in the wrong order",
    "ulysses_attn.labels_shifted_per_block": "labels shifted inside each block (boundary tokens lose their label)",
    "ulysses_attn.no_grad_allreduce": "replicated gradients not all-reduced over the sequence-parallel ranks",
    "ulysses_attn.loss_local_mean": "loss normalised by the rank's token count while gradients are summed",
    "ulysses_attn.grad_average": "gradients averaged (divided by W) instead of summed",
    "kd_ddp.no_t_squared": "the KL term not multiplied by T^2",
    "kd_ddp.kl_mean_reduction": "KL reduction 'mean' instead of 'batchmean'",
    "kd_ddp.teacher_no_temperature": "the teacher's softmax without the temperature",
    "kd_ddp.teacher_train_mode": "the teacher left in train mode (BatchNorm batch statistics)",
    "kd_ddp.teacher_loaded_rank0_only": "the teacher's weights loaded on rank 0 only",
    "kd_ddp.alpha_swapped": "the KL / CE weights (alpha) swapped",
    "kd_ddp.cached_logits_local_index": "cached teacher logits looked up by local position, not dataset index",
    "zero2_fp16.no_grad_average": "reduced gradients summed, not divided by W",
    "zero2_fp16.clip_on_scaled_grads": "clipping coefficient from the still loss-scaled gradients",
    "zero2_fp16.partition_off_by_one": "each rank steps its partition with the next rank's gradient slice",
    "zero2_fp16.no_allgather": "updated partitions not all-gathered back into the parameters",
    "zero2_fp16.local_norm_clip": "clipping norm from the rank's partition only (not all-reduced)",
    "zero2_fp16.scale_update_after_return": "loss scale not lowered on an overflow-skipped step",
    "zero2_fp16.grads_not_zeroed": "the flat gradient buffer not zeroed between steps",
    "bf16_master.main_grad_not_zeroed": "main_grad buffers not zeroed between steps",
    "bf16_master.params_not_copied_back": "fp32 masters never copied back into the model parameters",
    "bf16_master.no_microbatch_scale": "micro-batch losses not divided by the number of micro-batches",
    "bf16_master.grad_allreduce_missing": "main_grad not all-reduced over the data-parallel ranks",
    "bf16_master.clip_before_allreduce": "gradients clipped by the local norm before the all-reduce",
    "bf16_master.main_grad_overwritten": "main_grad overwritten by each micro-batch instead of accumulated",
}

RUBRIC: dict[str, tuple[str, ...]] = {
    "ddpm_noise.same_noise_all_ranks": RNG,
    "ddpm_noise.rank_seeded_timesteps": RNG,
    "ddpm_noise.no_sqrt_alpha_bar": (r"sqrt|square[- ]root", r"add_noise|noising|nois(y|ed) (input|sample)",
                                     r"alphas?[_ ]?cumprod|alpha[_ ]?bar|\babar\b", r"noise schedule"),
    "ddpm_noise.alpha_bar_off_by_one": (r"off[- ]by[- ]one", r"\bt ?- ?1\b",
                                        r"(alphas?[_ ]?cumprod|alpha[_ ]?bar|\babar\b|noise schedule|timestep)[^.]{0,40}(index|shift|wrong|off)"),
    "ddpm_noise.sched_before_opt": SCHEDULE,
    "ddpm_noise.target_is_x0": (r"(loss|mse|regression)[^.]{0,30}target", r"target[^.]{0,30}(loss|wrong|noise|clean|x_?0)",
                                r"\bx_?0\b", r"clean (sample|data|input|image)", r"epsilon",
                                r"predict(s|ion)?[^.]{0,20}(noise|x_?0|sample)"),
    "ddpm_noise.fresh_noise_target": (r"(second|fresh|new|another|separate|different|independent)[^.]{0,30}(noise|randn|random|draw|sample)",
                                      r"target[^.]{0,40}(noise|randn|random)", r"noise[^.]{0,40}(target|not the same|differ|mismatch)",
                                      r"\brng\b", r"random|randn"),
    "lstm_bptt.hidden_reset_each_batch": HIDDEN,
    "lstm_bptt.hidden_carried_across_epochs": HIDDEN,
    "lstm_bptt.same_part_all_ranks": DATA,
    "lstm_bptt.interleaved_split": DATA,
    "lstm_bptt.batchify_view_wrong": DATA + (r"batchif", r"\bview\b|reshape|layout|column|transpos"),
    "lstm_bptt.targets_unshifted": (r"target", r"label", r"shift"),
    "lstm_bptt.clip_per_param": CLIP,
    "ulysses_attn.no_all_to_all": A2A + (r"attention[^.]{0,40}(local|block|chunk|shard|partial|own)",
                                         r"(local|own|partial|block)[^.]{0,20}(sequence|attention|context)",
                                         r"sequence[- ]parallel"),
    "ulysses_attn.positions_from_zero": (r"position", r"\bpos(_ids)?\b", r"offset"),
    "ulysses_attn.heads_order_swapped": A2A + (r"\bheads?\b", r"permut|reshap|transpos|layout"),
    "ulysses_attn.labels_shifted_per_block": (r"label", r"target", r"shift", r"boundar"),
    "ulysses_attn.no_grad_allreduce": NO_SYNC,
    "ulysses_attn.loss_local_mean": NOT_DIVIDED + (
        r"(local|rank'?s?|per[- ]rank)[^.]{0,30}(count|tokens|mean|average|normali)",
        r"(global|total)[^.]{0,30}(count|tokens|number)", r"normali[sz]",
        r"loss[^.]{0,30}(mean|scal|divid|averag)"),
    "ulysses_attn.grad_average": (r"(divid|averag|scal)\w*[^.]{0,40}(world|\bw\b|ranks|twice|again|1/w)",
                                  r"(instead of|not|rather than)[^.]{0,20}sum", r"too small|smaller|scaled down",
                                  r"double[- ]?(count|divi|averag|normal)",
                                  r"averag\w*[^.]{0,30}(instead|rather|not)[^.]{0,20}sum"),
    "kd_ddp.no_t_squared": (r"\bt\s?(\^|\*\*)\s?2", r"t²", r"\bt\s?\*\s?t\b", r"t squared|squared temperature",
                            r"temperature[^.]{0,40}(squar|scal|factor)",
                            r"(\bkl\b|kld|kullback|distill\w*|soft)[^.]{0,40}(scal|weight|factor)"),
    "kd_ddp.kl_mean_reduction": (r"reduction|batchmean",
                                 r"(\bkl\b|kld|kullback|distill\w*|kl_div)[^.]{0,40}(mean|normali|divid|averag|scal)"),
    "kd_ddp.teacher_no_temperature": (r"temperature", r"softmax", r"teacher[^.]{0,40}(soft|prob|logit)"),
    "kd_ddp.teacher_train_mode": (r"(train|eval)\w*[^.]{0,20}mode", r"\.eval\(\)|\.train\(\)", r"batch ?norm|\bbn\b",
                                  r"running (stat|mean|var)", r"batch statistic"),
    "kd_ddp.teacher_loaded_rank0_only": (r"(load|checkpoint|state[_ ]dict|pretrain)\w*[^.]{0,40}(rank|only|\b0\b)",
                                         r"teacher[^.]{0,40}(differ|init|weight|load|random)",
                                         r"init\w*[^.]{0,30}(differ|rank|random)",
                                         r"(broadcast|not (the )?same)[^.]{0,30}(weights|param|model|teacher)"),
    "kd_ddp.alpha_swapped": (r"alpha", r"(\bkl\b|distill\w*|soft|hard|\bce\b|cross[- ]entropy)[^.]{0,40}(weight|mix|swap|coefficient)",
                             r"loss (weight|mix|coefficient)"),
    "kd_ddp.cached_logits_local_index": (r"index|indices|look[- ]?up|cach",
                                         r"(logit|teacher output)s?[^.]{0,40}(wrong|misalign|mismatch|other sample|order)",
                                         r"(sample|batch)[^.]{0,30}(order|misalign|mismatch)"),
    "zero2_fp16.no_grad_average": NOT_DIVIDED,
    "zero2_fp16.clip_on_scaled_grads": CLIP + (r"unscal", r"(loss[- ])?scal\w*[^.]{0,40}(before|clip|norm)"),
    "zero2_fp16.partition_off_by_one": (r"partition|shard|slice|offset|off[- ]by[- ]one",
                                        r"wrong rank'?s?|(neighbo\w*|next|other) rank'?s?"),
    "zero2_fp16.no_allgather": (r"all[- _]?gather",
                                r"(param|weight)s?[^.]{0,40}(not|never)[^.]{0,20}(gather|synchron|broadcast|copied|updated)",
                                r"(partition|shard)s?[^.]{0,40}(not|never|stale|missing)",
                                r"stale (param|weight|partition|shard)"),
    "zero2_fp16.local_norm_clip": CLIP,
    "zero2_fp16.scale_update_after_return": (r"loss[- ]?scal", r"scaler", r"overflow", r"skipp\w*[^.]{0,20}step",
                                             r"\binf\b|\bnan\b|non-?finite", r"back[- ]?off", r"dynamic scal"),
    "zero2_fp16.grads_not_zeroed": ZEROED,
    "bf16_master.main_grad_not_zeroed": ZEROED + (r"main[_ ]grad[^.]{0,40}(not|never|stale|zero|accum)",),
    "bf16_master.params_not_copied_back": (r"(master|fp32|main)[^.]{0,40}(copy|copied|written|back|model param)",
                                           r"(param|weight)s?[^.]{0,40}(not|never)[^.]{0,20}(updated|changed|copied|written|step)",
                                           r"frozen|never (change|move|update)",
                                           r"optimizer[^.]{0,30}(not|never|no)[^.]{0,20}(step|update|effect)",
                                           r"step[^.]{0,30}(no effect|not applied|skipped)"),
    "bf16_master.no_microbatch_scale": NOT_DIVIDED + (r"micro[- ]?batch",
                                                      r"(gradient )?accumulat\w*[^.]{0,40}(divid|scal|normali|averag)",
                                                      r"(twice|2x|two times)[^.]{0,20}(too )?(large|big)"),
    "bf16_master.grad_allreduce_missing": NO_SYNC,
    "bf16_master.clip_before_allreduce": CLIP + (r"(local|per[- ]rank|before)[^.]{0,40}(norm|clip|all[- _]?reduc)",),
    "bf16_master.main_grad_overwritten": (r"overwr",
                                          r"(copy|copied|assign)\w*[^.]{0,30}(instead|rather|not)[^.]{0,20}(add|accum|sum)",
                                          r"only (the )?last micro", r"accumulat\w*[^.]{0,40}(missing|lost|not|broken|wrong)",
                                          r"micro[- ]?batch", r"main[_ ]grad"),
}


def right(bug_id: str, cause: str | None) -> bool:
    """Whether the "likely cause" text ``cause`` names the bug ``bug_id`` ("family.bug")."""
    if not cause:
        return False
    text = cause.lower()
    return any(re.search(p, text) for p in RUBRIC[bug_id])
