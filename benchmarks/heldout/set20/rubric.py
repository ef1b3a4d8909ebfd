"""The rubric of heldout20: per bug, the first cause a right diagnosis names (``EXPECTED``) and the regexes
that accept it (``RUBRIC``), applied lower-cased to the diagnosis's first "likely cause" line (the location
it names removed by the caller). Written from what each bug is, before any run of the plugin on this set,
and not changed after. A diagnosis is right when any of the bug's regexes matches.
"""
from __future__ import annotations

import re

EXPECTED = {
    # timm_cosine_accum
    "timm_cosine_accum.lr_scaled_by_local_batch": "the linear learning-rate scaling uses the per-process batch instead of the global batch (world size left out): the learning rate is W times too small",
    "timm_cosine_accum.t_in_epochs_left_true": "CosineLRScheduler is left with t_in_epochs=True while driven by step_update: the per-update schedule does nothing and the lr (warm-up included) only changes per epoch",
    "timm_cosine_accum.step_update_before_increment": "step_update(num_updates) is called before num_updates is incremented: the warm-up / cosine schedule lags one update (off by one)",
    "timm_cosine_accum.step_update_per_micro": "the scheduler's step_update is called every micro-batch (micro-batch counter) instead of once per optimizer update: the schedule runs accum_steps times too fast",
    "timm_cosine_accum.sampler_no_set_epoch": "DistributedSampler.set_epoch is not called: the second epoch replays the first epoch's shuffle",
    "timm_cosine_accum.no_sync_on_last_micro": "the no_sync condition is inverted: the last micro-batch's gradients are not all-reduced (the first one's are), so the accumulated gradients are not averaged across ranks (replicas diverge)",
    "timm_cosine_accum.train_mode_not_restored": "model.train() is not called again after validate(): the second epoch trains in eval mode (dropout off)",
    # expert_choice_ep
    "expert_choice_ep.router_grads_not_allreduced": "the router's gradient is not all-reduced across ranks with the other replicated parameters: each rank's router steps on its own tokens only (replicas diverge)",
    "expert_choice_ep.replicated_grads_averaged": "the replicated (non-expert) parameters' gradients are averaged (divided by W) after the all-reduce although the loss is already divided by W: they are W times too small",
    "expert_choice_ep.capacity_from_local_tokens": "the expert-choice capacity k is computed from the local token count instead of the global (gathered) token count: each expert picks too few tokens",
    "expert_choice_ep.combine_without_autograd": "the expert outputs are all-reduced outside autograd (in-place dist.all_reduce): the gradients from the other ranks' tokens never reach the experts / the gathered tokens",
    "expert_choice_ep.expert_init_per_rank_seed": "each rank initialises its local experts from its own seed instead of slicing the full model's expert weights",
    "expert_choice_ep.softmax_over_tokens": "the router softmax is taken over the tokens (dim 0) instead of over the experts",
    "expert_choice_ep.gates_not_applied": "the expert outputs are not multiplied by the gate values: the router gets no gradient",
    # llama_tp_hand
    "llama_tp_hand.embedding_mask_missing": "the vocab-parallel embedding does not zero (mask) the outputs of ids outside the rank's vocabulary shard before the all-reduce",
    "llama_tp_hand.copy_region_missing": "the column-parallel layers' input lacks copy_to_tensor_model_parallel_region (Megatron's f: all-reduce in backward): the input gradients are partial per rank, so the norms' / embedding gradients are wrong and differ between ranks",
    "llama_tp_hand.heads_per_partition_not_divided": "the number of attention heads per rank is not divided by the TP size: the local q/k/v are split into too many, too narrow heads (wrong head_dim / scale)",
    "llama_tp_hand.shard_init_per_rank_seed": "each rank initialises the model from its own seed (seed + rank) before taking its shards: the shards and the replicated parameters do not come from one model",
    "llama_tp_hand.clip_norm_not_allreduced": "the gradient-clipping norm is not all-reduced over the TP group: each rank clips with its local shards' norm only",
    "llama_tp_hand.silu_on_up": "the SwiGLU activation is applied to up_proj instead of gate_proj (silu(up) * gate)",
    "llama_tp_hand.row_parallel_not_reduced": "the row-parallel o_proj's partial outputs are not all-reduced before the residual add",
    # rdrop_fp16_ddp
    "rdrop_fp16_ddp.masks_seeded_per_rank": "the dropout masks are drawn from a per-rank seeded generator instead of the rank's rows of the global draw",
    "rdrop_fp16_ddp.lr_scaled_by_world": "the learning rate is multiplied by the world size (linear scaling) although the global batch is unchanged",
    "rdrop_fp16_ddp.loss_divided_by_world": "the loss is divided by the world size before backward although DDP already averages the gradients: they are W times too small",
    "rdrop_fp16_ddp.clip_before_unscale": "the gradients are clipped before scaler.unscale_ (clipping the loss-scaled gradients): clipping is far too strong",
    "rdrop_fp16_ddp.scheduler_before_optimizer": "the lr scheduler is stepped before the optimizer step: each update uses the next step's learning rate (one step ahead)",
    "rdrop_fp16_ddp.same_mask_both_passes": "both R-Drop forward passes use the same dropout mask: the KL consistency term vanishes",
    "rdrop_fp16_ddp.kl_reduction_mean": "F.kl_div uses reduction='mean' instead of 'batchmean': the KL term is also divided by the number of classes",
    # memory_bank_nce
    "memory_bank_nce.bank_update_local_only": "the memory bank is updated only with the rank's own features / indices (not all-gathered): the ranks' banks differ",
    "memory_bank_nce.negatives_seeded_per_rank": "the negative indices are drawn from a per-rank seeded generator instead of the rank's rows of the global draw",
    "memory_bank_nce.bank_update_before_loss": "the memory bank is updated with the current features before the loss is computed (the positives are the current features)",
    "memory_bank_nce.momentum_on_wrong_side": "the bank's momentum update has m and 1 - m swapped: the new features get the momentum weight",
    "memory_bank_nce.bank_not_renormalized": "the updated memory-bank rows are not re-normalised to unit length",
    "memory_bank_nce.instance_index_local": "the instance index is the sample's local position in the rank's batch instead of its dataset index: the ranks read / write the wrong bank entries",
    "memory_bank_nce.features_not_normalized": "the encoder features are not L2-normalised before the dot products with the bank",
    # hf_gpt2_poly_accum
    "hf_gpt2_poly_accum.pad_labels_not_masked": "the padding positions' labels are not set to -100: the loss includes the pad tokens",
    "hf_gpt2_poly_accum.labels_shifted_twice": "the labels are shifted by hand and again inside the model: the targets are two tokens ahead",
    "hf_gpt2_poly_accum.clip_every_micro": "clip_grad_norm_ is called after every micro-batch's backward, clipping the partial accumulated (local) gradient, instead of once before the optimizer step",
    "hf_gpt2_poly_accum.scheduler_stepped_per_micro": "the lr scheduler is stepped every micro-batch instead of once per optimizer update: the warm-up / decay run too fast",
    "hf_gpt2_poly_accum.missing_distributed_sampler": "no DistributedSampler: every rank iterates the same (whole) dataset, so all ranks train on the same rows",
    "hf_gpt2_poly_accum.total_steps_from_unsharded_loader": "num_training_steps is computed from the unsharded dataloader (before sharding across ranks): the polynomial schedule is W times too long",
    "hf_gpt2_poly_accum.sync_on_first_micro": "the no_sync condition is inverted: the last micro-batch's gradients are not all-reduced, so the accumulated gradients are not averaged across ranks (replicas diverge)",
}

_AR = r"(all[_ -]?reduc\w*|allreduc\w*|reduce[_ ]mean|synchroni[sz]\w*|sync\w*)"
_GATHER = r"(all[_ -]?gather\w*|allgather\w*|gather\w*)"
_LR = r"(learning[ -]rate|\blr\b)"
_SCHED = r"(schedul\w*|warm[- ]?up|cosine|poly\w*|decay|anneal\w*|step_update)"
_LOCAL = r"(local\w*|per[- ]rank|each rank|own rank|this rank|rank'?s own|not (global|all[_ -]?reduc\w*|reduced|synchroni[sz]ed|averaged|gathered|summed)|instead of (the )?global)"
_WORLD = r"(world[_ ]?size|\bw\b|number of (ranks|processes|replicas|workers|gpus|devices)|num[_ ]?(ranks|processes|replicas)|num_processes|ranks)"
_SEED = r"(seed\w*|generator|rng|random (state|stream|draw|noise)|different (noise|draws?|random))"
_REPL = r"replicas? (diverge\w*|differ\w*|drift\w*|disagree\w*|out of sync)"
_MICRO = r"(micro[- ]?batch\w*|accumulat\w*|every (batch|iteration|forward|backward)|each (batch|iteration|backward))"
_NOSYNC = [
    r"(no_sync|no[_ ]sync|need_update|backward[_ ]sync).{0,80}(invert\w*|revers\w*|wrong|flip\w*|first|last|swap\w*|opposite)",
    rf"(last|final) micro[- ]?batch.{{0,80}}({_AR}|local|not (synced|reduced|averaged))",
    rf"grad\w*.{{0,60}}{_AR}.{{0,40}}(first|wrong) micro",
    rf"(not|never) (be(ing)? )?{_AR}.{{0,40}}(on|for|in|after|at) (the )?(last|final) micro", _REPL]
_PER_RANK_DRAW = r"(per[- ]rank|each rank|rank[- ]seeded|rank[- ]dependent|seed ?\+ ?rank|(own|different) (seed|generator|rng)|instead of (the )?(rank'?s )?(rows|slice) of (the )?global)"

RUBRIC = {
    # timm_cosine_accum
    "timm_cosine_accum.lr_scaled_by_local_batch": [
        rf"({_LR}|lr scal\w*|linear scal\w*).{{0,80}}({_WORLD}|global batch|per[- ](process|rank|device) batch|local batch|too small|\d+ ?x|half|halved)",
        rf"(global[_ ]batch[_ ]size|batch[- ]size scal\w*|linear scal\w*).{{0,60}}({_WORLD}|local|per[- ](process|rank|device)|missing|omit\w*|left out)"],
    "timm_cosine_accum.t_in_epochs_left_true": [
        r"t_in_epochs", rf"(step_update|per[- ]update|per[- ]iteration).{{0,80}}(no[- ]?op|nothing|ignored|no effect|not (applied|used|effective))",
        rf"({_SCHED}|schedulers?|{_LR}).{{0,80}}(per[- ]epoch|(in|by|every) epochs?|epoch[- ](based|level|granular\w*)|only (changes|moves|updates) (at|per|each) epoch)"],
    "timm_cosine_accum.step_update_before_increment": [
        r"off[- ]by[- ]one",
        rf"({_SCHED}|schedulers?|step_update|num_updates).{{0,80}}(lag\w*|one (step|update) (behind|late)|before (the )?incr\w*|incremented after|stale|previous (step|update))",
        rf"num_updates.{{0,60}}(before|after|order\w*)"],
    "timm_cosine_accum.step_update_per_micro": [
        rf"({_SCHED}|schedulers?|step_update).{{0,80}}({_MICRO}|too (fast|often|quick\w*)|twice|\d+ ?x)",
        rf"{_MICRO}.{{0,60}}({_SCHED}|schedulers?|step_update)"],
    "timm_cosine_accum.sampler_no_set_epoch": [
        r"set_epoch", r"(sampler|shuffl\w*|permutation|data order).{0,80}(same (every|each|across|for all) epochs?|epoch|repeat\w*|replay\w*|not (re-?)?shuffl\w*)",
        r"(epoch|epochs).{0,60}(same (order|shuffle|permutation|samples|data)|replay\w*|repeat\w*)"],
    "timm_cosine_accum.no_sync_on_last_micro": _NOSYNC,
    "timm_cosine_accum.train_mode_not_restored": [
        r"(\.train\(\)|train(ing)?[- ]mode).{0,40}(not (restored|called|reset|re-?enabled|set back|switched back)|never (restored|called|set)|forg\w*|missing)",
        r"(model\.)?train\(\)\s*(is )?(missing|never called|not called)", r"(stays?|left|remains?|stuck|runs?|continues?|trains?) in eval\w*",
        r"eval[- ]mode.{0,60}(training|rest of|second epoch|after (the )?(validat\w*|eval\w*))",
        r"dropout.{0,60}(disabled|off|inactive|missing).{0,60}(training|train|epoch|after)"],
    # expert_choice_ep
    "expert_choice_ep.router_grads_not_allreduced": [
        rf"(router|gate|gating|routing)\w*.{{0,80}}({_AR}|{_LOCAL}|own tokens|not (summed|reduced))",
        rf"(not|never|no|without|missing|skip\w*) (the )?{_AR}.{{0,60}}(router|gat\w*|routing)"],
    "expert_choice_ep.replicated_grads_averaged": [
        rf"(replicated|non[- ]expert|shared|dense|data[- ]parallel)\w* (param\w*|grad\w*|weights?).{{0,80}}(averag\w*|divid\w*|too small|\d+ ?x|{_WORLD}|twice|double)",
        rf"(averag\w*|divid\w*) (by )?({_WORLD}).{{0,80}}(twice|again|already|double|replicated|non[- ]expert|loss)",
        r"(double|twice)[- ]?(averag\w*|divid\w*|normali[sz]\w*|scal\w*)"],
    "expert_choice_ep.capacity_from_local_tokens": [
        r"(capacity|\bk\b|top[- ]?k|tokens per expert|expert[- ]choice).{0,80}(local|per[- ]rank|global|gathered|too (few|small)|token count|number of tokens)",
        r"(local|per[- ]rank) (token )?(count|number of tokens).{0,60}(capacity|\bk\b|top[- ]?k)"],
    "expert_choice_ep.combine_without_autograd": [
        rf"{_AR}.{{0,80}}(autograd|in[- ]place|no grad\w*|without grad\w*|not differentiable|non[- ]?differentiable|detach\w*|backward)",
        rf"(expert|combine\w*|output)\w*.{{0,80}}(grad\w*).{{0,80}}(other ranks|remote|missing|partial|{_LOCAL}|own tokens)",
        rf"(no|without|missing|lost|drop\w*) (autograd|gradient\w*).{{0,60}}({_AR}|combine|other ranks)"],
    "expert_choice_ep.expert_init_per_rank_seed": [
        rf"(expert\w*).{{0,80}}(init\w*|seed\w*|weights?).{{0,60}}({_PER_RANK_DRAW}|rank|slice|shard|differ\w*|not (the )?same)",
        rf"(init\w*|seed\w*).{{0,60}}({_PER_RANK_DRAW}).{{0,60}}(expert|shard|weights?)",
        r"(shard|slice)\w*.{0,60}(full|global) (model|init\w*|weights?)"],
    "expert_choice_ep.softmax_over_tokens": [
        r"softmax.{0,80}(dim|axis|tokens|over the (wrong|token)|wrong (dim|axis)|dimension)",
        r"(router|gate|affinit\w*|routing) (prob\w*|scores?|weights?).{0,80}(normali[sz]\w* (over|along) (the )?(tokens|wrong)|wrong (dim\w*|axis))"],
    "expert_choice_ep.gates_not_applied": [
        r"(gate|gating|router) (value|weight|prob\w*|score)s?.{0,80}(not (applied|multiplied|used)|missing|ignor\w*|dropp\w*|omit\w*)",
        r"(not|never|without) (multipl\w*|scal\w*|weight\w*) (by )?(the )?(gate|gating|router)",
        r"(router|gate|gating)\w*.{0,60}(no|zero|none|missing) grad\w*", r"ungated"],
    # llama_tp_hand
    "llama_tp_hand.embedding_mask_missing": [
        r"(embedding|vocab)\w*.{0,80}(mask\w*|out[- ]of[- ]range|outside|not zeroed|zero\w*|other shards?|row 0|index 0)",
        r"(mask\w*|out[- ]of[- ]range ids?|ids outside).{0,60}(embedding|vocab|shard|zero\w*)"],
    "llama_tp_hand.copy_region_missing": [
        r"(copy_to_tensor_model_parallel_region|copy[_ ]to[_ ]\w*region|megatron'?s f\b|\bf\b (operator|function|op)|identity.{0,20}all[- ]?reduc\w* (in|on) backward)",
        rf"(column[- ]?parallel|q_proj|gate_proj|up_proj|input)\w*.{{0,80}}(grad\w*).{{0,80}}({_AR}|partial|{_LOCAL}|missing|not (summed|reduced))",
        rf"(backward|input grad\w*).{{0,60}}(not|never|missing|without) (be(ing)? )?{_AR}",
        rf"(norm|rmsnorm|layer[_ ]?norm|embedding)\w* grad\w*.{{0,80}}(partial|{_LOCAL}|differ\w*|rank)"],
    "llama_tp_hand.heads_per_partition_not_divided": [
        r"(heads?|num_heads|num_attention_heads|head[_ ]dim|head width)\w*.{0,80}(per[- ](partition|rank)|not divided|divid\w*|tp (size|degree)|world|too (many|narrow|small)|shard\w*|wrong)",
        r"(attention )?scal(e|ing).{0,60}(head[_ ]dim|sqrt|wrong)"],
    "llama_tp_hand.shard_init_per_rank_seed": [
        rf"(init\w*|seed\w*|weights?|shards?).{{0,80}}({_PER_RANK_DRAW}|seed ?\+ ?rank|rank[- ]dependent|differ\w* (between|across|per) ranks?|not (from )?(the )?same (model|seed|init\w*))",
        rf"(seed ?\+ ?rank|per[- ]rank seed\w*|rank[- ]dependent seed\w*)",
        r"(replicated|lm_head|norm)\w* (param\w*|weights?).{0,60}differ\w*.{0,40}(init\w*|start|step 0|before)"],
    "llama_tp_hand.clip_norm_not_allreduced": [
        rf"(grad\w* norm|norm|clip\w*).{{0,80}}({_AR}|{_LOCAL}|local shards?|tp group|tensor[- ]parallel group|too (small|weak|low)|under[- ]?clip\w*|per[- ]rank)",
        rf"(not|never|no|without|missing) {_AR}.{{0,60}}(norm|clip\w*)"],
    "llama_tp_hand.silu_on_up": [
        r"(silu|swiglu|activation|gate_proj|up_proj|glu)\w*.{0,80}(up_proj|up projection|wrong (branch|projection|input|side)|swap\w*|instead of (the )?gate|gate and up|revers\w*)",
        r"(swap\w*|revers\w*).{0,40}(gate|up)"],
    "llama_tp_hand.row_parallel_not_reduced": [
        rf"(row[- ]?parallel|o_proj|attention output|output proj\w*)\w*.{{0,80}}(not (all[_ -]?)?reduc\w*|{_AR}|partial|missing|{_LOCAL}|not summed)",
        rf"(not|never|no|without|missing) (the )?{_AR}.{{0,60}}(o_proj|row[- ]?parallel|attention output|partial output)",
        r"reduce_from_tensor_model_parallel_region|megatron'?s g\b"],
    # rdrop_fp16_ddp
    "rdrop_fp16_ddp.masks_seeded_per_rank": [
        rf"(dropout|mask\w*|keep[- ]?mask\w*).{{0,80}}({_SEED}|{_PER_RANK_DRAW})",
        r"(rank|per[- ]rank)[- ](seed\w*|generator|rng)"],
    "rdrop_fp16_ddp.lr_scaled_by_world": [
        rf"{_LR}.{{0,80}}({_WORLD}|linear scal\w*|scaled|too (large|high|big)|\d+ ?x|twice|doubled)",
        rf"(linear scal\w*|scal\w* rule).{{0,60}}({_LR}|{_WORLD})"],
    "rdrop_fp16_ddp.loss_divided_by_world": [
        rf"(loss|grad\w*).{{0,80}}(divid\w*|scal\w*|normali[sz]\w*).{{0,60}}({_WORLD}|twice|double|already averag\w*)",
        rf"(grad\w*|loss).{{0,60}}(too small|\d+ ?x (too )?small|halved|half)",
        r"(double|twice)[- ]?(averag\w*|divid\w*|normali[sz]\w*)", r"ddp (already )?averag\w*"],
    "rdrop_fp16_ddp.clip_before_unscale": [
        r"clip\w*.{0,80}(scaled grad\w*|before (the )?unscal\w*|unscal\w*|loss scale|scaler)",
        r"unscal\w*.{0,60}(before|after|missing|clip\w*)", r"(scaled|unscaled) grad\w*.{0,60}clip\w*"],
    "rdrop_fp16_ddp.scheduler_before_optimizer": [
        rf"({_SCHED}|schedulers?).{{0,80}}(before (the )?(optimi[sz]er|scaler)|order\w*|ahead|one step (early|ahead)|next step|too early)",
        rf"(optimi[sz]er|scaler)[._ ]?step.{{0,60}}(after|before).{{0,40}}({_SCHED}|schedulers?)", r"off[- ]by[- ]one"],
    "rdrop_fp16_ddp.same_mask_both_passes": [
        r"(dropout|mask\w*).{0,80}(same|identical|reus\w*|shared|both (passes|forward\w*)|second pass|not (re-?drawn|different))",
        r"(kl|consistency|r-?drop)\w*.{0,80}(zero|vanish\w*|no effect|identical|same)",
        r"(both|two) (forward )?pass\w*.{0,60}(same|identical)"],
    "rdrop_fp16_ddp.kl_reduction_mean": [
        r"(kl|kl_div|kullback)\w*.{0,80}(reduction|batchmean|\bmean\b|number of classes|divid\w*|normali[sz]\w*|too (small|weak))",
        r"batchmean"],
    # memory_bank_nce
    "memory_bank_nce.bank_update_local_only": [
        rf"(memory[- ]?bank|bank|memory)\w*.{{0,80}}({_LOCAL}|{_GATHER}|own (features|rows|indices)|other ranks|differ\w* (between|across|per) ranks?|per[- ]rank)",
        rf"(not|never|no|without|missing) ({_GATHER}|{_AR}).{{0,60}}(features|indices|bank|memory)"],
    "memory_bank_nce.negatives_seeded_per_rank": [
        rf"(negative\w*|neg[_ ]?idx|noise (samples|indices)|sampled indices).{{0,80}}({_SEED}|{_PER_RANK_DRAW})",
        r"(rank|per[- ]rank)[- ](seed\w*|generator|rng)"],
    "memory_bank_nce.bank_update_before_loss": [
        r"(memory[- ]?bank|bank|memory)\w*.{0,80}(updat\w*|writ\w*|overwrit\w*).{0,60}(before|prior to|ahead of).{0,40}(loss|forward|logits|backward)",
        r"(bank|memory)\w*.{0,60}(order\w*|too early|stale|current features)",
        r"positives?.{0,80}(current|own|itself|same) (feature|sample|output)"],
    "memory_bank_nce.momentum_on_wrong_side": [
        r"(momentum|\bm\b|ema).{0,80}(swap\w*|wrong side|revers\w*|invert\w*|1 ?- ?m|complement|new features)",
        r"(bank|memory) updat\w*.{0,80}(momentum|weight\w*|coefficient|mix\w*).{0,40}(swap\w*|wrong|revers\w*|invert\w*)"],
    "memory_bank_nce.bank_not_renormalized": [
        r"(bank|memory)\w*.{0,80}(re-?normali[sz]\w*|not normali[sz]\w*|unit (length|norm)|l2)",
        r"re-?normali[sz]\w*.{0,60}(bank|memory|after (the )?(momentum|update))",
        r"normali[sz]\w* (the )?(updated )?(bank|memory)"],
    "memory_bank_nce.instance_index_local": [
        r"(instance|sample|dataset|bank) (index|indices|idx).{0,80}(local|position|arange|offset|wrong|not (the )?(global|dataset))",
        r"(index|indices|idx).{0,60}(local (position|batch)|arange|position in (the )?(local|rank)|not (the )?(global|dataset) (index|indices))",
        r"(local|position) (index|indices|idx).{0,60}(instead|bank|global|dataset)",
        r"(wrong|same|first) (bank )?(entries|rows|slots).{0,60}(bank|memory|index)"],
    "memory_bank_nce.features_not_normalized": [
        r"(feature\w*|embedding\w*|output\w*|encoder)\w*.{0,80}(not (l2[- ]?)?normali[sz]\w*|unnormali[sz]\w*|l2|unit (length|norm)|normali[sz]ation (missing|omitted))",
        r"(missing|no|without|forg\w*) (the )?(l2[- ]?)?normali[sz]\w*"],
    # hf_gpt2_poly_accum
    "hf_gpt2_poly_accum.pad_labels_not_masked": [
        r"(pad\w*|padding).{0,80}(label\w*|-100|ignore\w*|masked|included|loss|trained)",
        r"(label\w*).{0,80}(pad\w*|-100|ignore[_ ]index)"],
    "hf_gpt2_poly_accum.labels_shifted_twice": [
        r"(label\w*|target\w*).{0,80}(shift\w* (twice|again|by hand|manually|two|2)|double[- ]shift\w*|two (tokens|positions) ahead|off by (one|two))",
        r"(shift\w*).{0,60}(twice|double|again|both|two)", r"double[- ]shift\w*"],
    "hf_gpt2_poly_accum.clip_every_micro": [
        rf"clip\w*.{{0,80}}({_MICRO}|partial|before (the )?(accumulat\w*|last|all)|inside (the )?(accumulat\w*|loop)|local|unsynced)",
        rf"{_MICRO}.{{0,60}}clip\w*"],
    "hf_gpt2_poly_accum.scheduler_stepped_per_micro": [
        rf"({_SCHED}|schedulers?).{{0,80}}({_MICRO}|too (fast|often|quick\w*)|twice|\d+ ?x)",
        rf"{_MICRO}.{{0,60}}({_SCHED}|schedulers?)"],
    "hf_gpt2_poly_accum.missing_distributed_sampler": [
        r"(distributedsampler|distributed sampler)",
        r"(data|batch\w*|rows|samples|dataset|loader|dataloader).{0,80}(same (on|for|across) (every|all|each) (rank|process|replica|worker)s?|identical|duplicat\w*|not (sharded|split|distributed|partitioned)|unsharded|whole dataset)",
        r"(all|every|each) (the )?(ranks?|process\w*|replicas?|workers?).{0,60}(same|identical) (batch\w*|rows|samples|data)",
        r"(sampler|shard\w*).{0,60}(missing|absent|not used|without)"],
    "hf_gpt2_poly_accum.total_steps_from_unsharded_loader": [
        rf"(num_training_steps|total[_ ](training[_ ])?steps|schedule (length|horizon)|max_train_steps|{_SCHED}|schedulers?).{{0,80}}(unsharded|before (shard\w*|prepare|distribut\w*)|{_WORLD}|full dataset|whole dataset|too (long|slow\w*|many))",
        rf"(unsharded|full|whole) (data ?loader|dataset).{{0,60}}({_SCHED}|schedulers?|total|steps)"],
    "hf_gpt2_poly_accum.sync_on_first_micro": _NOSYNC,
}

assert set(EXPECTED) == set(RUBRIC)


def right(bug_id: str, cause: str | None) -> bool:
    """Whether the first cause (lower-cased) matches one of the bug's patterns."""
    if not cause:
        return False
    text = cause.lower()
    return any(re.search(p, text) for p in RUBRIC[bug_id])
