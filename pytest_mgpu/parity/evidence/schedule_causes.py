"""The causes of the learning rate (``schedule.py``): a rank's own lr, a factor, a schedule that runs
faster, ahead, slower, frozen or held, a scheduler's metric; read by ``causes.py`` after ``table.TABLE``,
first match wins."""
from __future__ import annotations

from typing import Final, Tuple

from .conditions import inverse, world
from .facts import UserFacts
from .finding import Finding
from .plateau import IN_TRAINING, OFTENER, OTHERWISE, REPEATED, SETTINGS
from .table import SAME_LR, SAME_OPT, Cause

def skipped_ahead(x: Finding, f: UserFacts) -> bool:
    """The ranks' schedule runs ``x.value`` steps ahead, and their GradScaler skipped at least that many
    updates (each one a scheduler step the reference did not take)."""
    return 1 <= x.value <= f.rank_scaler_skips  # NaN (no count of steps ahead): never


SCHEDULE: Final[Tuple[Cause, ...]] = (
    Cause("lr-rank", "one rank's learning rate differs", SAME_OPT),
    Cause("lr-metric", "the scheduler's metric differs between ranks (each rank's own value, e.g. its shard's "
          "validation loss, not all-reduced)", "all_reduce the metric's sum and "
          "count over the ranks (or compute it on one rank and broadcast it) before scheduler.step(metric)"),
    Cause("lr-metric-loss", "the scheduler is stepped with each rank's own training loss, not a metric the ranks "
          "share", "step it with the metric the reference uses (a validation loss, all-reduced "
          "over the ranks)"),
    Cause("lr-plateau", "the plateau scheduler's metric is computed in training mode on the ranks (validation "
          "without model.eval())", "call model.eval() before the validation pass and model.train() after it",
          "Dropout is active and BatchNorm normalises with batch statistics.", lambda x, f: IN_TRAINING in x.evidence),
    Cause("lr-plateau", "the plateau scheduler's metric is computed otherwise (duplicates or padding counted, rows "
          "not gathered)", "compute the metric over the validation set's rows once "
          "each, gathered from every rank (accelerate: gather_for_metrics; a DistributedSampler pads with repeated "
          "samples), reduced as the reference does", "Or it is reduced otherwise (a mean of means, a sum).",
          lambda x, f: OTHERWISE in x.evidence),
    Cause("lr-plateau", "the plateau scheduler is built with other settings than the reference's", "build "
          "ReduceLROnPlateau with the reference's mode (min for a loss), factor, patience, threshold and cooldown",
          "", lambda x, f: SETTINGS in x.evidence),
    Cause("lr-plateau", "the plateau scheduler is stepped more than once per call (the same metric given again)",
          "step ReduceLROnPlateau once per validation, itself (do not pass it to accelerator.prepare)",
          "A wrapper steps it once per process (accelerate's prepared scheduler), or it is called twice.",
          lambda x, f: REPEATED in x.evidence),
    Cause("lr-plateau", "the plateau scheduler is stepped, with its validation, more often than the reference's (on "
          "another counter)", "run the validation and scheduler.step(metric) on the reference's schedule (every k "
          "optimizer steps, not batches)", "Counted in micro-batches or batches instead of optimizer steps.",
          lambda x, f: OFTENER in x.evidence),
    Cause("lr-plateau", "the plateau scheduler cut the lr at another step", "step it with the reference's metric (a validation loss over the same rows: in eval mode, "
          "gathered over the ranks without a sampler's padding, once per validation) and build it with the "
          "reference's mode, factor, patience and threshold", "Its metric differs (another pass, mode or set of rows) "
          "or its settings do."),
    Cause("lr-factor", "the ranks' learning rate is 1/world size of the reference's (scaled with the per-rank batch, "
          "not the global one)", "scale the lr with the global batch (the per-rank batch x the data-parallel ranks) "
          "on the ranks, as the reference's batch is", "The lr is scaled by the local batch on the ranks.", inverse),
    Cause("lr-factor", "the ranks' learning rate is world size x the reference's (scaled by the world size once too "
          "often)", "scale the lr alike on both sides: by the global batch, once", "The lr is scaled by the world size "
          "on the ranks and not in the reference, or twice.", world),
    Cause("lr-factor", "the learning rate differs", SAME_LR, "The lr is scaled (by the world size or the global "
          "batch) on one side."),
    Cause("lr-faster", "the scheduler is stepped per micro-batch", "call scheduler.step() right after "
          "optimizer.step(), once per step", "Each micro-batch's backward is followed by a scheduler step, where the "
          "reference steps it once per optimizer step.", lambda x, f: f.rank_backwards > 1 and x.value == f.rank_backwards),
    Cause("lr-faster", "the learning rate differs", "call scheduler.step() right after optimizer.step(), once per step",
          "The scheduler is stepped per micro-batch (several times per optimizer step).",
          lambda x, f: f.rank_backwards > 1),
    Cause("lr-faster", "the ranks' lr schedule runs faster (stepped more than once per update, or its length in "
          "other units: total, T_max, warm-up)", "step the scheduler once per optimizer step, and build it for the reference's number of steps",
          "A length in epochs where the scheduler is stepped per update, or from a shorter loader, makes the same "
          "schedule run k times as fast."),
    Cause("lr-ahead", "the scheduler is stepped on updates the GradScaler skipped (an overflow: no optimizer step), "
          "so the learning rate schedule runs ahead of the reference's", "step the scheduler only when the optimizer "
          "stepped: when scaler.get_scale() did not drop in scaler.update()", "", skipped_ahead),
    Cause("lr-ahead", "the learning rate schedule runs ahead of the reference's", "call scheduler.step() after "
          "optimizer.step(), and only on steps the optimizer took (scaler.step may skip one: step the scheduler when "
          "scaler.get_scale() did not drop)", "The scheduler is stepped before the optimizer, once more at the start, "
          "or on iterations whose optimizer step a GradScaler skipped."),
    Cause("lr-behind", "the ranks' lr schedule runs behind the reference's (its first step at the lr the "
          "reference's schedule starts before)", "count the schedule from the same first step as the reference (a "
          "warm-up of (step + 1) / warmup, not step / warmup) and step it after each optimizer.step()",
          "A warm-up counted from 0 takes its first step at lr 0 and lags one step all along."),
    Cause("lr-slower", "the learning rate schedule runs at half the reference's rate", "build the scheduler for the "
          "number of optimizer steps the ranks take (total_steps, num_training_steps from the per-rank loader length "
          "and the accumulation), and step it once per optimizer step", "The schedule was built for twice the ranks' "
          "steps (a length from another loader or batch), or is stepped every other update."),
    Cause("lr-frozen", "the ranks' learning rate schedule never moves", "step the scheduler once per optimizer step "
          "(scheduler.step(), or a per-update call such as timm's step_update(num_updates)), as the reference does",
          "The scheduler is stepped per epoch, or not at all, where the reference steps it per update."),
    Cause("lr-groups", "the param groups' lrs stand otherwise to each other than in the reference (a per-group "
          "lr scale, e.g. layer-wise lr decay's lr_scale, left out, reversed or moved)", "give each param group the same lr (base lr x its own scale) on both sides, and keep the scale "
          "when the schedule writes the lr into the groups", "A schedule that sets one lr in every group, or scales "
          "built from other layer ids, names or order."),
    Cause("lr-held", "the ranks' lr is set once per epoch (or every few steps); the reference's changes every "
          "iteration", "set the lr at every optimizer step (scheduler.step() per update, or the "
          "per-iteration adjust at the fractional epoch), as the reference does", "An lr computed from the "
          "integer epoch, or a scheduler stepped per epoch."),
    Cause("lr-warm-up", "the ranks' warm-up is counted in other units (it lasts another number of steps)", "count the warm-up and the schedule's length in the optimizer steps the ranks take: iterations "
          "per epoch from the ranks' loader (the global batch), not from the rank's batch or the data set's size",
          "Iterations per epoch taken from the per-rank batch (W x too many), or a warm-up given in epochs on one "
          "side and in steps on the other."),
    Cause("lr-schedule", "the learning rate differs", "step and restore the scheduler alike on both sides",
          "A scheduler stepped at another rate or point, created with other arguments, restarted, or not restored "
          "with a checkpoint (its state_dict saved and loaded beside the optimizer's)."),
)
