"""The rubric of heldout16: per bug, the first cause a right diagnosis names (``EXPECTED``) and the regexes
that accept it (``RUBRIC``), applied lower-cased to the diagnosis's first "likely cause" line (the location
it names removed by the caller). Written from what each bug is, before any run of the plugin on this set,
and not changed after. A diagnosis is right when any of the bug's regexes matches.
"""
from __future__ import annotations

import re

EXPECTED = {
    # hf_bert_accum
    "hf_bert_accum.sched_per_micro": "the lr scheduler is stepped on every micro-batch instead of every optimizer update: the warm-up/cosine schedule runs ACC times too fast",
    "hf_bert_accum.sched_before_opt_step": "scheduler.step() runs before optimizer.step(): each update uses the next step's learning rate",
    "hf_bert_accum.mask_from_pad_id": "the attention mask is built from input_ids != pad id while real tokens share the pad id: real tokens are masked",
    "hf_bert_accum.mask_and_token_types_swapped": "the attention mask and the token type ids are swapped (positional arguments in the wrong order)",
    "hf_bert_accum.left_padding_cls_pooling": "the batch is left-padded while BERT pools the first ([CLS]) position: the pooled token is padding",
    "hf_bert_accum.head_reinit_after_ddp": "the classifier head is re-initialised per rank after the DDP wrap (after DDP's broadcast): the ranks' heads differ",
    "hf_bert_accum.accum_step_off_by_one": "the gradient-accumulation update condition is off by one (step % ACC == 0): updates happen after the wrong micro-batches",
    # megatron_tp
    "megatron_tp.f_no_allreduce_bwd": "the f (copy-to-tensor-parallel-region) operator does not all-reduce the input gradient in backward",
    "megatron_tp.g_allreduce_bwd_too": "the g (reduce-from-tensor-parallel-region) operator all-reduces in backward too: gradients W times too large",
    "megatron_tp.row_bias_before_reduce": "the row-parallel layer adds its bias before the all-reduce: the bias is counted W times",
    "megatron_tp.num_heads_not_divided": "the number of attention heads per rank is not divided by the tensor-parallel size: wrong head dimension and scale",
    "megatron_tp.replicated_grad_allreduced": "the replicated parameters' (LayerNorm, head) gradients are all-reduced (summed) across the tensor-parallel ranks",
    "megatron_tp.shard_init_same_seed": "the shards are initialised from the same seed on every rank instead of being sliced from the master weight",
    "megatron_tp.attn_out_not_reduced": "the attention output projection (row-parallel) is not all-reduced: each rank keeps a partial sum",
    # fabric_gpt_accum
    "fabric_gpt_accum.loss_not_scaled_by_accum": "the loss is not divided by the gradient-accumulation steps: the gradient is the sum over micro-batches",
    "fabric_gpt_accum.lr_lambda_returns_lr": "the LambdaLR lambda returns a learning rate instead of a multiplicative factor: the base lr is applied twice",
    "fabric_gpt_accum.backward_sync_never": "no_backward_sync is enabled on every micro-batch (the last included): the gradients are never all-reduced",
    "fabric_gpt_accum.no_zero_grad": "optimizer.zero_grad() is missing: gradients accumulate across optimizer steps",
    "fabric_gpt_accum.batch_seed_per_rank": "each rank draws its own batch from a rank-seeded generator instead of its rows of the global batch",
    "fabric_gpt_accum.causal_mask_missing": "the causal mask is missing (is_causal not set): tokens attend to future tokens",
    "fabric_gpt_accum.labels_not_shifted": "the language-model labels are not shifted: the loss predicts the current token instead of the next",
    # timm_vit_ema
    "timm_vit_ema.label_smoothing_missing": "the loss is plain cross entropy: label smoothing is missing",
    "timm_vit_ema.t_initial_in_epochs": "the cosine scheduler's t_initial is in epochs while it is stepped per update (step_update): the schedule is too short",
    "timm_vit_ema.ema_step_in_epochs": "the EMA update gets the epoch instead of the update count as its step: the EMA decay warm-up stays at 0 (EMA = copy of the model)",
    "timm_vit_ema.ema_update_in_validation": "the EMA is updated an extra time in the validation pass",
    "timm_vit_ema.kl_mean_not_batchmean": "the distillation KL divergence uses reduction='mean' instead of 'batchmean': the term is divided by the number of classes",
    "timm_vit_ema.kl_direction_reversed": "the KL divergence's arguments are swapped (teacher log-probs as input, student probs as target)",
    "timm_vit_ema.kl_missing_t_squared": "the distillation loss is not multiplied by the temperature squared (T**2)",
    # moe_top1_capacity
    "moe_top1_capacity.capacity_from_local_batch": "the expert capacity (and token positions) is computed from the rank's local batch instead of the global batch: different tokens are dropped",
    "moe_top1_capacity.aux_f_local": "the load-balancing loss's per-expert token fraction is counted locally (not all-reduced over the ranks)",
    "moe_top1_capacity.aux_missing_num_experts": "the load-balancing loss lacks the num_experts factor: the auxiliary-loss coefficient is E times too small",
    "moe_top1_capacity.router_grads_summed": "the router's (replicated) gradients are summed over the ranks but not divided by the world size",
    "moe_top1_capacity.combine_without_gate": "the expert outputs are combined without the gate (router probability) weights",
    "moe_top1_capacity.recv_reshape_without_transpose": "the tokens received by the all-to-all are reshaped to the local experts without the transpose: tokens go to the wrong expert",
    "moe_top1_capacity.jitter_seed_per_rank": "the router's jitter noise is drawn per rank (rank-seeded) instead of from the global batch's draw",
    # pipeline_gpipe
    "pipeline_gpipe.recv_no_requires_grad": "the received activation does not require grad: no gradient is sent back, the earlier stages do not learn",
    "pipeline_gpipe.loss_not_divided_by_microbatches": "the micro-batch loss is not divided by the number of micro-batches: gradients M times too large",
    "pipeline_gpipe.send_pre_activation": "a stage sends the wrong tensor downstream: the pre-activation (before tanh) instead of its output",
    "pipeline_gpipe.recv_buffer_reused": "the receive buffer is reused for every micro-batch: the saved activations alias the last micro-batch's",
    "pipeline_gpipe.backward_order_mismatch": "the backward micro-batch order differs between stages (reversed on the last, FIFO on the others): gradients are matched to the wrong micro-batch",
    "pipeline_gpipe.label_micro_offset": "the last stage uses the labels of the wrong micro-batch (offset by one)",
    "pipeline_gpipe.init_seed_per_stage": "each stage initialises its layers with its own seed instead of the shared model's weights",
}

_AR = r"(all[_ -]?reduc\w*|allreduc\w*)"
_LR = r"(learning[ -]rate|\blr\b)"
_SAME = r"(same|identical|duplicat\w*|every rank|each rank|per[- ]rank|rank[- ]seed\w*|seed\w*|rng|generator)"
_SCHED = r"(schedul\w*|warm[- ]?up|cosine|lambdalr|lr[_ ]lambda|decay|t_initial|step_update)"
_MICRO = r"(micro[- ]?batch\w*|accumulat\w*)"
_MASK = r"(attention[_ -]?mask|attn[_ -]?mask|\bmask\w*)"
_EMA = r"(\bema\b|model[_ ]?ema|moving average|teacher|averaged (model|weights))"
_KL = r"(kl\b|kl[_ ]div\w*|kullback|distill\w*|soft[- ]?target\w*)"
_GRAD = r"(grad\w*)"
_SCALE = r"(scal\w*|divid\w*|averag\w*|normali[sz]\w*|too (large|big|small)|double\w*|twice|\d+ ?x|times|factor|sum\w*)"
_REPL = r"replicas? (diverge\w*|differ\w*|drift\w*|disagree\w*|out of sync)"
_DATA = r"(input|data|batch|rows?|samples?)"

RUBRIC = {
    # hf_bert_accum
    "hf_bert_accum.sched_per_micro": [
        rf"{_SCHED}.{{0,80}}({_MICRO}|every (micro|backward|forward|iteration|batch)|too (fast|often|many)|per[- ]micro)",
        rf"{_MICRO}.{{0,60}}{_SCHED}", rf"{_LR}.{{0,60}}(schedul\w*|too (fast|low|small|early)|decay\w* (too )?fast)"],
    "hf_bert_accum.sched_before_opt_step": [
        rf"{_SCHED}.{{0,80}}(before|order\w*|ahead|early|off[- ]by[- ]one|one step)", rf"(before|order\w*).{{0,40}}(optimi[sz]er|opt)\.?\s?step.{{0,40}}{_SCHED}",
        rf"{_LR}.{{0,60}}(one step (ahead|early|late)|shift\w*|off[- ]by[- ]one|next step)", r"scheduler\.step\(\).{0,40}before"],
    "hf_bert_accum.mask_from_pad_id": [
        rf"{_MASK}.{{0,80}}(pad[_ ]?(token)?[_ ]?id|input[_ ]ids|token (id )?0|real tokens?|collid\w*|wrong|built|derived|computed)",
        rf"pad[_ ]?(token)?[_ ]?id.{{0,60}}({_MASK}|collid\w*|real token|vocab\w*)", r"real tokens?.{0,40}(masked|hidden|ignored)"],
    "hf_bert_accum.mask_and_token_types_swapped": [
        rf"({_MASK}|token[_ ]type\w*).{{0,80}}(swap\w*|order\w*|position\w*|mix\w*|confus\w*|wrong argument|revers\w*|token[_ ]type|mask)",
        r"token[_ ]type[_ ]?ids?", r"(positional|argument)s?.{0,40}(order|swap\w*|wrong)"],
    "hf_bert_accum.left_padding_cls_pooling": [
        r"(left[- ]pad\w*|padding[_ ]side|pad\w* (on|to) the left)", rf"(pool\w*|cls|\[cls\]|first (token|position)).{{0,60}}(pad\w*)",
        rf"pad\w*.{{0,60}}(pool\w*|cls|\[cls\]|first (token|position))"],
    "hf_bert_accum.head_reinit_after_ddp": [
        r"(head|classifier).{0,80}(re-?init\w*|reset\w*|after (the )?ddp|per[- ]rank|differ\w*|diverge\w*|not (broadcast|synchroni[sz]ed))",
        r"(re-?init\w*|reset_parameters).{0,60}(after|ddp|broadcast|rank)", r"(init\w*|weights?).{0,60}(after (the )?ddp|not broadcast|differ\w* (across|between|per) ranks?)",
        _REPL],
    "hf_bert_accum.accum_step_off_by_one": [
        rf"{_MICRO}.{{0,80}}(off[- ]by[- ]one|condition|boundar\w*|wrong (step|micro|batch)|modulo|%|misalign\w*|straddl\w*|index)",
        r"off[- ]by[- ]one", rf"(update|optimi[sz]er step|step) (condition|boundar\w*).{{0,60}}", rf"(step|update)\w*.{{0,40}}(after the (first|wrong) micro)"],
    # megatron_tp
    "megatron_tp.f_no_allreduce_bwd": [
        rf"(\bf\b|copy[_ ]to|copytomodelparallelregion|identity[- ]forward|enter\w*).{{0,80}}(backward|{_AR}|grad\w*)",
        rf"(input|layer ?norm|ln\w*) (grad\w*).{{0,60}}(not {_AR}|partial|missing|local|only)",
        rf"(backward|grad\w*).{{0,60}}(not {_AR}|missing (the )?{_AR}|without (an? )?{_AR}|no {_AR})"],
    "megatron_tp.g_allreduce_bwd_too": [
        rf"(\bg\b|reduce[_ ]from|reducefrommodelparallelregion|{_AR}).{{0,80}}(backward|bwd).{{0,60}}({_AR}|twice|again|too|also|extra|double|\d+ ?x|times)",
        rf"(extra|double|redundant|second|additional) {_AR}.{{0,60}}(backward|grad\w*)", rf"{_GRAD}.{{0,60}}(tensor[- ]parallel|parallel region|sharded|shard).{{0,60}}{_SCALE}",
        rf"{_GRAD}.{{0,40}}(w|world|tp)[- ]?(size )?times"],
    "megatron_tp.row_bias_before_reduce": [
        r"bias.{0,80}(before|twice|w times|multiple times|each rank|every rank|counted|per rank|duplicat\w*|all[_ -]?reduc\w*)",
        rf"(row[- ]parallel|rowparallel).{{0,60}}bias", rf"{_AR}.{{0,60}}bias"],
    "megatron_tp.num_heads_not_divided": [
        r"(heads?|num[_ ]attention[_ ]heads|num[_ ]heads).{0,80}(divid\w*|per (rank|partition)|tensor[- ]parallel|tp|split|world|global|local|wrong|dim\w*|width|size)",
        r"head[_ ]?(dim|size|width).{0,40}(wrong|mismatch|too small|differ\w*)", r"(softmax|attention) scal\w*"],
    "megatron_tp.replicated_grad_allreduced": [
        rf"(replicated|layer ?norm|ln\w*|head|non[- ]parallel|shared).{{0,80}}({_GRAD}).{{0,60}}({_AR}|sum\w*|{_SCALE}|data[- ]parallel)",
        rf"({_AR}|sum\w*).{{0,60}}(replicated|layer ?norm|ln\w*|head)", rf"(tensor[- ]parallel|tp) (group|ranks).{{0,60}}(data[- ]parallel|{_AR}|averag\w*)",
        rf"(extra|redundant|spurious|double|unneeded|unnecessary) {_AR}"],
    "megatron_tp.shard_init_same_seed": [
        rf"(shard\w*|partition\w*|slice\w*).{{0,80}}(init\w*|seed\w*|master|same|identical|copies|duplicat\w*)",
        rf"(init\w*|seed\w*).{{0,60}}(shard\w*|partition\w*|slice\w*|same|identical|rank|master)", r"master weight"],
    "megatron_tp.attn_out_not_reduced": [
        rf"(attention|attn|out(put)? proj\w*|o[_ ]proj|dense|row[- ]parallel).{{0,80}}(not {_AR}|missing|without|no {_AR}|partial)",
        rf"(missing|no|without|forg\w*|skipp\w*) (the )?({_AR}|\bg\b)", r"partial (sum|output)s?", _REPL],
    # fabric_gpt_accum
    "fabric_gpt_accum.loss_not_scaled_by_accum": [
        rf"(loss|grad\w*).{{0,80}}(not (divided|scaled|normali[sz]ed|averaged)|{_SCALE}).{{0,60}}({_MICRO}|accumulation steps|grad[_ ]accum)",
        rf"{_MICRO}.{{0,60}}(loss|grad\w*).{{0,40}}({_SCALE}|sum\w*)", rf"(divid\w*|scal\w*|normali[sz]\w*) (by|with) (the )?(number of )?{_MICRO}"],
    "fabric_gpt_accum.lr_lambda_returns_lr": [
        rf"(lambda\w*|lr[_ ]lambda|lambdalr).{{0,80}}(factor|multipl\w*|lr|learning rate|return\w*|base|twice|squared|scal\w*)",
        rf"{_LR}.{{0,60}}(twice|squared|multiplied|too (low|small)|scal\w*|base lr)", rf"{_SCHED}.{{0,60}}(factor|multipl\w*|return\w*)"],
    "fabric_gpt_accum.backward_sync_never": [
        rf"(no[_ ]backward[_ ]sync|no[_ ]sync|backward[_ ]sync).{{0,80}}(every|always|all|last|never|enabled|wrong)",
        rf"({_GRAD}).{{0,60}}(never|not) ({_AR}|synchroni[sz]ed|synced|averaged)", rf"(never|no|missing) ({_AR}|sync\w*|gradient sync\w*)", _REPL],
    "fabric_gpt_accum.no_zero_grad": [
        r"zero[_ ]?grad", rf"{_GRAD}.{{0,60}}(accumulat\w*|carr\w*|leak\w*|not (cleared|reset|zeroed)|stale).{{0,40}}(across|between|over|previous|steps|updates|iterations)?",
        r"(never|not) (cleared|reset|zeroed)"],
    "fabric_gpt_accum.batch_seed_per_rank": [
        rf"{_SAME}.{{0,60}}{_DATA}", rf"{_DATA}.{{0,60}}({_SAME}|differ\w*|mismatch|not the same|wrong|shard\w*)", r"(random|rng) (state|stream)"],
    "fabric_gpt_accum.causal_mask_missing": [
        r"causal", r"(future|look[- ]?ahead|next) tokens?", rf"{_MASK}.{{0,60}}(missing|attention|future)", r"attend\w*.{0,40}(future|ahead|all)"],
    "fabric_gpt_accum.labels_not_shifted": [
        r"shift\w*", r"(label|target)s?.{0,60}(offset|align\w*|current token|same position|next[- ]token|wrong)",
        r"(next[- ]token|current token)"],
    # timm_vit_ema
    "timm_vit_ema.label_smoothing_missing": [
        r"(label[- ]?smooth\w*|smoothing)", r"(loss|criterion).{0,60}(plain|hard|wrong|instead)"],
    "timm_vit_ema.t_initial_in_epochs": [
        rf"{_SCHED}.{{0,80}}(epoch\w*|updates?|t_initial|too short|length|t_in_epochs|units?|iterations?|steps)",
        rf"(t_initial|t_in_epochs|epochs? (vs|versus|instead of|not) (updates|steps|iterations))", rf"{_LR}.{{0,60}}(too (low|small|early)|lr_min|minimum|decay\w* (too )?(fast|early)|schedul\w*)"],
    "timm_vit_ema.ema_step_in_epochs": [
        rf"{_EMA}.{{0,80}}(step|epoch|decay|warm[- ]?up|update count|num_updates|copy|zero)",
        r"(decay|warm[- ]?up).{0,60}(epoch|step|update count|zero|0\b)", r"model_ema\.update"],
    "timm_vit_ema.ema_update_in_validation": [
        rf"{_EMA}.{{0,80}}(validat\w*|eval\w*|extra|twice|again|double|additional|second|too many|updated (more|twice))",
        rf"(validat\w*|eval\w*).{{0,60}}{_EMA}"],
    "timm_vit_ema.kl_mean_not_batchmean": [
        rf"{_KL}.{{0,80}}(reduction|batchmean|mean|classes|{_SCALE}|weight)", r"batch ?mean", r"reduction\s?=?\s?.?mean"],
    "timm_vit_ema.kl_direction_reversed": [
        rf"{_KL}.{{0,80}}(swap\w*|revers\w*|direction|order|argument\w*|input|target|wrong)",
        rf"(swap\w*|revers\w*|direction|argument\w*).{{0,60}}{_KL}", r"(teacher|student).{0,40}(log[- ]?prob\w*|probabilit\w*|input|target).{0,40}(swap\w*|revers\w*|instead)"],
    "timm_vit_ema.kl_missing_t_squared": [
        r"(t\s?\*\*\s?2|t\^?2|t²|temperature[- ]?squared|square of the temperature|squared temperature)",
        rf"{_KL}.{{0,80}}(temperature|\bt\b|{_SCALE}|weight)", r"temperature.{0,60}(scal\w*|factor|missing|square)"],
    # moe_top1_capacity
    "moe_top1_capacity.capacity_from_local_batch": [
        r"capacit\w*", rf"(token|expert).{{0,40}}(drop\w*).{{0,60}}(local|rank|differ\w*|wrong)", rf"(position|cumsum|priority).{{0,60}}(local|global|rank)"],
    "moe_top1_capacity.aux_f_local": [
        rf"(aux\w*|load[- ]balanc\w*|balance).{{0,80}}(local|per[- ]rank|not ({_AR}|global|reduced|synchroni[sz]ed)|fraction|count\w*|\bf\b|wrong group)",
        rf"(fraction|count\w*|tokens[- ]per[- ]expert|load|density).{{0,60}}(local|per[- ]rank|not {_AR}|not global)"],
    "moe_top1_capacity.aux_missing_num_experts": [
        rf"(aux\w*|load[- ]balanc\w*|balance).{{0,80}}(coeff\w*|num[_ ]experts|number of experts|factor|{_SCALE}|weight|alpha)",
        r"(num[_ ]experts|number of experts|\be\b) (factor|multipl\w*)"],
    "moe_top1_capacity.router_grads_summed": [
        rf"(router|gate|gating|replicated).{{0,80}}({_GRAD}).{{0,60}}({_SCALE}|not (divided|averaged)|world)",
        rf"(router|gate|gating).{{0,60}}({_SCALE}|not (divided|averaged))", rf"{_AR}.{{0,60}}(not (divided|averaged)|sum\w* (instead of|not) (the )?(mean|average))"],
    "moe_top1_capacity.combine_without_gate": [
        rf"(gate|gating|router|routing) (prob\w*|weight\w*|score\w*|value\w*|coefficient\w*)", rf"combin\w*.{{0,60}}(gate|gating|weight\w*|prob\w*|router)",
        rf"(router|gate).{{0,60}}(no|without|missing) (task )?grad\w*"],
    "moe_top1_capacity.recv_reshape_without_transpose": [
        rf"(all[_ -]?to[_ -]?all|a2a|dispatch\w*|recei\w*|recv|reshape|permut\w*|transpos\w*|layout).{{0,80}}(transpos\w*|layout|order\w*|wrong|mismatch|expert)",
        r"(wrong|mismatched) expert", r"expert.{0,60}(wrong tokens|mix\w*|permut\w*|layout|order\w*)"],
    "moe_top1_capacity.jitter_seed_per_rank": [
        rf"(jitter|noise).{{0,60}}({_SAME}|draw\w*|random)", rf"{_SAME}.{{0,60}}(jitter|noise)", r"(random|rng) (state|stream)"],
    # pipeline_gpipe
    "pipeline_gpipe.recv_no_requires_grad": [
        r"requires[_ ]grad", rf"(recei\w*|recv|input|activation\w*).{{0,80}}(no grad\w*|grad\w* (is )?none|without grad\w*|detach\w*|not track\w*)",
        rf"(earlier|first|upstream|previous) stages?.{{0,60}}(not (learn|train|updat)\w*|no grad\w*|zero grad\w*|frozen)", r"zeros? (sent|grad\w*)"],
    "pipeline_gpipe.loss_not_divided_by_microbatches": [
        rf"(loss|grad\w*).{{0,80}}({_SCALE}|not (divided|scaled|averaged)).{{0,60}}{_MICRO}", rf"{_MICRO}.{{0,60}}(loss|grad\w*).{{0,40}}({_SCALE}|sum\w*)",
        rf"(divid\w*|scal\w*|normali[sz]\w*) (by|with) (the )?(number of )?{_MICRO}"],
    "pipeline_gpipe.send_pre_activation": [
        r"(pre[- ]?activation|before (the )?(tanh|activation|nonlinearity)|tanh|activation (function )?(missing|skipped))",
        r"(send\w*|sent).{0,60}(wrong|pre|tensor|output)", r"wrong tensor"],
    "pipeline_gpipe.recv_buffer_reused": [
        r"buffer", rf"(alias\w*|overwrit\w*|reus\w*|in[- ]place).{{0,60}}(activation\w*|input|recv|recei\w*|tensor)",
        rf"(activation\w*|input|saved).{{0,60}}(alias\w*|overwrit\w*|reus\w*|same (tensor|memory|storage)|last micro)"],
    "pipeline_gpipe.backward_order_mismatch": [
        rf"(backward|micro[- ]?batch\w*).{{0,80}}(order\w*|revers\w*|fifo|lifo|mismatch\w*|wrong micro|misalign\w*)",
        r"(order\w*|revers\w*|fifo|lifo).{0,60}(backward|micro[- ]?batch|activation\w*|pop)", r"(activation\w*|gradient\w*).{0,60}wrong micro[- ]?batch"],
    "pipeline_gpipe.label_micro_offset": [
        r"(label|target)s?.{0,80}(micro[- ]?batch|offset|misalign\w*|mismatch\w*|wrong|shift\w*|off[- ]by[- ]one|next)",
        rf"{_MICRO}.{{0,60}}(label|target)s?"],
    "pipeline_gpipe.init_seed_per_stage": [
        rf"(init\w*|seed\w*|weights?).{{0,80}}(stage|rank|differ\w*|own|per[- ]stage|per[- ]rank|not (shared|the same|sliced))",
        rf"(stage|rank).{{0,60}}(seed\w*|init\w*)", r"(model|weights?) (differ\w*|mismatch\w*) (from|at) (the )?(start|init\w*)"],
}

assert set(EXPECTED) == set(RUBRIC)


def right(bug_id: str, cause: str | None) -> bool:
    """Whether the first cause (lower-cased) matches one of the bug's patterns."""
    if not cause:
        return False
    text = cause.lower()
    return any(re.search(p, text) for p in RUBRIC[bug_id])
