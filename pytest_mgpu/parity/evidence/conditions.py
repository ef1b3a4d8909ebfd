"""When a cause applies: tests on a finding and the run's facts (an exact factor equal to the world size,
its inverse, the backward passes, the local batch or a GradScaler's scale; the layout the ranks hold),
read by the table of causes (``causes.py``)."""
from __future__ import annotations

import math

from ..record.where import TRAIN_NO_GRAD
from .facts import UserFacts
from .finding import Finding
from .loss_ops import difference


def _near(k: float, target: float) -> bool:
    return target > 0 and math.isfinite(k) and abs(k / target - 1) < 0.02


def world(x: Finding, f: UserFacts) -> bool:
    return f.world_size > 1 and _near(x.value, f.world_size)


def inverse(x: Finding, f: UserFacts) -> bool:
    return f.world_size > 1 and _near(x.value, 1 / f.world_size)


def passes(x: Finding, f: UserFacts) -> bool:
    return f.rank_backwards > 1 and _near(x.value, f.rank_backwards)


def local_batch(x: Finding, f: UserFacts) -> bool:
    rows = len(f.rank_rows[0][0]) if f.rank_rows and f.rank_rows[0] and f.rank_rows[0][0] else 0
    return rows > 1 and _near(x.value, rows)


def scale_of(f: UserFacts, step: int) -> float:
    """The GradScaler scale rank 0 scaled its loss by at ``step``, else the reference's (NaN: no scaler)."""
    per_rank = f.rank_scaler[step] if step < len(f.rank_scaler) else []
    mine = float(per_rank[0][0]) if per_rank and per_rank[0] else math.nan
    ref = f.ref_scaler[step] if step < len(f.ref_scaler) else ()
    return mine if math.isfinite(mine) or not ref else float(ref[0])


def scaled(x: Finding, f: UserFacts) -> bool:
    """The factor is the ranks' GradScaler scale (or its inverse): gradients or norms still scaled."""
    k = scale_of(f, x.step)
    return math.isfinite(k) and k > 1 and (_near(x.value, k) or _near(x.value, 1 / k))


def hand_scale(x: Finding, f: UserFacts) -> bool:
    """No GradScaler's scale explains the factor, and it is an exact power of two of 2^7 or more (or its
    inverse): a loss scale kept by hand (apex/Megatron style), multiplied in and not divided out once."""
    if math.isfinite(scale_of(f, x.step)) or not math.isfinite(x.value) or x.value <= 0:
        return False
    e = math.log2(x.value)
    return abs(e) >= 7 and abs(e - round(e)) < 1e-3


def scaler_order(f: UserFacts, step: int) -> str:
    """The ranks' GradScaler scale and what their step did with it, in order: ``65536, with
    clip_grad_norm_ before scaler.unscale_``."""
    per_rank = f.rank_scaler[step] if step < len(f.rank_scaler) else []
    order = list(per_rank[0][1]) if per_rank and per_rank[0] else []
    said = f"{scale_of(f, step):g}"
    if "clip" in order and "unscale_" in order:
        first = order.index("clip") < order.index("unscale_")
        return said + (", with clip_grad_norm_ before scaler.unscale_" if first else
                       ", with scaler.unscale_ before clip_grad_norm_")
    if "clip" in order:
        return said + ", with clip_grad_norm_ and no scaler.unscale_ in the step"
    return said


def passes_at(f: UserFacts, step: int) -> tuple:
    """(rank 0's backward passes, the reference's) at ``step`` (0 where not recorded)."""
    mine = f.rank_step_backwards[step] if step < len(f.rank_step_backwards) else []
    ref = f.ref_step_backwards[step] if step < len(f.ref_step_backwards) else 0
    return (mine[0] if mine else 0), ref


def micro_steps(x: Finding, f: UserFacts) -> bool:
    """The ranks stepped after fewer backward passes than the reference accumulates, and fed that much
    less per step: an optimizer step per micro-batch, not per accumulated batch."""
    mine, ref = passes_at(f, x.step)
    return ref > 1 and 0 < mine < ref and _near(x.value, mine / ref)


def no_backward(x: Finding, f: UserFacts) -> bool:
    """No backward pass ran in any step on rank 0 nor in the reference: the loop sets the gradients itself
    (a step of a second optimizer after another's backward ran none of its own, so every step is read)."""
    mine = [per_rank[0] for per_rank in f.rank_step_backwards if per_rank]
    return bool(mine) and bool(f.ref_step_backwards) and not any(mine) and not any(f.ref_step_backwards)


def passes_words(f: UserFacts, step: int) -> str:
    mine, ref = passes_at(f, step)
    return f"{mine} backward pass{'es' if mine > 1 else ''} per step on the ranks, {ref} in the reference"


def batch_statistics(x: Finding, f: UserFacts) -> bool:
    """BatchNorm in training mode on the ranks, and the reference's normalises over more rows than a rank's
    call (not over blocks of a rank's size, as shuffled or ghost BatchNorm does)."""
    mine, ref = f.batchnorm_rows
    return bool(f.rank_batchnorm or f.batchnorm) and not (mine and ref and ref <= mine)


def experts_only(x: Finding, f: UserFacts) -> bool:
    """Expert parallel, and every module the finding names holds only experts' tensors (none shared)."""
    return bool(f.shared) and bool(x.names) and not any(
        s == m or s.startswith(m + ".") for m in x.names for s in f.shared)


def experts(f: UserFacts) -> bool:
    """Each rank holds parts of its own beside shared tensors, and the user's names call them experts."""
    return bool(f.shared) and any("expert" in name.lower() for name in f.owned)


def experts_by_hand(x: Finding, f: UserFacts) -> bool:
    """Tensors sharded by hand whose ranks each fed their own rows (each routes its own tokens to the experts
    it holds: expert parallel), or named experts: not a tensor-parallel layer's pieces over one batch."""
    return bool(f.hand_sharded) and (any("expert" in n.lower() for n in f.hand_sharded) or f.experts_by_rows)


def by_hand(x: Finding, f: UserFacts) -> bool:
    """Tensors sharded by hand across tensor-parallel peers that share one batch."""
    return bool(f.hand_sharded) and not experts_by_hand(x, f)


def owned_parts(x: Finding, f: UserFacts) -> bool:
    """As ``experts_only``, where the parts each rank holds alone are not named experts (embedding tables
    sharded table-wise, a layer placed per rank)."""
    return experts_only(x, f) and not experts(f)


def below(x: Finding, f: UserFacts) -> bool:
    return math.isfinite(x.value) and x.value < 1


def always(x: Finding, f: UserFacts) -> bool:
    return True


def inside(x: Finding, f: UserFacts) -> bool:
    """The model's outputs and the gradient the loss gave them agree at the first step (``outputs.agree``, read once into the facts),
    and the finding is there: the parameters' gradients that differ were made by the model's backward."""
    return x.step == 0 and f.outputs_agree


STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def stats_in_train_no_grad(x: Finding, f: UserFacts) -> bool:
    """The state that differs is running statistics alone, and before it differed (this step or the one
    before) a forward under no_grad ran in training mode on some rank where the reference's ran in eval
    mode: that forward updated them (a validation, target or averaged copy's pass without ``eval()``)."""
    if not x.names or not all(n.rsplit(".", 1)[-1] in STATISTICS for n in x.names):
        return False
    for s in (x.step - 1, x.step):
        ranks = f.rank_where[s] if 0 <= s < len(f.rank_where) else []
        ref = f.ref_where[s] if 0 <= s < len(f.ref_where) else {}
        if any(w.get(TRAIN_NO_GRAD) for w in ranks) and ref.get("forward under no_grad") and not ref.get(TRAIN_NO_GRAD):
            return True
    return False


def later_step(x: Finding, f: UserFacts) -> bool:
    """A loss that agreed at the steps before (with the same weights and rows) and differs from this one."""
    return x.step > 0 and not x.names


def loss_calls(x: Finding, f: UserFacts) -> bool:
    """With the same weights, the calls that made rank 0's loss at the finding's step differ from the
    reference's (``loss_ops.difference``: step 0, and the few steps after it)."""
    return difference(f, x.step) is not None
