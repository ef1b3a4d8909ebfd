"""The rubric of heldout19: per bug, the first cause a right diagnosis names (``EXPECTED``) and the regexes
that accept it (``RUBRIC``), applied lower-cased to the diagnosis's first "likely cause" line (the location
it names removed by the caller). Written from what each bug is, before any run of the plugin on this set,
and not changed after. A diagnosis is right when any of the bug's regexes matches.
"""
from __future__ import annotations

import re

EXPECTED = {
    # megatron_seq_parallel
    "megatron_seq_parallel.sp_grads_not_allreduced": "the sequence-parallel parameters' gradients (LayerNorm weights / biases, row-parallel biases) are not all-reduced over the TP group: each rank's replicated copies get only its own tokens' gradient (replicas diverge)",
    "megatron_seq_parallel.row_bias_not_marked_sp": "the row-parallel linears' biases are not marked sequence_parallel: their gradients (from the rank's tokens only) are not all-reduced over the TP group, while the LayerNorms' are",
    "megatron_seq_parallel.allgather_bwd_split": "the sequence-parallel all-gather before the column-parallel linears only splits the gradient in backward instead of reduce-scattering it (tensor_parallel_output_grad=False): the input gradient misses the other ranks' heads / columns",
    "megatron_seq_parallel.bias_before_reduce_scatter": "the row-parallel bias is added before the reduce-scatter: the replicated bias is summed W times",
    "megatron_seq_parallel.grad_norm_counts_duplicates": "the clipping norm counts the tensor-parallel duplicate (replicated) parameters on every TP rank: the total norm is too large and the gradients are over-clipped",
    "megatron_seq_parallel.norms_and_biases_decayed": "weight decay is applied to the LayerNorm weights and the biases (no no-weight-decay parameter group)",
    "megatron_seq_parallel.warmup_from_zero": "the warm-up factor is step / warmup instead of (step + 1) / warmup: the first update runs at lr 0 and the schedule lags one update (off by one)",
    # gradcache_retrieval
    "gradcache_retrieval.gather_without_grad": "the passage representations are all-gathered without autograd (plain all_gather, own slot put back): the gradient cache of the rank's passages misses the other ranks' queries' terms",
    "gradcache_retrieval.negatives_not_gathered": "the passages are not all-gathered across ranks: each query is scored only against the rank's own passages (local in-batch negatives)",
    "gradcache_retrieval.labels_not_offset_by_rank": "the InfoNCE labels are not offset by rank * local queries: on ranks > 0 the targets point at rank 0's passages",
    "gradcache_retrieval.label_stride_ignores_hard_negatives": "the labels omit the group-size stride (one positive and one hard negative per query): the targets point at the wrong passages",
    "gradcache_retrieval.no_sync_inverted": "the no_sync condition is inverted: the first chunk's backward all-reduces and the last chunks' gradients stay local, so the ranks' gradients are not averaged (replicas diverge)",
    "gradcache_retrieval.rand_context_missing": "the dropout RNG state is not replayed in GradCache's second forward (RandContext missing): the gradient pass uses different dropout masks than the cached representations",
    "gradcache_retrieval.temperature_multiplied": "the similarity scores are multiplied by the temperature instead of divided by it: the InfoNCE softmax is nearly flat",
    # sac_ddp
    "sac_ddp.tau_on_wrong_side": "the Polyak (soft) target update has tau and 1 - tau swapped: the target network almost copies the online critic every update",
    "sac_ddp.replay_rows_same_on_every_rank": "every rank samples the same replay rows (the same seed / no sharding): the ranks train on duplicated data, the rest of the global batch is never used",
    "sac_ddp.noise_seeded_per_rank": "the reparameterisation noise is drawn from a per-rank seeded generator instead of the rank's rows of the global draw",
    "sac_ddp.tanh_correction_missing": "the tanh-squashed policy's log-probability omits the change-of-variables (Jacobian) correction -log(1 - tanh(u)^2 + eps)",
    "sac_ddp.done_mask_inverted": "the TD target's bootstrap mask is inverted: it is multiplied by done instead of 1 - done",
    "sac_ddp.target_copied_per_rank_seed": "the target critic is deep-copied from each rank's own (seed + rank) initialisation before DDP broadcasts rank 0's weights: the ranks' target networks differ",
    "sac_ddp.entropy_missing_in_target": "the soft TD target omits the entropy term - alpha * next_log_pi",
    # stylegan2_lazy_r1
    "stylegan2_lazy_r1.r1_not_scaled_by_interval": "the lazy R1 loss is not multiplied by d_reg_every: the penalty applied every k iterations is k times too weak",
    "stylegan2_lazy_r1.lazy_ratio_not_applied": "the discriminator's Adam lr and betas are not adjusted for lazy regularisation (lr * k/(k+1), beta ** (k/(k+1)))",
    "stylegan2_lazy_r1.r1_grad_of_mean": "the R1 gradient is taken of real_pred.mean() instead of real_pred.sum(): the input gradients are divided by the batch size (penalty by its square)",
    "stylegan2_lazy_r1.r1_without_zero_grad": "discriminator.zero_grad() is missing before the R1 backward: the R1 step re-applies the logistic loss's gradients already stepped",
    "stylegan2_lazy_r1.r1_bypasses_ddp": "the R1 pass runs the discriminator's inner module (bypassing DDP): the R1 gradients are not all-reduced (replicas diverge)",
    "stylegan2_lazy_r1.latents_seeded_per_rank": "the latent codes are drawn from a per-rank seeded generator instead of the rank's rows of the global draw",
    "stylegan2_lazy_r1.r1_on_fake": "the R1 penalty is computed on generated (fake) images instead of real images",
    # accel_plateau_val
    "accel_plateau_val.val_in_train_mode": "model.eval() is missing before the validation pass: the validation loss is computed with dropout active",
    "accel_plateau_val.train_mode_not_restored": "model.train() is not called after the validation pass: training continues in eval mode (no dropout)",
    "accel_plateau_val.val_loss_not_gathered": "the plateau scheduler is stepped with the rank's local validation loss (not gathered): the ranks' learning rates differ",
    "accel_plateau_val.gather_counts_padding": "accelerator.gather is used instead of gather_for_metrics: the duplicated samples padding the last validation batch are counted in the validation loss",
    "accel_plateau_val.plateau_scheduler_prepared": "ReduceLROnPlateau is passed to accelerator.prepare: the AcceleratedScheduler steps it num_processes times per call, patience runs out W times faster",
    "accel_plateau_val.plateau_mode_max": "ReduceLROnPlateau uses mode='max' on a loss: the learning rate is cut when the validation loss improves",
    "accel_plateau_val.val_every_micro_batch_count": "the validation / plateau step is triggered on the micro-batch counter instead of the completed-update counter: it runs too often",
    # fabric_fp16_scaler
    "fabric_fp16_scaler.clip_before_unscale": "the gradients are clipped while still scaled by the loss scale (clip_grad_norm_ before / without unscale_, instead of fabric.clip_gradients)",
    "fabric_fp16_scaler.onecycle_on_skipped_step": "the OneCycleLR scheduler is stepped even when the grad scaler skipped the optimizer step on an overflow: the schedule runs ahead",
    "fabric_fp16_scaler.onecycle_total_in_micro_batches": "OneCycleLR's total_steps counts micro-batches (updates x accumulation) instead of optimizer updates: the schedule runs too slowly",
    "fabric_fp16_scaler.bn_not_synced": "the batch norm is not synchronised across ranks: each rank normalises with its local micro-batch statistics",
    "fabric_fp16_scaler.sync_on_first_micro": "no_backward_sync's enabled flag is inverted: gradients are all-reduced on the first micro-batch, the last micro-batch's gradient stays local (replicas diverge)",
    "fabric_fp16_scaler.loss_not_divided_by_accum": "the loss is not divided by the number of accumulation steps: the accumulated gradient is ACC times too large",
    "fabric_fp16_scaler.zero_grad_every_micro": "optimizer.zero_grad() is called before every micro-batch's backward: only the last micro-batch's gradient is used",
}

_AR = r"(all[_ -]?reduc\w*|allreduc\w*|reduce[_ ]mean|synchroni[sz]\w*|sync\w*)"
_GATHER = r"(all[_ -]?gather\w*|allgather\w*|gather\w*)"
_RS = r"(reduce[_ -]?scatter\w*)"
_LR = r"(learning[ -]rate|\blr\b)"
_SCHED = r"(schedul\w*|warm[- ]?up|cosine|one[_ ]?cycle\w*|poly\w*|anneal\w*)"
_LOCAL = r"(local\w*|per[- ]rank|each rank|own rank|this rank|rank'?s own|not (global|all[_ -]?reduc\w*|reduced|synchroni[sz]ed|averaged|gathered|summed)|instead of (the )?global)"
_SCALE = r"(scal\w*|divid\w*|averag\w*|normali[sz]\w*|too (large|big|small)|double\w*|twice|half|\d+ ?x|times|factor|multipl\w*|world[_ ]size|\bw\b)"
_WORLD = r"(world[_ ]?size|\bw\b|number of (ranks|processes|replicas|workers|gpus|devices)|num[_ ]?(ranks|processes|replicas)|num_processes|ranks)"
_BEFORE = r"(before|order\w*|too early|early|stale|previous|prior to|ahead of|one step ahead|next step)"
_BN = r"(batch[_ ]?norm\w*|\bbn\b|running (mean|var\w*|stat\w*)|batch stat\w*)"
_SEED = r"(seed\w*|generator|rng|random (state|stream|draw|noise)|per[- ]rank (noise|draw|random\w*)|different (noise|draws?|random))"
_REPL = r"replicas? (diverge\w*|differ\w*|drift\w*|disagree\w*|out of sync)"
_LN = r"(layer[_ ]?norm\w*|\bln\w*\b|norm (weight|bias|param)\w*|sequence[_ ]parallel (param\w*|grad\w*|weights?)|replicated (param\w*|weights?))"
_R1 = r"(\br1\b|gradient penalty|grad(ient)? penalty|penalty|regulari[sz]\w*)"
_VAL = r"(validat\w*|val[_ ]loss|eval\w* (pass|loop|loss)|metric\w*)"
_PLAT = r"(plateau|reducelronplateau|scheduler)"

RUBRIC = {
    # megatron_seq_parallel
    "megatron_seq_parallel.sp_grads_not_allreduced": [
        rf"{_LN}.{{0,80}}({_AR}|{_LOCAL}|partial|own tokens|(sequence|token) (shard|chunk)|not (summed|reduced))",
        rf"(not|never|no|without|missing|skip\w*) (the )?{_AR}.{{0,60}}({_LN}|norm|sequence[_ ]parallel|replicated)",
        r"(finalize_model_grads|allreduce_sequence_parallel_grads|_allreduce_layernorm_grads|allreduce_layernorm_grads)",
        rf"sequence[_ -]parallel.{{0,80}}(grad\w*).{{0,60}}({_AR}|{_LOCAL}|partial)"],
    "megatron_seq_parallel.row_bias_not_marked_sp": [
        rf"(row[- ]?parallel|o\.bias|fc2\.bias|output proj\w*|bias\w*).{{0,80}}({_AR}|sequence[_ ]parallel|{_LOCAL}|partial|own tokens|not (summed|marked))",
        rf"(not|never|no|without|missing) (the )?{_AR}.{{0,60}}bias"],
    "megatron_seq_parallel.allgather_bwd_split": [
        rf"{_GATHER}.{{0,80}}(backward|grad\w*).{{0,80}}(split\w*|{_RS}|not (summed|reduced)|{_LOCAL}|own|partial|other ranks)",
        r"tensor_parallel_output_grad",
        rf"(backward|grad\w*).{{0,60}}{_RS}.{{0,40}}(missing|instead|not|split|skipp\w*)",
        rf"{_RS}.{{0,40}}(missing|replaced|instead).{{0,40}}(split|backward)",
        r"(column[- ]?parallel|qkv|fc1|input|layer[_ ]?norm|residual)\w* grad\w*.{0,60}(partial|missing|only|own|local|other ranks)"],
    "megatron_seq_parallel.bias_before_reduce_scatter": [
        rf"bias.{{0,80}}(before|prior to|ahead of|inside|pre-?).{{0,40}}({_RS}|{_AR}|reduc\w*|sum\w*)",
        rf"bias.{{0,80}}({_WORLD}|w times|twice|multiple times|counted|summed|duplicat\w*|added (on )?every rank)",
        rf"({_RS}|reduc\w*).{{0,60}}(after|includ\w*).{{0,40}}bias"],
    "megatron_seq_parallel.grad_norm_counts_duplicates": [
        rf"(grad\w* norm|norm|clip\w*).{{0,80}}(duplicat\w*|replicated|counted (twice|{_WORLD}|multiple|on every)|double[- ]count\w*|too (large|big|strong|hard)|over[- ]?clip\w*)",
        r"(param_is_not_tensor_parallel_duplicate|tensor[- ]parallel duplicate)",
        r"(duplicat\w*|replicated (param\w*|weights?)).{0,80}(norm|clip\w*)"],
    "megatron_seq_parallel.norms_and_biases_decayed": [
        r"(weight[_ ]decay|\bwd\b).{0,80}(bias\w*|layer[_ ]?norm|norm\w*|1-?d|param(eter)? group|no[_ ]decay|every param\w*|all param\w*)",
        r"(bias\w*|layer[_ ]?norm|norm (weight|param)\w*).{0,60}(weight[_ ]decay|decayed)", r"no[_ ]weight[_ ]decay"],
    "megatron_seq_parallel.warmup_from_zero": [
        rf"({_SCHED}|schedulers?|{_LR}).{{0,80}}(zero|\b0\b|off[- ]by[- ]one|one step (behind|late)|lag\w*|step ?/ ?warm\w*|step ?\+ ?1|first (update|step|iteration))",
        r"off[- ]by[- ]one", rf"(first|initial) (update|step|iteration).{{0,60}}{_LR}.{{0,30}}(zero|\b0\b)",
        rf"{_LR}.{{0,40}}(of |= ?|is |at )(zero|0\b)"],
    # gradcache_retrieval
    "gradcache_retrieval.gather_without_grad": [
        rf"{_GATHER}.{{0,80}}(without (autograd|grad\w*)|no (autograd|grad\w*)|not differentiable|non[- ]?differentiable|detach\w*|autograd|gradients? (do not|don't|doesn't|does not|not) (flow|propagat\w*)|plain|(local|own) slot)",
        rf"(no|without|missing|lost|drop\w*) (autograd|gradient\w*).{{0,60}}({_GATHER}|other ranks|remote|cross[- ]rank)",
        rf"(cached grad\w*|grad(ient)? cache|passage grad\w*|rep\w* grad\w*).{{0,80}}(other ranks|remote|missing|partial|{_LOCAL}|not (summed|reduced))"],
    "gradcache_retrieval.negatives_not_gathered": [
        rf"(negatives?|passages?|p[_ ]reps?|candidates?|representations?).{{0,80}}(not (all[_ -]?)?gathered|{_LOCAL}|per[- ]rank|own rank|cross[- ](rank|device)|x[_ ]?device)",
        rf"(not|never|no|without|missing) ({_GATHER}).{{0,60}}(negatives?|passages?|reps?|representations?)",
        r"(in[- ]batch|local) negatives"],
    "gradcache_retrieval.labels_not_offset_by_rank": [
        r"(label|target)s?.{0,80}(offset\w*|\brank|shift\w*|point\w* (at|to) rank 0)",
        r"(offset|rank ?\* ?(nq|n|local\w*|batch\w*)).{0,60}(label|target|missing|not (added|applied))"],
    "gradcache_retrieval.label_stride_ignores_hard_negatives": [
        r"(label|target)s?.{0,80}(stride|group[_ ]size|hard[- ]negative\w*|n_passages|passages? per query|\* ?group|every other|wrong passage|misalign\w*)",
        r"(stride|group[_ ]size|hard[- ]negative\w*).{0,80}(label|target|missing|ignor\w*)"],
    "gradcache_retrieval.no_sync_inverted": [
        rf"(no_sync|no[_ ]sync|{_AR}).{{0,80}}(invert\w*|revers\w*|wrong chunk|first chunk|last chunk|opposite|flip\w*|swap\w*)",
        rf"(last|final) chunk.{{0,80}}({_AR}|local|not (synced|reduced|averaged))",
        rf"(chunk\w*|micro[- ]?batch\w*|accumulat\w*).{{0,80}}{_AR}.{{0,40}}(wrong|first|invert\w*|skipp\w*|missing|local)",
        rf"(not|never) (be(ing)? )?{_AR}.{{0,40}}(on|for|in|after|at) (the )?(last|final) chunk", _REPL],
    "gradcache_retrieval.rand_context_missing": [
        r"(randcontext|rand[_ ]context|rng state|random state|dropout (mask|state|rng|seed)\w*).{0,80}(replay\w*|restor\w*|differ\w*|mismatch\w*|new|fresh|re-?drawn|not (the )?same|inconsistent)",
        r"(second|gradient|grad|re-?)[- ]?(forward|pass).{0,80}(dropout|mask\w*|rng|random)",
        r"(dropout|mask\w*).{0,80}(second|two|both|first) (forward|pass\w*)", r"randcontext"],
    "gradcache_retrieval.temperature_multiplied": [
        r"(temperature|tau|logit[_ ]scale).{0,80}(multipl\w*|instead of divid\w*|divid\w*|invert\w*|inverse|reciprocal|flat|wrong|too (soft|high|low))",
        r"(multipl\w*|divid\w*).{0,40}(by )?(the )?(temperature|tau)",
        r"(softmax|logits|similarit\w*|scores?).{0,60}(nearly (flat|uniform)|too (soft|smooth|flat))"],
    # sac_ddp
    "sac_ddp.tau_on_wrong_side": [
        r"(polyak|soft[_ ]update|target (network|net|update|critic|param\w*)|\btau\b).{0,80}(swap\w*|wrong side|revers\w*|invert\w*|1 ?- ?tau|hard (copy|update)|copies|copy|too (fast|quick\w*))",
        r"\btau\b.{0,60}(swap\w*|wrong|revers\w*|invert\w*|1 ?- ?tau|complement)"],
    "sac_ddp.replay_rows_same_on_every_rank": [
        r"(replay|batch|rows?|samples?|minibatch|data|indices).{0,80}(same (on|for|across) (every|all|each) (rank|process|replica|worker)s?|identical|duplicat\w*|same seed|not (sharded|split|distributed)|same rows)",
        r"(same|identical) (replay |mini)?(batch|rows|samples|indices|data).{0,60}(rank|process|replica|worker)",
        r"(all|every|each) (the )?(ranks?|process\w*|replicas?|workers?).{0,60}(same|identical) (replay |mini)?(batch\w*|rows|samples|indices|data|transitions)",
        r"(sampler|shard\w*).{0,60}(missing|same|not)"],
    "sac_ddp.noise_seeded_per_rank": [
        rf"(noise|eps\w*|reparameteri[sz]\w*|action sampl\w*|gaussian|random (draw|normal|noise)\w*|rsample).{{0,80}}({_SEED}|per[- ]rank|each rank|rank[- ]seeded|rank[- ]dependent|seed ?\+ ?rank)",
        r"(rank|per[- ]rank)[- ](seed\w*|generator|rng)"],
    "sac_ddp.tanh_correction_missing": [
        r"(tanh|squash\w*|jacobian|change[- ]of[- ]variables?|log ?\(1 ?- ?tanh|log[- ]?det\w*)",
        r"log[_ ]?(prob|pi|likelihood)\w*.{0,80}(correct\w*|missing|squash\w*|jacobian|tanh)"],
    "sac_ddp.done_mask_inverted": [
        r"(done|terminal|mask|not[_ ]done|1 ?- ?done|bootstrap\w*).{0,80}(invert\w*|revers\w*|flip\w*|swap\w*|wrong|instead of|opposite|1 ?- ?done)",
        r"bootstrap\w*.{0,60}(terminal|done)"],
    "sac_ddp.target_copied_per_rank_seed": [
        r"target.{0,80}(copied|copy|deepcopy|init\w*|before).{0,60}(ddp|broadcast\w*|wrap\w*|rank|seed\w*)",
        r"target (network|net|critic|param\w*|weights?)s?.{0,80}(differ\w*|not (synced|synchroni[sz]ed|broadcast\w*|identical|the same)|per[- ]rank|each rank|diverg\w*|inconsistent|mismatch\w*)",
        r"(seed ?\+ ?rank|per[- ]rank seed\w*|rank[- ]dependent seed\w*).{0,80}(init\w*|target|model|weights?)", r"broadcast\w*.{0,60}target"],
    "sac_ddp.entropy_missing_in_target": [
        r"(entropy|alpha ?\* ?(next_)?log_?pi|log[_ ]?pi|soft (value|q|target)).{0,80}(missing|omitt\w*|dropp\w*|not (subtracted|included|added)|left out|absent|without)",
        r"(td|bellman|q|critic|soft) target.{0,80}(entropy|alpha|log[_ ]?pi)", r"(without|no|missing|drops?) (the )?(entropy|alpha)"],
    # stylegan2_lazy_r1
    "stylegan2_lazy_r1.r1_not_scaled_by_interval": [
        rf"{_R1}.{{0,80}}(d_reg_every|reg(ulari[sz]ation)?[_ ]interval|interval|lazy|every k|not (multiplied|scaled)|too (weak|small)|\d+ ?x|k times)",
        r"(d_reg_every|lazy (reg\w*|r1)).{0,60}(missing|not|scal\w*|multipl\w*|factor)"],
    "stylegan2_lazy_r1.lazy_ratio_not_applied": [
        r"(lazy|reg(ulari[sz]ation)?[_ ]ratio|d_reg_ratio|mb_ratio|k ?/ ?\(k ?\+ ?1\)|ratio).{0,80}(\blr\b|learning rate|betas?|adam|optimi[sz]er)",
        r"(\blr\b|learning rate|betas?|adam|optimi[sz]er).{0,80}(lazy|ratio|not (adjusted|scaled|corrected)|d_reg|k ?/ ?\(k ?\+ ?1\))"],
    "stylegan2_lazy_r1.r1_grad_of_mean": [
        rf"({_R1}|autograd\.grad|grad_real|input grad\w*).{{0,80}}(\.mean\(\)|mean|\.sum\(\)|batch[_ ]size|per[- ]sample|b\^?2|squared)",
        r"(mean|averag\w*).{0,40}(instead of|rather than).{0,20}sum"],
    "stylegan2_lazy_r1.r1_without_zero_grad": [
        r"(zero_grad|zero[- ]?grad\w*|not zeroed|not cleared|not reset|stale (grad\w*|gradient)|leftover|left[- ]over|applied twice|re-?appl\w*)",
        r"(logistic|d[_ ]loss|adversarial|previous|d[- ]step|discriminator loss)\w*.{0,60}grad\w*.{0,60}(again|twice|re-?used|re-?appl\w*|accumulat\w*|added|leak\w*)"],
    "stylegan2_lazy_r1.r1_bypasses_ddp": [
        rf"({_R1}|\.module|inner module|unwrapped|bypass\w*).{{0,80}}({_AR}|ddp|not (synced|averaged|reduced)|{_LOCAL})",
        r"ddp.{0,80}(bypass\w*|\.module|unwrapped|skipp\w*|not used|outside|circumvent\w*)", _REPL],
    "stylegan2_lazy_r1.latents_seeded_per_rank": [
        rf"(latent\w*|noise|\bz\b|codes?|random\w*).{{0,80}}({_SEED}|per[- ]rank|each rank|rank[- ]seeded|rank[- ]dependent|seed ?\+ ?rank)",
        rf"{_SEED}.{{0,60}}(rank|per[- ]rank|each rank|global)", r"(rank|per[- ]rank)[- ](seed\w*|generator|rng)"],
    "stylegan2_lazy_r1.r1_on_fake": [
        rf"{_R1}.{{0,80}}(fake\w*|generated|g\(z\)|instead of (the )?real (images?|samples?|data|inputs?)|wrong (input|images?|samples?))",
        rf"(fake|generated) (images?|samples?).{{0,60}}{_R1}"],
    # accel_plateau_val
    "accel_plateau_val.val_in_train_mode": [
        rf"{_VAL}.{{0,80}}(train(ing)?[- ]mode|not (in )?eval\w*|without (model\.)?eval|dropout (active|on|enabled|applied))",
        r"(missing|without|no|forg\w*) (the )?(model\.)?eval\(?\)?", r"eval\(\).{0,40}(missing|not called|forg\w*)",
        r"dropout.{0,60}(during|in) (the )?(validat\w*|eval\w*)"],
    "accel_plateau_val.train_mode_not_restored": [
        r"(\.train\(\)|train(ing)?[- ]mode).{0,40}(not (restored|called|reset|re-?enabled|set back|switched back)|never (restored|called|set)|forg\w*)",
        r"(model\.)?train\(\)\s*(is )?(missing|never called|not called)", r"(stays?|left|remains?|stuck|runs?|continues?) in eval\w*",
        r"eval[- ]mode.{0,60}(training|rest of|for the (remaining|subsequent))", r"dropout.{0,60}(disabled|off|inactive).{0,40}(training|train)"],
    "accel_plateau_val.val_loss_not_gathered": [
        rf"({_VAL}|{_PLAT}).{{0,80}}({_LOCAL}|not (gathered|reduced|averaged|synced)|per[- ]rank|own)",
        rf"{_LR}s?.{{0,60}}(differ\w*|diverg\w*|per[- ]rank|each rank|not (the )?same)",
        rf"(not|never|no|without|missing) ({_GATHER}|{_AR}).{{0,60}}({_VAL}|loss)"],
    "accel_plateau_val.gather_counts_padding": [
        r"gather_for_metrics|gather for metrics",
        r"(pad\w*|duplicat\w*|repeat\w*|even_batches|extra samples|wrap\w*).{0,80}(val\w*|metric|loss|count\w*|includ\w*|sampl\w*)",
        r"(val\w*|metric|loss).{0,80}(pad\w*|duplicat\w*|repeat\w*|even_batches)"],
    "accel_plateau_val.plateau_scheduler_prepared": [
        rf"{_PLAT}.{{0,80}}(prepare\w*|acceleratedscheduler|num_processes|world[_ ]?size|number of (processes|ranks|gpus|devices)|twice|\d+ ?x|multiple times|w times|more than once|too (often|fast))",
        rf"prepare\w*.{{0,60}}{_PLAT}", r"acceleratedscheduler"],
    "accel_plateau_val.plateau_mode_max": [
        r"mode ?= ?['\"]?max", r"mode.{0,40}(\bmax\b|\bmin\b|wrong|invert\w*)", r"(\bmax\b|maximi[sz]\w*).{0,40}(mode|instead|loss)",
        rf"{_PLAT}.{{0,80}}(direction|sign|invert\w*|revers\w*|when (the )?(validation )?loss (improves|decreases|drops|falls))"],
    "accel_plateau_val.val_every_micro_batch_count": [
        rf"({_VAL}|{_PLAT}).{{0,80}}(micro[- ]?batch\w*|every (update|step|batch|iteration)|too (often|frequent\w*)|step counter|completed[_ ]steps|counter|interval|frequen\w*)",
        rf"(micro[- ]?batch\w*|batch (index|idx|counter)|step counter|completed[_ ]steps).{{0,80}}({_VAL}|{_PLAT})",
        r"(evaluat\w*|validat\w*|\beval\b).{0,80}(micro[- ]?batch\w*|too (often|frequent\w*)|completed[_ ]steps)"],
    # fabric_fp16_scaler
    "fabric_fp16_scaler.clip_before_unscale": [
        r"clip\w*.{0,80}(scaled grad\w*|before (the )?unscal\w*|unscal\w*|loss scale|scaler|fabric\.clip_gradients|clip_gradients)",
        r"unscal\w*.{0,60}(before|after|missing|clip\w*)", r"(scaled|unscaled) grad\w*.{0,60}clip\w*"],
    "fabric_fp16_scaler.onecycle_on_skipped_step": [
        rf"({_SCHED}|schedulers?).{{0,80}}(skip\w*|overflow\w*|\binf\w*|\bnan\b|not (taken|run|stepped)|optimizer_was_run|even when|although)",
        rf"(skip\w*|overflow\w*).{{0,80}}({_SCHED}|schedulers?)"],
    "fabric_fp16_scaler.onecycle_total_in_micro_batches": [
        rf"(total_steps|total steps|{_SCHED}|schedulers?).{{0,80}}(micro[- ]?batch\w*|accumulat\w*|too (slow\w*|long|many)|\d+ ?x|twice|length|number of (steps|updates))",
        rf"(micro[- ]?batch\w*|accumulat\w*).{{0,60}}(total_steps|total steps|one[_ ]?cycle|{_SCHED})"],
    "fabric_fp16_scaler.bn_not_synced": [
        rf"{_BN}.{{0,80}}({_LOCAL}|not (synced|synchroni[sz]ed)|sync[_ ]?batch[_ ]?norm|syncbn|per[- ]rank|local (batch|statistics|stats))",
        r"(sync[_ ]?batch[_ ]?norm|syncbn|convert_sync_batchnorm)", rf"(batch )?(statistics|stats|mean and var\w*).{{0,60}}({_LOCAL}|per[- ]rank)"],
    "fabric_fp16_scaler.sync_on_first_micro": [
        r"(no_backward_sync|no_sync|backward[_ ]sync|enabled).{0,80}(invert\w*|revers\w*|wrong|flip\w*|first|last|swap\w*|opposite)",
        rf"(last|final) micro[- ]?batch.{{0,80}}({_AR}|local|not (synced|reduced|averaged))", rf"grad\w*.{{0,60}}({_AR}).{{0,40}}(first|wrong) micro",
        rf"(accumulat\w*|micro[- ]?batch\w*).{{0,80}}{_AR}", _REPL],
    "fabric_fp16_scaler.loss_not_divided_by_accum": [
        rf"(accumulat\w*|acc(um)?[_ ]steps|micro[- ]?batch\w*).{{0,80}}(divid\w*|scal\w*|normali[sz]\w*|too (large|big)|twice|\d+ ?x|sum\w*)",
        r"(loss|grad\w*).{0,60}not (divided|normali[sz]ed|averaged).{0,40}(accumulat\w*|micro|steps)",
        r"(divid\w*|/).{0,30}(acc\w*|accumulat\w*).{0,30}(missing|forg\w*)"],
    "fabric_fp16_scaler.zero_grad_every_micro": [
        r"zero_grad.{0,80}(every|each|inside|within|per|before (each|every)|micro|accumulat\w*|loop)",
        r"(micro[- ]?batch\w*|accumulat\w*).{0,80}(zero\w*|cleared|reset|discard\w*|wiped|lost|overwrit\w*|only (the )?last)",
        r"only (the )?last micro[- ]?batch"],
}

assert set(EXPECTED) == set(RUBRIC)


def right(bug_id: str, cause: str | None) -> bool:
    """Whether the first cause (lower-cased) matches one of the bug's patterns."""
    if not cause:
        return False
    text = cause.lower()
    return any(re.search(p, text) for p in RUBRIC[bug_id])
