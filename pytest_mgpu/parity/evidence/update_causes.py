"""The causes of the update phase (``update.py``): with the same weights and gradients, the weights after
the step differ, and how the update differs says which part of the optimizer (``update_shape.py``); read by
``causes.py`` after ``table.TABLE``, first match wins."""
from __future__ import annotations

from typing import Final, Tuple

from .conditions import world
from .table import SAME_OPT, Cause

SUM_FIX = "divide the reduced gradients by the world size (or reduce with ReduceOp.AVG), once, before the step"

UPDATE: Final[Tuple[Cause, ...]] = (
    Cause("update-rank", "one rank's update differs", SAME_OPT, "A learning rate, scheduler or optimizer state that "
          "depends on the rank, or a step or clipping taken on some ranks only."),
    Cause("update-other", "weights that get no gradient are updated otherwise (an EMA or momentum copy, or weights "
          "set outside the optimizer)", "update them as the reference does: the same momentum (m x old + (1 - m) x "
          "new, not swapped), once per optimizer step, after it, from the synchronised weights",
          when=lambda x, f: x.names[:1] == ("gradless",)),
    Cause("update-other", "the step writes a tensor's result into another tensor's place (an all_gather, "
          "broadcast or copy into the wrong slot, an owner or order of the tensors that differs between ranks)",
          "write each gathered or copied result into its own tensor: the same owner map and order of the tensors on "
          "every rank and in the reference", when=lambda x, f: x.names[:1] == ("placed",)),
    Cause("update-other", "the optimizer computes a shape scale of the updates otherwise (a factor from each tensor's "
          "rows and columns, as Muon's sqrt(rows / cols): the dimensions swapped, another exponent, or left out)", "compute each tensor's shape scale as the "
          "reference does: the same dimensions in the same order, the same formula",
          when=lambda x, f: x.names[:1] == ("by-shape",)),
    Cause("update-other", "the optimizer updates the 1-D parameters (biases, norm weights) otherwise: weight decay "
          "or a per-layer adaptation (a trust ratio) given to them on one side and not the other", "exclude (or "
          "include) the same parameters from weight decay and adaptation on both sides: the same param groups, the "
          "same rule for 1-D tensors", when=lambda x, f: x.names[:1] == ("1-D",)),
    Cause("update-other", "the optimizer updates the weight matrices otherwise (the 1-D parameters agree): weight "
          "decay or a per-layer adaptation computed otherwise for them", "compute weight decay and any per-layer "
          "scale of the matrices as the reference does", when=lambda x, f: x.names[:1] == ("N-D",)),
    Cause("update-other", "the optimizer's own rule for the weight matrices computes their update in another "
          "direction (the 1-D parameters agree): its momentum (a Nesterov blend or the buffer alone), an "
          "orthogonalisation or preconditioner, or the order of these, computed otherwise", "compute the matrices' "
          "update as the reference does: the same momentum rule, the same transform, applied in the same order",
          when=lambda x, f: x.names[:1] == ("N-D-rule",)),
    Cause("update-other", "every update is the world size x the reference's with the same learning rate: the "
          "gradients the optimizer steps with are summed over the ranks, not averaged (or a scale multiplied by the "
          "world size)", SUM_FIX, when=lambda x, f: x.names[:1] == ("uniform",) and world(x, f)),
    Cause("update-inside", "every update is the world size x the reference's: the gradients the optimizer reduces "
          "itself are summed over the ranks, not averaged", SUM_FIX,
          when=lambda x, f: x.names[:1] == ("uniform",) and world(x, f)),
    Cause("update-other", "the optimizer scales its whole update otherwise with the same learning rate (a step "
          "size, trust coefficient or scale applied inside the optimizer)", "scale the update as the reference "
          "does: the same coefficients, applied once", when=lambda x, f: x.names[:1] == ("uniform",)),
    Cause("update-other", "a per-tensor scale of the update is computed otherwise (a trust ratio from other norms, "
          "a layer-wise adaptation, an adaptive or relative step size)", "compute each tensor's scale as the "
          "reference does: from that tensor's own weight and gradient norms, with the same coefficient, epsilon "
          "and clipping", when=lambda x, f: x.names[:1] == ("per-tensor",)),
    Cause("update-other", "the optimizer steps otherwise than the reference's", "build the same optimizer with the "
          "same arguments on both sides", "Another optimizer, weight decay, momentum, betas or eps, or the weights "
          "changed outside the optimizer."),
    Cause("update-inside", "the optimizer's step differs, and it owns the gradients (it reduces, scales, clips and "
          "gathers them itself, as a ZeRO optimizer by hand does)", "make each part of the step the reference's: the "
          "reduction (a sum divided by the world size, each rank's own partition), the unscaling and the clipping (by "
          "the all-reduced norm, after unscaling), the overflow check (all-reduced), and the all_gather of the updated "
          "partitions"),
    Cause("update-foreign", "the optimizer holds other parameters", "build the optimizer from the parameters of the "
          "model you run", "It was built on another copy of the model (copy.deepcopy before wrapping, a model "
          "rebuilt after the optimizer)."),
    Cause("update-frozen", "parameters that never change", "build the optimizer from the model's parameters with a "
          "nonzero lr", "The optimizer holds other parameters than the model's, or its lr is 0."),
)
