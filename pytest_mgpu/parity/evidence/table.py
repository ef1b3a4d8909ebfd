"""The table of causes: what each signal of the phase modules means where its condition holds, its fix,
and how the cause makes that evidence (read by ``causes.py``, first match wins)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Final, Tuple

from .conditions import (always, batch_statistics, by_hand, experts, experts_by_hand, experts_only, hand_scale,
                         inside, inverse, later_step, local_batch, loss_calls, micro_steps, no_backward, owned_parts,
                         passes,
                         scaled, stats_in_train_no_grad, world)
from .ema import SWAPPED
from .facts import UserFacts
from .finding import Finding

Test = Callable[[Finding, UserFacts], bool]


@dataclass(frozen=True)
class Cause:
    """What a signal means where ``when`` holds: ``what`` the cause is, its ``fix``, and ``why``
    (how the cause makes that evidence: said in the list of causes, after the fix)."""

    signal: str
    what: str
    fix: str
    why: str = ""
    when: Test = always


SHARD = ("give the DataLoader sampler=DistributedSampler(dataset) (and call sampler.set_epoch(epoch) every epoch), "
         "so that each rank gets its own shard")
SAME_OPT = "build the optimizer and scheduler alike on every rank and step them on every rank"
ACCUM = "backpropagate loss / k for each of the k micro-batches accumulated per step"
ACCUM_WHY = "Each micro-batch's loss is backpropagated undivided, so the step's gradient is the sum of k means."
SAME_LR = ("give both sides the same learning rate; DDP and FSDP average the gradients, so the one-device loop on the "
           "global batch takes the same lr")
LOSS_CALLS = ("compute the loss as the reference does at that line (the same operations, arguments and order), or make "
              "the reference do the same where the difference is meant")
CLIP = "gradient clipping differs"
SYNC_LAST = ("turn synchronisation off only for the micro-batches before the last: no_sync() around all but the last "
             "backward, or set_requires_gradient_sync(micro == last)")
RUNNING = ("running_mean", "running_var", "num_batches_tracked")  # a BatchNorm's buffers
INSIDE = ("the model's backward differs (same outputs and loss gradient): a hand-written backward missing its "
          "all_reduce (e.g. SyncBatchNorm), a tensor sent without autograd, or a detached branch")
ACCUMULATED = ("the micro-batches' gradients are combined otherwise (same outputs and loss gradient in each): a "
               "gradient buffer overwritten instead of added to, or reduced before the last micro-batch")
ACCUMULATED_FIX = ("add each micro-batch's gradient into the buffer (main_grad.add_(grad)), zero it once per optimizer "
                   "step, and reduce it once, after the last micro-batch")
INSIDE_FIX = ("reduce in each hand-written backward what its forward reduced (the statistics' gradients of a "
              "SyncBatchNorm by hand), send tensors between ranks with torch.distributed.nn.functional (it carries "
              "gradients), and keep every branch in the graph")
HAND_SCALE = "(a power of two: a loss scale kept by hand, multiplied in and not divided out exactly once)"
UNSCALE = ("divide the gradients (or the loss) by the loss scale exactly once, before clipping and before "
           "optimizer.step, and skip the step where the all-reduced check finds inf or NaN")
RECOMPUTE = ("the forward recomputed by activation checkpointing differs from the first (random numbers drawn "
             "again: dropout without preserve_rng_state)")
RECOMPUTE_FIX = "checkpoint with preserve_rng_state=True (the default), and keep the recomputed forward the first's"
RECOMPUTE_WHY = ("The loss agreed, so the forward did; backward differentiates the forward it recomputes, which "
                 "drew other random numbers or saw other inputs.")
TABLE: Final[Tuple[Cause, ...]] = (
    Cause("nonfinite", "non-finite weights at step 0", "initialise every parameter after to_empty() (model.apply(init) "
          "over all submodules)", "Memory never initialised: a model built on the meta device whose init does not "
          "reset every module, or a checkpoint holding NaN."),
    Cause("start-apart", "the ranks start from different weights", "seed every rank alike before building the model, "
          "or broadcast rank 0's parameters (DDP's constructor does; FSDP1: sync_module_states=True)",
          "The model is initialised per rank (a seed that depends on the rank) and never broadcast."),
    Cause("shard-slice", "a rank holds another slice of a weight sharded by hand than its own", "slice each rank's "
          "piece out of the same full weight at [rank * size:(rank + 1) * size] along the sharded dimension (as the "
          "one-device model holds it), for every tensor-parallel layer", "The slice index or size is computed "
          "otherwise on some rank (an off-by-one, the wrong rank or group used, or another split of a fused weight)."),
    Cause("start-other", "fn and reference_fn start from different weights", "seed both sides alike right before "
          "building the model, or load one state_dict into both"),
    Cause("hyper", "the optimizer's hyperparameters differ", "build the optimizer with the same arguments and "
          "parameter groups on every rank and in the reference"),
    Cause("groups", "the optimizer's parameter groups differ", "build the param groups alike on both sides (the same "
          "parameters with and without weight decay)", "A parameter put in another group (a norm or bias given "
          "weight decay), or a group left out."),
    Cause("modes", "the model runs in another mode (train/eval) on one side", "call model.train() after each "
          "validation pass (and eval() alike on both sides)", "A model left in eval() after validation computes "
          "BatchNorm with running statistics and drops no units."),
    Cause("mode-validation", "a validation forward (under no_grad) runs in training mode on the ranks", "call "
          "model.eval() before each validation pass and model.train() after it, as the reference does", "In training "
          "mode its dropout draws random numbers (the next training step's masks differ) and BatchNorm updates its "
          "running statistics from the validation rows."),
    Cause("optimizer-state", "the optimizer's state differs", "save and load the optimizer's state with the model's "
          "(optimizer.state_dict(), or DCP get_optimizer_state_dict/set_optimizer_state_dict)",
          "An optimizer built anew and not restored starts with no state (Adam's moments zero, step counters "
          "restarted)."),
    Cause("start-moved", "the weights are changed in place between the forward and optimizer.step() (a perturbation "
          "not undone, as SAM's ascent before its restore)", "restore the "
          "weights the gradients were taken at before optimizer.step() (SAM: p.data = old_p, then the base "
          "optimizer's step), or change them as the reference does"),
    Cause("untrained-forward", "BatchNorm's running statistics are updated from each rank's own rows: the batch "
          "norm is not synchronised across ranks", "convert it with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) "
          "before wrapping, or give the reference each rank's rows in its own forward, as the ranks normalise",
          "Every state that differs is a running mean or variance; the ranks held them alike before the first forward.",
          lambda x, f: bool(x.names) and all(n.endswith(RUNNING) for n in x.names)),
    Cause("untrained-forward", "state no optimizer steps is updated in the forward from each rank's own rows (a "
          "queue or memory bank not gathered from every rank)", "gather what "
          "updates it from every rank first (all_gather, MoCo's concat_all_gather) and update it alike on every "
          "rank, as the reference does with the whole batch", "The ranks held it alike before the first forward."),
    Cause("untrained-rank", "an EMA copy (a teacher) differs between ranks from the start: copied from each rank's "
          "own weights before they were synchronised (before DDP's broadcast), or loaded on some ranks only", "make "
          "the copy after wrapping the model (from ddp.module), or broadcast rank 0's tensors to the others",
          "", lambda x, f: x.step == 0 and bool(set(x.names) & set(f.copies))),
    Cause("untrained-rank", "state no optimizer steps (a frozen teacher, buffers) differs between ranks from the "
          "start: loaded or initialised on some ranks only", "load it (load_state_dict) on every rank, or broadcast "
          "rank 0's tensors to the others, before training", "", lambda x, f: x.step == 0),
    *(Cause(k, "BatchNorm running statistics are updated by a forward under no_grad in training mode (a validation, "
            "target or averaged copy's pass without eval())", "call eval() on that model before the pass and train() "
            "after it, as the reference does", "", stats_in_train_no_grad) for k in ("untrained-rank", "untrained-other")),
    Cause("untrained-rank", "a buffer no optimizer steps differs between ranks: updated from each rank's own rows or "
          "counts (a routing bias, a statistic or a counter not all-reduced)", "all_reduce what updates it (counts, "
          "sums) first, so that every rank applies the same update, as the reference does with the whole batch", "",
          lambda x, f: not set(x.names) & set(f.copies)),
    Cause("untrained-rank", "state no optimizer steps differs between ranks (an EMA teacher or buffers updated on "
          "some ranks only, or from each rank's own weights)", "update the EMA/teacher on every rank, after the "
          "optimizer step, from the synchronised weights"),
    Cause("untrained-other", "a buffer no optimizer steps is updated otherwise than in the reference (its rule: a "
          "sign, a rate, or what it is computed from)", "update it as the reference does, from the same inputs",
          "", lambda x, f: not set(x.names) & set(f.copies)),
    Cause("untrained-other", "state no optimizer steps (an EMA teacher, buffers) is updated otherwise than in the "
          "reference", "update it as the reference does: the same momentum, once per optimizer step, after it"),
    Cause("ema-rank", "the EMA copy (a teacher, an averaged model) is updated on some ranks only", "update it on "
          "every rank, once per optimizer step, after it (not under `if rank == 0`)"),
    Cause("ema-ahead", "the EMA is updated before the optimizer step (or once more at the start): it runs an update "
          "ahead", "update the EMA after optimizer.step(), once per step"),
    Cause("ema-warm-up", "the EMA's momentum lacks the reference's warm-up (a fixed decay from the first step)",
          "compute the momentum per step as the reference does (e.g. min(1 - 1 / (step + 1), decay))"),
    Cause("ema-momentum", "the EMA's two weights are swapped (tau and 1 - tau: the copy takes the online weights' "
          "share where it should keep its own)", "weigh the copy by the momentum and the online weights by 1 - "
          "momentum (target = m * target + (1 - m) * online; a Polyak tau: target = (1 - tau) * target + tau * "
          "online)", "", lambda x, f: SWAPPED in x.evidence),
    Cause("ema-momentum", "the EMA's momentum differs from the reference's", "give the EMA the reference's decay "
          "and the same step count it warms up with"),
    Cause("rows-same", "the data is not sharded", SHARD, "Every rank trains on the same samples."),
    Cause("rows-tp-same", "every tensor-parallel peer fed the same rows", "feed each rank its shard of the rows, or "
          "give the plan Replicate() input layouts and the whole batch on every rank"),
    Cause("rows-tp-differ", "rank-dependent inputs to a tensor-parallel model", "give every rank of a tensor-parallel "
          "group the same batch (shard the data over the data-parallel dimension only, the same seed)"),
    Cause("passes-uneven", "the ranks' accumulation boundary is counted otherwise: some optimizer step comes after "
          "another number of micro-batches than the others", "step after every k-th micro-batch, counting them from "
          "1 (step when (i + 1) % k == 0 with i from 0, or on the last micro-batch of each group), as the reference "
          "does"),
    Cause("rows-size", "the ranks step the optimizer (and scaler, scheduler) on every micro-batch, not once per "
          "accumulated batch", "call optimizer.step() (scaler.step/update, scheduler.step, zero_grad) once per "
          "accumulated batch, after the last micro-batch's backward, as the reference does", "", micro_steps),
    Cause("rows-size", "the sides train on batches of another size", "give the one-device loop the ranks' batches "
          "together (batch_size x the data-parallel ranks), or each rank batch_size // world_size"),
    Cause("rows-missing", "the sides saw different batches", "draw the reference's batch as the ranks' shards "
          "together (the same sampler seed, shuffle and set_epoch; no rank-dependent data seed)",
          "The ranks' samplers or seeds draw other rows than the reference's."),
    Cause("rows-transformed", "the ranks' rows are the reference's transformed otherwise: a mask, noise, mix or "
          "augmentation drawn per rank, not for the global batch",
          "draw the random numbers for the global batch as the reference does (a generator seeded alike on every rank) "
          "and take the rank's slice, or draw them with the rows in the dataset, keyed by the row's index",
          "Each rank drew for its own rows (or with its own seed), so its rows are the reference's rows masked, "
          "noised or mixed otherwise; or the ranks compute the transformation by another formula."),
    Cause("rows-unequal", "unequal shards", "an even split (drop_last=True, or a batch divisible by the world size)",
          "DDP and FSDP average the ranks' gradients with equal weight."),
    Cause("epoch-repeat", "the shuffle order repeats across epochs", "call sampler.set_epoch(epoch) at the start of "
          "every epoch, on every side", "A DistributedSampler shuffles with seed + epoch."),
    Cause("data-restart", "data repeated", "restore the epoch and the position in it with the checkpoint",
          "The data iterator started over instead of resuming."),
    Cause("loss-factor", "the loss backpropagated is multiplied by a GradScaler's scale on one side only",
          "scale alike on both sides (a GradScaler in the reference too), or backpropagate the unscaled loss", "", scaled),
    Cause("loss-factor", "the loss backpropagated is multiplied by a loss scale on one side only " + HAND_SCALE,
          UNSCALE, "", hand_scale),
    Cause("loss-factor", "gradient accumulation without dividing the loss", ACCUM, ACCUM_WHY, passes),
    Cause("loss-factor", "the loss is scaled by the world size", "backpropagate the plain mean loss",
          "The loss is multiplied by the world size before backward; DDP already averages the gradients.", world),
    Cause("loss-factor", "the loss is divided by the world size before backward", "backpropagate the plain mean loss",
          "DDP already averages the gradients.", inverse),
    Cause("backward-extra", "a loss the reference does not backpropagate reaches the step (a validation loss "
          "outside torch.no_grad(), or a backward left in)", "run validation under torch.no_grad() (or "
          "torch.inference_mode()) and backpropagate only the training loss", "Its gradients add to the training "
          "loss's (zero_grad ran before it), so the step's gradient is another."),
    Cause("output-order", "the output rows are the reference's in another order", "append each micro-batch's output "
          "in input order and torch.cat once"),
    Cause("loss-positions", "a mask leaves out of the ranks' loss positions the reference's counts (a loss or label "
          "mask, the ignore index, lengths)", "mask the same positions as the reference "
          "(the mask built from the same lengths and special tokens, the end-of-sequence token kept where it is)"),
    Cause("loss-positions-extra", "the ranks' loss counts positions the reference leaves out (padding or ignored "
          "labels not masked: not set to the ignore index, -100 or 255)", "set the labels "
          "of padding and ignored positions to the loss's ignore_index (or multiply by the mask), as the reference does"),
    Cause("loss-positions-other", "the ranks' loss reads other positions than the reference's (a mask or the "
          "targets' alignment built otherwise)", "build the loss mask and align the targets as the reference does"),
    Cause("loss-shift", "the targets are aligned one position otherwise (the next-token shift missing, done twice, "
          "or on the other side)", "shift once, as the reference does: logits[:, :-1] predict "
          "labels[:, 1:]"),
    Cause("loss-rank-scale", "each rank or micro-batch normalises its loss by a quantity of its own rows (a count of "
          "tokens or rows, the mean or std of rewards or advantages taken locally), not the whole batch's",
          "compute the normaliser over the whole batch: all_reduce the count, or gather the rewards or advantages "
          "from every rank before normalising, as the reference does"),
    Cause("loss-call-scale", "the loss weights one forward call's outputs otherwise (several calls, one backward: a "
          "term such as a gradient penalty or a real/fake term computed or weighted otherwise)", "compute each term as the reference does, over the same calls' outputs, with the "
          "same weight and normaliser"),
    Cause("loss-row-mean", "each row's loss is averaged over its positions where the reference sums them (per-row "
          "log-probs as a mean over tokens)", "sum over each row's positions as the reference does (or average alike "
          "on both sides)"),
    Cause("loss-row-sum", "the loss is averaged over all tokens together (divided by a token count) where the "
          "reference averages each row over its own positions first", "average each row over its positions, then "
          "over the rows, as the reference does (or divide alike on both sides)"),
    Cause("loss-row-weights", "per-row loss weights differ (advantages, rewards, baselines or sample weights computed "
          "over other rows, groups or pairs, or at another slice offset)", "compute the per-row terms over the same "
          "rows and groups as the reference (gather what they need from every rank first) and keep them aligned with "
          "their rows (the rank's own slice, the same order)"),
    Cause("loss-rows-moved", "rows get another row's loss terms (per-row targets, weights or reference values read "
          "at another offset, slice or order than their rows)", "slice per-row terms with the rank's own offset "
          "(rank x rows per rank) and keep them in their rows' order"),
    Cause("loss-ops", "the loss is computed otherwise from the same outputs", LOSS_CALLS),
    Cause("loss-formula", "the loss's formula or targets differ on the same outputs (a term's weight or temperature, "
          "a reduction, targets from another source or index, or other ranks' terms not gathered with autograd)", "compute the loss as "
          "the reference does from the same outputs: the same terms, weights and reductions, targets looked up by the "
          "sample's own index, and what it needs from other ranks gathered with autograd "
          "(torch.distributed.nn.functional.all_gather)"),
    Cause("loss-other", "the loss backpropagated is multiplied by a GradScaler's scale on one side only",
          "scale alike on both sides (scaler.scale(loss).backward() on each), or backpropagate the unscaled loss on "
          "both", "", scaled),
    Cause("loss-other", "the loss backpropagated is multiplied by a loss scale on one side only " + HAND_SCALE,
          UNSCALE, "", hand_scale),
    Cause("loss-other", "loss reduction='sum' on the ranks", "use reduction='mean' as the reference does",
          "The loss is each rank's sum over its rows, not their mean.", local_batch),
    Cause("loss-other", "BatchNorm without SyncBatchNorm", "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) "
          "before wrapping it in DDP", "Each rank normalises its shard with its own statistics.", batch_statistics),
    Cause("loss-other", "Dropout or other randomness", "put the model in eval() or set p=0 for the parity check",
          "The ranks draw other masks than the reference.", lambda x, f: bool(f.dropout)),
    Cause("loss-other", "the forward of the layers sharded by hand computes otherwise (a partial output reduced "
          "twice, averaged or not at all, a row-parallel bias added on every rank before the reduce, or heads and "
          "widths not divided by the group size)", "in each tensor-parallel "
          "layer, reduce the partial outputs exactly once (an all_reduce in the forward of the row-parallel layer, "
          "none in the column-parallel one), add a row-parallel bias once after that reduce, and split heads and "
          "widths by the group size alike on every rank", "With the same weights and rows, the loss differs: the "
          "forward through the pieces is not the whole layer's (a reduce missing or doubled, a bias added on every "
          "rank, a head count or width not divided by the group size).", by_hand),
    Cause("loss-other", "the expert-parallel layer routes or combines tokens otherwise than the reference", "route "
          "and combine as the reference does: the expert capacity computed over the global tokens, router noise drawn "
          "for the global batch from a generator seeded alike on every rank, the load-balancing loss from the "
          "all-reduced dispatch fractions, each token sent to the rank that holds its expert and its output put back "
          "in its place", "With the same weights and rows the loss differs: the capacity "
          "(which tokens are dropped), the router's noise, the auxiliary loss or the dispatch and combine see each "
          "rank's tokens only.", lambda x, f: experts(f) or experts_by_hand(x, f)),
    Cause("loss-other", "the layer whose parts each rank holds alone (tables or a layer placed per rank, exchanged with "
          "all_to_all) routes or combines its rows otherwise than the reference", "send each row to the rank that "
          "holds its part and put the results back in the reference's order (the all_to_all's split sizes, and a "
          "permute of its output from [ranks, batch, ...] to [batch, ranks, ...] before a view), with the parts "
          "placed on the ranks as the exchange assumes", "With the same weights and rows the loss differs: the "
          "exchange between the ranks sends, orders or combines rows otherwise.", lambda x, f: bool(f.shared)),
    Cause("loss-other", "the recurrent state carried from step to step differs (an RNN's hidden state carried, "
          "detached or re-initialised otherwise)", "carry the hidden state between chunks as the reference does: "
          "detach it after each step (repackage_hidden), re-initialise it where the reference does (each epoch), "
          "and keep each rank's state with its own columns", "With the same weights and rows, a later step's loss "
          "differs where the first step's agreed: what the model carries between steps differs.",
          lambda x, f: x.step > 0 and bool(f.recurrent)),
    Cause("loss-other", "the attention across the ranks' parts of the sequence computes otherwise than over the "
          "whole sequence (positions, the causal mask, a ring's softmax merge, or an all_to_all of heads and "
          "sequence)", "give each part its global positions (offset by rank x part length), mask causally "
          "by global position (the diagonal block causal, blocks after it skipped or fully masked), merge the "
          "blocks' softmax statistics (running max and log-sum-exp) as one softmax, and pass K/V around the ring "
          "with autograd (gradients sent back), or all_to_all heads and sequence both ways in the same order "
          "(Ulysses), then average the loss over the global token count", "With the same "
          "weights and the same rows, split along the sequence, the loss differs: positions, the causal mask, the "
          "softmax merge across blocks, or the loss's token count see one rank's part only.",
          lambda x, f: bool(f.sequence_split) and f.recurrent != "time-major"),
    Cause("loss-other", "the loss differs with the same weights, and the rows could not be compared: another "
          "batch (a rank-dependent seed, another sampler or batch size) cannot be told from a loss computed otherwise",
          "check first that each rank trains its shard of the reference's batch (DistributedSampler, the same seed and "
          "batch size), then that the loss is normalised over the global batch. The rows are recorded from the first "
          "tensor passed to the outermost module with parameters called forward on each side: call the model itself "
          "alike on both sides", "",
          lambda x, f: x.names[:1] == ("rows-unseen",)),
    Cause("loss-other", "what the loss reads changes otherwise over the steps: a coefficient or temperature on another "
          "schedule, or state it keeps (a centre, a running normaliser) updated from each rank's own values", "index "
          "the schedule and update that state (from every rank's values) as the reference does", "", later_step),
    Cause("loss-other", "the loss is computed otherwise", LOSS_CALLS, "", loss_calls),
    Cause("loss-other", "the ranks compute the loss otherwise (normalised by a local count, or missing other ranks' "
          "terms)", "normalise by the global count (all_reduce it), gather what the loss needs from every rank with "
          "torch.distributed.nn.functional.all_gather (it carries gradients), and reduce as the reference does",
          "With the same weights and rows, the loss differs: a mean over this rank's tokens, boxes or rows where the "
          "reference divides by the global count, a contrastive or global term without the other ranks' outputs, "
          "another reduction or loss function."),
    Cause("grads-carried", "gradients not zeroed between steps", "call optimizer.zero_grad() once per optimizer step, "
          "after optimizer.step() (with accumulation: after the step, not after each micro-batch)"),
    Cause("grads-kept-between", "gradients not zeroed between the backward passes of a step, where the reference "
          "zeroes them (two passes per step, as SAM's ascent and descent)", "zero the gradients (optimizer.zero_grad() "
          "or p.grad = None) between the passes as the reference does", "The second pass's gradients are added to the "
          "first's, so the optimizer steps with their sum."),
    Cause("grads-zeroed-micro", "gradients zeroed between micro-batches", "call optimizer.zero_grad() once per "
          "optimizer step, after optimizer.step(), not inside the accumulation loop"),
    Cause("grads-tp-unreduced", "the gradients of modules every rank holds whole (a router or gate, shared layers) "
          "are not all-reduced across the expert-parallel ranks", "all_reduce the gradient of every tensor each rank "
          "holds whole over the ranks that share it (and divide as the others), after backward and before "
          "optimizer.step(); the experts' own shards are not reduced", "",
          lambda x, f: x.how == "some modules" and experts_by_hand(x, f)),
    Cause("grads-tp-unreduced", "the replicated parameters' gradients (tensors every tensor-parallel rank holds "
          "whole) are not all-reduced across the tensor-parallel group", "all_reduce the input's "
          "gradient over the tensor-parallel group in the backward of the function that copies activations into the "
          "parallel layers (Megatron's copy_to_tensor_model_parallel_region: identity forward, all_reduce backward); "
          "under sequence parallelism, all_reduce the gradients of the LayerNorms and row-parallel biases each rank "
          "computes from its own tokens (Megatron's finalize_model_grads)",
          "A layer sharded by hand returns each rank's partial gradient of its input; without the all_reduce the "
          "layers before it train on a part of their gradient.", by_hand),
    Cause("grads-tp-unreduced", "gradients not reduced across the tensor-parallel group", "put the module in "
          "parallelize_module's plan so its weight becomes a Replicate DTensor whose gradient is reduced, or "
          "all_reduce that gradient over the tp mesh's group before optimizer.step()"),
    Cause("grads-dp-unreduced", "gradients not reduced across the data-parallel group (the ranks that hold the same "
          "shards in each tensor-parallel group)", "all_reduce every gradient over the data-parallel group (a "
          "dist.new_group of the ranks at one place of each tensor-parallel group) and divide by its size, after "
          "backward and before optimizer.step(); not over the tensor-parallel group or the world",
          "Each data-parallel replica trains on its own rows' gradient: the ranks of one tensor-parallel group agree, "
          "the groups do not."),
    Cause("grads-sync-off", "the step's last micro-batch's backward ran with gradient synchronisation off (under "
          "no_sync() or set_requires_gradient_sync(False)): its gradients are not reduced across ranks", SYNC_LAST,
          "", lambda x, f: f.rank_backwards > 1),
    Cause("grads-sync-off", "the step's last backward ran with gradient synchronisation off (under no_sync() or "
          "set_requires_gradient_sync(False)): its gradients are not reduced across ranks", SYNC_LAST),
    Cause("grads-unsynced", "gradients of some modules are not synchronized between ranks", "all_reduce those "
          "modules' gradients too (and divide by the world size)", "They are left out of the gradient all-reduce.",
          lambda x, f: x.how == "some modules"),
    Cause("grads-unsynced", "gradients are not synchronized between ranks", "all_reduce every gradient and divide by "
          "the world size (or train through DDP's wrapper, not its .module), and use no_sync() only on "
          "accumulation steps", "Each rank steps with its own shard's gradients."),
    Cause("grads-factor", "the gradients still carry the GradScaler's scale", "step through "
          "scaler.step(optimizer), which unscales first, and call scaler.unscale_(optimizer) before clipping or "
          "changing the gradients", "", scaled),
    Cause("grads-factor", "the gradients still carry a loss scale " + HAND_SCALE, UNSCALE, "", hand_scale),
    Cause("grads-factor", "gradient accumulation without dividing the loss", ACCUM, ACCUM_WHY, passes),
    Cause("grads-factor", "gradients scaled by the world size", "divide the all-reduced gradients by the world size "
          "(or ReduceOp.AVG)", "They are summed over ranks and not divided (an all_reduce SUM or a communication "
          "hook without / world_size).", world),
    Cause("grads-factor", "gradients divided by the world size once too often", "divide once",
          "An averaged all_reduce (or DDP's average) is divided again.", inverse),
    Cause("grads-factor", "gradients scaled by a constant", "use reduction='mean' as the reference does, or scale "
          "both sides alike", "A loss with reduction='sum', or a gradient scaled by hand."),
    Cause("grads-whole", "the gradients of tensors every tensor-parallel rank holds whole (norms, a row-parallel "
          "layer's bias, a replicated head) are summed over the group, though each rank already holds the whole "
          "gradient", "leave them as backward made them (every peer computes the whole gradient from the same batch), "
          "and reduce over the data-parallel group only", "", lambda x, f: by_hand(x, f) and world(x, f)),
    Cause("grads-modules", "the gradients through the layers sharded by hand are multiplied by the world size "
          "(reduced twice)", "reduce each gradient exactly once over the tensor-parallel group: the reduce-from-region "
          "function all_reduces in its forward only, the copy-to-region one in its backward only", "An all_reduce in "
          "both the forward and the backward of a region function, or a sum over the ranks where each already holds "
          "the whole gradient, multiplies it by the group size.", lambda x, f: by_hand(x, f) and world(x, f)),
    Cause("grads-modules", "the gradients of some modules are world size x the reference's (summed over the ranks, "
          "never divided by the world size)", "divide those modules' summed gradients by the world size (or "
          "all_reduce them with ReduceOp.AVG), as the other modules' are", "A SUM all_reduce, or a backward that sums "
          "every rank's contributions, with no division after it.", lambda x, f: not by_hand(x, f) and world(x, f)),
    Cause("grads-modules", "the gradients of some modules are 1/world size of the reference's (divided by the world "
          "size once too often, or averaged where the reference sums)", "divide those modules' gradients once, as "
          "the other modules' are", "A gradient averaged twice: by an all_reduce AVG or DDP, and again by hand.",
          lambda x, f: not by_hand(x, f) and inverse(x, f)),
    Cause("grads-modules", "some modules get zero gradients: the graph is cut before them (a tensor received from "
          "another rank without requires_grad_(), a detach(), a no_grad region)", "keep the path to them in the graph: "
          "requires_grad_() on what a rank receives, and send its .grad back; no detach() or no_grad on the way", "",
          lambda x, f: x.value == 0.0),
    Cause("grads-modules", "gradients of some modules are reduced otherwise", "reduce those modules' gradients as "
          "the others' (divide a SUM by the ranks that share them)", "Expert or shared parameters summed or "
          "divided by another factor.", lambda x, f: x.value != 1.0),
    Cause("grads-modules", RECOMPUTE, RECOMPUTE_FIX, RECOMPUTE_WHY, lambda x, f: f.recomputed),
    Cause("grads-modules", "the backward through the layers sharded by hand computes otherwise", "reduce each "
          "gradient exactly once over the tensor-parallel group: the input's gradient in the backward of the "
          "copy-to-region function, none in the reduce-from-region one; and reduce over the data-parallel group "
          "only (not the tensor-parallel one) what data parallelism shares", "With the same weights, some modules' "
          "gradients differ: an all_reduce missing, doubled, or over the wrong group in a backward of the parallel "
          "region.", by_hand),
    Cause("grads-modules", "the experts' gradients are all-reduced over ranks that hold other experts (different "
          "experts mixed)", "leave each "
          "expert's gradient to the rank that holds it (keep expert parameters out of the data-parallel all_reduce), "
          "scaled as the reference's", "Each rank holds its own experts: an all_reduce over their gradients mixes "
          "unrelated tensors.", lambda x, f: experts_only(x, f) and experts(f)),
    Cause("grads-modules", "the gradients of tensors each rank holds alone (not replicas) are all-reduced with other "
          "ranks' different tensors", "leave the gradients of the parts each rank holds alone out of the "
          "data-parallel all_reduce (reduce only the shared, replicated tensors)", "An all_reduce over every "
          "parameter mixes tensors that only have the same shape.", owned_parts),
    Cause("grads-modules", ACCUMULATED, ACCUMULATED_FIX, "", lambda x, f: inside(x, f) and f.rank_backwards > 1),
    Cause("grads-modules", INSIDE, INSIDE_FIX, "", inside),
    Cause("grads-modules", "some modules get no gradient or another one", "keep those modules in the graph as the "
          "reference does (no detach/no_grad, the same requires_grad)", "A detached branch, frozen parameters, a "
          "module skipped or computed otherwise on the ranks."),
    Cause("grads-precision", "gradients differ at the level of a lower precision", "judge with that precision "
          "(rtol= of its eps), or reduce in float32", "The ranks reduce or compute them in it."),
    Cause("grads-other", "the gradients the loop sets itself differ with the same weights (no backward pass ran: "
          "gradients computed apart, e.g. per-sample with torch.func, then clipped, noised or averaged by hand)",
          "compute them as the reference does, over the global batch: each clip and normaliser the same, random "
          "draws (noise) made once for the whole batch with a generator seeded alike on every rank", "", no_backward),
    Cause("grads-other", RECOMPUTE, RECOMPUTE_FIX, RECOMPUTE_WHY, lambda x, f: f.recomputed),
    Cause("grads-other", ACCUMULATED, ACCUMULATED_FIX, "", lambda x, f: inside(x, f) and f.rank_backwards > 1),
    Cause("grads-other", INSIDE, INSIDE_FIX, "", inside),
    Cause("grads-other", "the gradients differ with the same weights", "make the backward the reference's",
          "A detached part, a hook that changes gradients, another reduction."),
    Cause("stage-cut", "a stage gets no gradient", "pass the activation on with .to(device), which autograd follows "
          "(no .detach(), .data or no_grad on the way)", "The graph is cut between stages."),
    Cause("stage-part", "a stage gets part of its gradient", "keep every micro-batch's activation in the graph",
          "Some micro-batches do not backpropagate into it."),
)
