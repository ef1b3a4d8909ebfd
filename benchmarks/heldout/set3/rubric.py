"""The expected first cause of every bug of ``benchmarks/heldout/set3/``, written and committed before any
benchmark run, and not changed after.

One record per bug: ``id`` ("family.bug"), ``family``, ``what`` (the bug, one line), ``phase``
(where it first shows in a step: "state before step", "inputs", "loss", "raw gradients", "synced
gradients", "update"), ``how`` (how it shows at 2 ranks: "one rank alone", "uniform factor <value>",
"some modules <names>", "certain rows", "some steps"), and ``accept``: lowercase regexes, any one of
which found in the FIRST "likely cause" line of the failure message makes the diagnosis right.
``accept`` names the cause (what a competent engineer would accept as naming the bug), not an
expected wording: a line that only says something "differs" or "diverges" is not accepted.
"""
from __future__ import annotations

import re

from . import FAMILIES  # noqa: F401  (the families these records cover)

LR = r"learning rate|\blr\b|schedul|warm-?up"
SEED = r"seed|\brng\b|random (state|generator|stream)|generator"
ZERO_GRAD = (r"zero_grad|accumulat|not (been )?(zeroed|cleared|reset)|stale (grad|gradients)|leftover"
             r"|previous (step|iteration)'?s? grad|carried over|pile")
NOT_SYNCED = (r"all[-_ ]?reduc|not (been )?(synchroni[sz]ed|averaged|reduced|all-reduced)"
              r"|never (averaged|reduced|synchroni[sz]ed|all-reduced)|unsynced|un-synchronized|no_sync"
              r"|(gradients?|grads) (differ|disagree)\w* (across|between) (the )?ranks|\bddp\b|local gradients?")
SAME_ROWS = (r"same (input |training )?(rows|data|batch(es)?|inputs?|samples|examples)|identical (rows|data|batch|inputs?)"
             r"|sampler|not sharded|duplicat|overlap")
ROWS_DIFFER = r"(input|data|batch|rows?|samples?).{0,30}(order|differ|mismatch|wrong|not the same)|different (rows|data|inputs?|batch|samples)"
UNIFORM_LOSS = (r"world[_ ]size|num_processes|\bdivid|scal(ed|ing|e)|factor|\b0\.5\b|1/2|\bhalf\b|halv"
                r"|loss.{0,40}(normali[sz]|averag|mean)")
CLIP = r"clip"
NO_GRAD = (r"detach|no[_ ]grad(ient)?|(gradients?|grads) (are |is )?(none|zero|missing|absent)|(not|never) (updated|trained|moved?|receiv|stepped)"
           r"|frozen|requires_grad|graph|did not move|unused")


def rec(id_: str, what: str, phase: str, how: str, *accept: str) -> dict:
    return {"id": id_, "family": id_.split(".")[0], "what": what, "phase": phase, "how": how, "accept": list(accept)}


RUBRIC = [
    # detr_unused
    rec("detr_unused.numboxes_local", "num_boxes from the local batch only: the box loss normalised per rank",
        "loss", "certain rows (each rank's box-loss weight)",
        r"num_boxes|normali[sz]|denominator|count|local (mean|number|average)|per[- ]rank (mean|normali|count)",
        r"all[-_ ]?reduc.{0,40}(count|number|num|loss|box)|box loss|loss.{0,30}(weight|scal)"),
    rec("detr_unused.numboxes_no_world_div", "num_boxes all-reduced but not divided by the world size: box loss x 1/2",
        "loss", "uniform factor 0.5 on the box loss (box head)",
        r"num_boxes|normali[sz]|denominator|world[_ ]size|\bdivid|box loss|loss.{0,40}(scal|weight|factor)|\b0\.5\b|1/2|\bhalf\b"),
    rec("detr_unused.no_set_epoch", "sampler.set_epoch left out: the second epoch's rows are the first's order",
        "inputs", "some steps (epoch 2)", r"set_epoch|epoch|shuffl|sampler", ROWS_DIFFER),
    rec("detr_unused.no_dist_sampler", "no DistributedSampler: every rank reads the same rows", "inputs", "certain rows",
        SAME_ROWS, r"shard"),
    rec("detr_unused.lr_scaled_world", "lr x world size", "update", "uniform factor 2 on the update",
        LR, r"update.{0,40}(scal|factor|larger|twice|2x|doubl)|step size"),
    rec("detr_unused.clip_rank0_only", "gradient clipping on rank 0 only", "update", "one rank alone",
        CLIP, r"(only|just) (on )?(one rank|rank 0|rank zero)|rank[- ]0[- ]only|one rank (alone|only)"
        r"|replicas? (diverg|out of sync|drift)|parameters (diverg|differ)\w* (across|between) (the )?ranks"),
    rec("detr_unused.zero_grad_interval", "zero_grad every second step: gradients accumulate across steps",
        "raw gradients", "some steps", ZERO_GRAD),
    # clip_gather
    rec("clip_gather.gather_no_grad", "non-autograd all_gather of the features, local slice not put back",
        "raw gradients", "all tower modules",
        r"gather|detach|no[_ ]grad|autograd|cross-rank|other ranks'? (features|gradient)|gradient.{0,40}(not flow|not propagat|missing)"),
    rec("clip_gather.nograd_global_loss", "gather_with_grad=False with the full loss: tower gradients x 1/2",
        "raw gradients", "uniform factor 0.5 on the towers (not logit_scale)",
        r"gather|detach|no[_ ]grad|autograd|local slice", UNIFORM_LOSS),
    rec("clip_gather.labels_no_offset", "local_loss labels without the rank offset", "loss", "one rank alone (rank 1)",
        r"label|target|offset|positive|arange|ground truth|class index"),
    rec("clip_gather.no_gather", "contrastive loss over the local batch only", "loss", "certain rows (fewer negatives)",
        r"gather|negatives|local batch|global batch|contrastive|not (shared|exchanged)|in-batch"),
    rec("clip_gather.logit_scale_not_optimized", "logit_scale left out of the optimizer", "update",
        "some modules logit_scale",
        r"logit_scale|optimi[sz]er.{0,60}(miss|not|param|group|skip|omit|lack)|param(eter)? groups?"
        r"|(not|never) (stepped|updated)|frozen|requires_grad"),
    rec("clip_gather.loss_div_world", "loss / world size before backward", "loss", "uniform factor 0.5 on all gradients",
        UNIFORM_LOSS),
    rec("clip_gather.total_steps_per_rank_batch", "cosine schedule length counted with the per-rank batch",
        "update", "some steps (lr after warm-up)", LR, r"total[_ ]steps|cosine"),
    # dcgan_ddp
    rec("dcgan_ddp.noise_same_seed", "every rank the same noise rows (same generator seed)", "inputs", "certain rows",
        SEED, r"noise|latent|\bz\b", SAME_ROWS),
    rec("dcgan_ddp.no_dist_sampler", "no DistributedSampler: every rank the same real rows", "inputs", "certain rows",
        SAME_ROWS, r"shard"),
    rec("dcgan_ddp.d_not_ddp", "netD not wrapped in DDP: its gradients never all-reduced", "synced gradients",
        "some modules netD", NOT_SYNCED, r"not wrapped|wrap"),
    rec("dcgan_ddp.g_no_zero_grad", "netG.zero_grad() missing: G's gradients accumulate", "raw gradients",
        "some modules netG", ZERO_GRAD),
    rec("dcgan_ddp.g_detached_fake", "errG on fake.detach(): G gets no gradient", "raw gradients",
        "some modules netG (no gradient)", NO_GRAD),
    rec("dcgan_ddp.g_module_bypass", "fake made through netG.module: G's gradients never all-reduced",
        "synced gradients", "some modules netG", NOT_SYNCED, r"\.module|bypass|wrap"),
    rec("dcgan_ddp.d_zero_grad_after_real", "netD.zero_grad() after errD_real.backward(): real half of D's gradient lost",
        "raw gradients", "some modules netD", ZERO_GRAD,
        r"(lost|missing|discard|drop)\w*.{0,30}(grad|backward)|first backward|real (half|loss|term)"),
    # hf_tokens
    rec("hf_tokens.mean_per_micro", "token mean per micro-batch / accumulation steps instead of / all tokens of the step",
        "loss", "certain rows (token weights)",
        r"num_items|token|normali[sz]|per[- ]micro|micro[- ]?batch|accumulat|mean of (means|averages)|average of (means|averages)"
        r"|denominator|padding|ignore_index"),
    rec("hf_tokens.num_items_local", "num_items_in_batch counted per rank, no x num_processes", "loss",
        "certain rows (each rank's token weight)",
        r"num_items|token|normali[sz]|denominator|count|local (mean|number|average)|per[- ]rank (mean|normali|count)"
        r"|all[-_ ]?reduc.{0,40}(count|number|num|loss|token)"),
    rec("hf_tokens.no_world_mult", "loss not multiplied by num_processes: gradients x 1/2", "loss",
        "uniform factor 0.5 on all gradients (partly hidden by clipping)", UNIFORM_LOSS, r"num_items|multipl"),
    rec("hf_tokens.sched_per_micro", "lr_scheduler.step() per micro-batch", "update", "some steps (lr)",
        LR, r"too (often|fast)|per micro"),
    rec("hf_tokens.zero_grad_per_micro", "zero_grad per micro-batch: only the last micro-batch's gradient",
        "raw gradients", "certain rows (earlier micro-batches dropped)",
        ZERO_GRAD, r"only (the )?last micro|micro[- ]?batch|cleared|dropped|discard"),
    rec("hf_tokens.clip_each_micro", "clip_grad_norm_ after every micro-batch on local gradients", "synced gradients",
        "all modules", CLIP),
    rec("hf_tokens.no_sync_always", "every micro-batch under no_sync: gradients never all-reduced", "synced gradients",
        "all modules", NOT_SYNCED),
    # ckpt_ddp
    rec("ckpt_ddp.reentrant_input_no_grad", "use_reentrant=True with an input that does not require grad: no gradient to stem and block 0",
        "raw gradients", "some modules stem, blocks.0", r"checkpoint|reentrant", NO_GRAD),
    rec("ckpt_ddp.no_preserve_rng", "preserve_rng_state=False: other dropout masks on recomputation",
        "raw gradients", "all modules", r"rng|random|dropout|seed|checkpoint|recomput|mask"),
    rec("ckpt_ddp.seed_per_rank", "seed + rank: rank 1 draws other dropout masks", "loss", "one rank alone",
        SEED, r"dropout|mask|random"),
    rec("ckpt_ddp.loss_div_world", "loss / world size before backward", "loss", "uniform factor 0.5 on all gradients",
        UNIFORM_LOSS),
    rec("ckpt_ddp.lr_scaled_world", "lr x world size", "update", "uniform factor 2 on the update",
        LR, r"update.{0,40}(scal|factor|larger|twice|2x|doubl)|step size"),
    rec("ckpt_ddp.sched_before_step", "scheduler.step() before optimizer.step(): warm-up one step ahead", "update",
        "some steps (lr)", LR),
    # pipe_gpipe
    rec("pipe_gpipe.scale_grads_false", "scale_grads=False with a mean loss: gradients x n_microbatches (4)",
        "raw gradients", "uniform factor 4 on all gradients",
        r"scale_grads|micro[- ]?batch|accumulat|scal(ed|ing|e)|factor|\bsum(med)?\b|n_microbatches|4x|loss.{0,40}(mean|divid|normali)"),
    rec("pipe_gpipe.loss_div_micro", "loss divided by n_microbatches on top of scale_grads: gradients x 1/4",
        "loss", "uniform factor 0.25 on all gradients",
        r"scale_grads|micro[- ]?batch|accumulat|scal(ed|ing|e)|factor|\bdivid|n_microbatches|0\.25|1/4|loss.{0,40}(mean|normali)"),
    rec("pipe_gpipe.no_zero_grad", "zero_grad missing: gradients accumulate over steps", "raw gradients",
        "all modules", ZERO_GRAD),
    rec("pipe_gpipe.seed_rank_data", "batch generator seeded with seed + rank: targets not the inputs' rows", "inputs",
        "one rank alone (the last stage's targets)", SEED, r"target|label", ROWS_DIFFER),
    rec("pipe_gpipe.sched_last_stage_only", "scheduler stepped on the last stage only", "update",
        "one rank alone (stage 0's lr)", LR),
    rec("pipe_gpipe.clip_per_stage", "each stage clipped by its own norm instead of the global norm", "update",
        "all modules (clip coefficient per stage)", CLIP, r"grad(ient)? norm|total norm"),
]

BY_ID = {r["id"]: r for r in RUBRIC}


def right(bug_id: str, cause: str | None) -> bool:
    """Whether ``cause`` (the first "likely cause" line) names the expected cause of ``bug_id``."""
    if not cause:
        return False
    text = cause.lower()
    return any(re.search(p, text) for p in BY_ID[bug_id]["accept"])
