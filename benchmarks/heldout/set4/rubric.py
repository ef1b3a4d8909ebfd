"""The expected first cause of every bug of ``benchmarks/heldout/set4``, written from what each bug is and
committed before any run of the plugin on this set; not changed after.

One record per bug: ``id`` ("family.bug"), ``what`` (the bug, one line), ``phase`` (where it first
shows in a step: "state before step", "inputs", "loss", "raw gradients", "synced gradients",
"update", "step count"), ``how`` (how it shows at 2 ranks), and ``accept``: lowercase regexes, any
one of which found in the FIRST "likely cause" line of the failure message makes the diagnosis
right. ``accept`` names the cause (what an engineer reading the line would take as pointing at the
bug), not a wording: a line that only says something "differs" or "diverges" is not accepted.
"""
from __future__ import annotations

import re

from . import FAMILIES  # noqa: F401  (the families these records cover)

LR = r"learning rate|\blr\b|schedul|warm-?up|onecycle|plateau"
LR_WORLD = LR + r"|update.{0,40}(scal|factor|larger|twice|doubl|2x)|step size"
SEED_DATA = (r"seed|shuffl|sampler|(rows|data|batch|inputs?|samples).{0,40}(differ|overlap|duplicat|order|wrong|mismatch|not the same)"
             r"|different (rows|data|inputs?|batch|samples)|overlap|duplicat")
SAME_ROWS = (r"sampler|same (input |training )?(rows|data|batch(es)?|inputs?|samples)|identical (rows|data|batch|inputs?)"
             r"|not sharded|shard|duplicat|overlap")
NOT_SYNCED = (r"all[-_ ]?reduc|synchroni[sz]|\bsync|not (been )?(averaged|reduced)|never (averaged|reduced)"
              r"|(gradients?|grads) (differ|disagree)\w* (across|between) (the )?ranks|local gradient")
ACCUM_SCALE = (r"accumulat|micro[- ]?batch|\bdivid|normali[sz]|scal(ed|ing|e)\b|factor|\btwice\b|doubl|\bhalf\b|halv"
               r"|\b0\.5\b|1/2|\b2(\.0)?x|x ?2(\.0)?\b")
ZERO_MICRO = r"zero_grad|zeroed|cleared|\breset|accumulat|micro[- ]?batch|dropped|discard"
BATCH_SIZE = (r"batch(es)? (size|of (an)?other size)|size of the batch|per[- ](device|rank|process) batch|global batch"
              r"|rows per (step|rank|batch)|number of rows|more rows|split_batches|(rows|inputs?|batch).{0,30}(size|count|twice|doubl)")
ROWS_DIFFER = (r"(input|data|batch|rows?|samples?).{0,40}(order|differ|mismatch|wrong|not the same|skip|shift)"
               r"|different (rows|data|inputs?|batch|samples)|skipped")


def rec(id_: str, what: str, phase: str, how: str, *accept: str) -> dict:
    return {"id": id_, "family": id_.split(".")[0], "what": what, "phase": phase, "how": how, "accept": list(accept)}


RUBRIC = [
    # fabric_vit
    rec("fabric_vit.no_div_accum", "micro-batch loss not divided by the accumulation steps", "loss",
        "uniform factor 2 on all gradients", ACCUM_SCALE),
    rec("fabric_vit.sync_never", "no_backward_sync enabled on every micro-batch: gradients never all-reduced",
        "synced gradients", "all modules, each rank its own gradient", NOT_SYNCED, r"no_backward_sync"),
    rec("fabric_vit.seed_per_rank", "seed_everything(SEED + rank): each rank's DistributedSampler has its own seed",
        "inputs", "certain rows (overlapping / missing)", SEED_DATA),
    rec("fabric_vit.no_dist_sampler", "use_distributed_sampler=False: every rank reads the same rows", "inputs",
        "certain rows", SAME_ROWS, r"use_distributed_sampler"),
    rec("fabric_vit.zero_grad_every_micro", "zero_grad before every backward: the first micro-batch of a step dropped",
        "raw gradients", "all modules (the first micro-batch's share lost)", ZERO_MICRO),
    rec("fabric_vit.lr_scaled_world", "lr x world size", "update", "uniform factor 2 on the update", LR_WORLD),
    rec("fabric_vit.reduction_sum", "CrossEntropyLoss(reduction='sum'): the loss summed over the rank's rows", "loss",
        "uniform factor 4 (the per-rank batch) on all gradients",
        r"reduction|\bsum(med)?\b|not averaged|averag|\bmean\b|scal(ed|ing|e)\b|factor|\b4(\.0)?x|x ?4(\.0)?\b|normali[sz]"),
    # pl_trainer
    rec("pl_trainer.double_div_accum", "training_step divides by accumulate_grad_batches and the Trainer divides again",
        "loss", "uniform factor 0.5 on all gradients", ACCUM_SCALE),
    rec("pl_trainer.sched_interval_epoch", "warm-up scheduler without interval='step': stepped per epoch", "state before step",
        "some steps (lr from step 1)", LR),
    rec("pl_trainer.no_dist_sampler", "use_distributed_sampler=False: every rank the same rows", "inputs", "certain rows",
        SAME_ROWS, r"use_distributed_sampler"),
    rec("pl_trainer.lr_scaled_world", "lr x trainer.world_size", "state before step", "uniform factor 2 on the lr", LR_WORLD),
    rec("pl_trainer.seed_per_rank", "seed_everything(SEED + rank): each rank's DistributedSampler has its own seed",
        "inputs", "certain rows (overlapping / missing)", SEED_DATA),
    rec("pl_trainer.global_batch_per_rank", "DataLoader batch_size = the global batch on every rank", "inputs",
        "batches of twice the rows", BATCH_SIZE),
    # accel_accum
    rec("accel_accum.manual_div_accum", "loss / K before accelerator.backward, which divides by K again", "loss",
        "uniform factor 0.5 on all gradients", ACCUM_SCALE),
    rec("accel_accum.plateau_local_loss", "ReduceLROnPlateau fed the rank's own loss: ranks' lr decisions differ",
        "state before step", "one rank alone (its lr), from a later step", LR),
    rec("accel_accum.sched_not_prepared", "plateau scheduler not prepared, stepped every micro-batch", "state before step",
        "some steps (lr)", LR),
    rec("accel_accum.no_accumulate_ctx", "accumulate() context left out: the optimizer steps every micro-batch on loss/K",
        "loss", "factor 0.5 and half the rows per step",
        r"accumulat|micro[- ]?batch|step(s|ped)? (on |at )?(every|each|per)|\bdivid|factor|\bhalf\b|halv|\b0\.5\b|1/2|scal(ed|ing|e)\b",
        BATCH_SIZE),
    rec("accel_accum.lr_scaled_world", "lr x num_processes with split_batches", "state before step",
        "uniform factor 2 on the lr", LR_WORLD),
    rec("accel_accum.no_split_batches", "split_batches off: each process takes the whole loader batch", "inputs",
        "batches of twice the rows", BATCH_SIZE),
    # hf_trainer
    rec("hf_trainer.seed_per_rank", "TrainingArguments(seed=SEED + rank): each process shuffles with its own seed",
        "inputs", "certain rows (overlapping / missing)", SEED_DATA),
    rec("hf_trainer.lr_scaled_world", "learning_rate x world size", "state before step", "uniform factor 2 on the lr",
        LR_WORLD),
    rec("hf_trainer.per_device_global", "per_device_train_batch_size = the global batch", "inputs",
        "batches of twice the rows", BATCH_SIZE),
    rec("hf_trainer.custom_loss_ignores_num_items", "compute_loss override ignoring num_items_in_batch: the Trainer no "
        "longer divides by the accumulation steps", "loss", "uniform factor on all gradients",
        r"num_items|accumulat|micro[- ]?batch|normali[sz]|\bdivid|scal(ed|ing|e)\b|factor|world[_ ]size"
        r"|loss.{0,40}(mean|averag|sum)|\b[24](\.0)?x|x ?[24](\.0)?\b|\btwice\b|doubl"),
    rec("hf_trainer.callback_lr_rank0", "a callback halves the lr at each step end on rank 0 only", "state before step",
        "one rank alone (its lr), from step 1", LR, r"param[_ ]?groups?|hyper-?param"),
    # compile_amp
    rec("compile_amp.clip_before_unscale", "clip_grad_norm_ on the GradScaler-scaled gradients", "update",
        "all modules (clipped to max_norm / scale)", r"clip|unscale|grad ?scaler|\bscaler\b|scaled (gradients|grads)|loss scal"),
    rec("compile_amp.onecycle_steps_per_device", "OneCycleLR total_steps W x too long", "state before step",
        "some steps (lr from step 1)", LR),
    rec("compile_amp.sched_before_step", "scheduler.step() before optimizer.step()", "state before step",
        "some steps (lr from step 0)", LR),
    rec("compile_amp.no_set_epoch", "set_epoch left out: epoch 2 repeats epoch 1's order", "inputs",
        "some steps (epoch 2)", r"set_epoch|epoch|shuffl", ROWS_DIFFER),
    rec("compile_amp.val_from_train_iter", "validation takes a batch from the training iterator: a training batch skipped",
        "inputs", "some steps (after the first validation)", ROWS_DIFFER, r"validat|\beval|iterator"),
    rec("compile_amp.double_step", "optimizer.step() after scaler.step(optimizer): each batch's step applied twice",
        "step count", "every rank two optimizer steps per batch",
        r"twice|two (optimizer )?steps|step(ped)? (again|twice)|extra (optimizer )?step|step count|number of steps"
        r"|more steps|(without|no) (a )?(new )?(backward|forward)|same (gradients|grads|batch)|repeat|\b16\b|double"),
    # peft_lora
    rec("peft_lora.no_task_type", "LoraConfig without task_type: the classifier head frozen", "state before step",
        "some modules (the classifier) never trained",
        r"frozen|requires_grad|not (trained|updated|stepped|moved)|never (trained|updated|stepped|moved)|classifier"
        r"|modules_to_save|task_type|trainable|(parameters?|names?|tensors?).{0,40}(missing|absent|not (found|in|stepped))"),
    rec("peft_lora.no_dist_sampler", "no DistributedSampler: every rank reads the same rows", "inputs", "certain rows",
        SAME_ROWS),
    rec("peft_lora.no_sync_last", "no_sync around the last micro-batch: the first synced, the last local", "synced gradients",
        "all trained modules, each rank its own gradient", NOT_SYNCED, r"no_sync"),
    rec("peft_lora.merged_after_eval", "merge_adapter() at validation, never unmerged: LoRA gets no gradient after step 2",
        "raw gradients", "some modules (LoRA) from step 2",
        r"merge|adapter|lora|(no|zero|none|missing) grad|(gradients?|grads) (are |is )?(none|zero|missing)"
        r"|not (trained|updated|moved|receiv)|frozen|unused|requires_grad|did not move"),
    rec("peft_lora.sched_per_micro", "scheduler.step() every micro-batch: the schedule runs twice as fast",
        "state before step", "some steps (lr from step 1)", LR),
    rec("peft_lora.zero_grad_every_micro", "zero_grad before every backward: the first micro-batch dropped",
        "raw gradients", "all trained modules", ZERO_MICRO),
]

BY_ID = {r["id"]: r for r in RUBRIC}


def right(bug_id: str, cause: str | None) -> bool:
    """Whether ``cause`` (the first "likely cause" line) names the expected cause of ``bug_id``."""
    if not cause:
        return False
    text = cause.lower()
    return any(re.search(p, text) for p in BY_ID[bug_id]["accept"])
