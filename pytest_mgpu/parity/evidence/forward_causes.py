"""The causes read where the model's forward or its loss differ in part: a loss term that reaches part of
the model, another argument of the model's call, the code between two modules, a module computing
otherwise, and the layouts' forward causes (read by ``causes.py`` after ``table.TABLE``)."""
from __future__ import annotations

from typing import Final

from .conditions import always, hand_scale, later_step, local_batch, loss_calls, scaled
from .table import TABLE, Cause

# The model's outputs differ for the same rows and weights: the forward causes of a loss that differs (the
# layouts' first: experts, parts held per rank, layers sharded by hand, an RNN, a sequence split), then where the
# trail through the model shows the place (evidence/trail.py): code between two modules, or a module other than
# a BatchNorm computing otherwise from the same input; then BatchNorm and dropout; then a forward computed
# otherwise where none of their conditions holds.
FED_OTHER: Final = Cause(
    "forward-other", "the loop feeds the model another input beside the rows (an attention mask, decoder inputs, "
    "positions or labels built otherwise)", "build every argument of the model's call as the reference does, "
    "over the rank's slice of the global batch (shift, pad and mask the rank's rows exactly as the whole batch's)",
    "", lambda x, f: x.names[:1] == ("fed",))
FED_MISSING: Final = Cause(
    "forward-other", "the model is called with another set of arguments than in the reference (an attention mask, "
    "positions or labels left out or added)", "pass the model the same arguments as the reference, each built for "
    "the rank's rows", "", lambda x, f: x.names[:1] == ("fed",) and x.names[2:3] == ("missing",))
FED_SLICE: Final = Cause(
    "forward-other", "each rank gets another slice of a batch-wide input beside the rows (noise or a mask drawn for "
    "the whole batch: the same block on every rank, or another offset)", "take the rank's own "
    "block of every batch-wide input, at the same offset as its rows (rank x the per-rank batch)", "",
    lambda x, f: x.names[:1] == ("fed",) and x.names[2:3] == ("slice",))
FED_DRAW: Final = Cause(
    "forward-other", "an input beside the rows is drawn per rank (noise or a mask from a seed of the rank's own), "
    "not for the whole batch", "draw it for the "
    "global batch with a generator seeded alike on every rank, and take the rank's slice",
    "", lambda x, f: x.names[:1] == ("fed",) and x.names[2:3] == ("draw",))
ROUTED: Final = Cause(
    "forward-other", "the tokens routed to a module differ (a top-k, capacity or token drop decided from the rank's "
    "tokens, or routing noise drawn per rank)", "route as the reference does over the global batch: capacities and "
    "token priorities counted over every rank's tokens (all-gather or all-reduce the counts), routing noise drawn "
    "for the whole batch and sliced per rank", "", lambda x, f: x.names[:1] == ("routed",))
BETWEEN: Final = Cause(
    "forward-other", "the model's own code makes a module's input otherwise (a random draw, mask, index, count or "
    "token capacity per rank, or an exchange between ranks)", "compute that input as the reference does: "
    "random draws for the global batch (a generator seeded alike on every rank, then the rank's slice), counts, "
    "shapes and indices over the whole batch, and each step of the code in the reference's order", "",
    lambda x, f: x.names[:1] == ("between",))
MODULE: Final = Cause(
    "forward-other", "a module computes otherwise from the same input (its buffers, mode, randomness or a "
    "collective inside it)", "make that module's call the reference's: the same mode and buffers, "
    "random draws for the global batch, and any collective inside it run exactly once", "",
    lambda x, f: x.names[:1] == ("module",) and "BatchNorm" not in x.names[-1])
_DERIVED: Final = tuple(Cause("forward-other", c.what, c.fix, c.why, c.when) for c in TABLE if c.signal == "loss-other"
                        and c.when not in (always, scaled, local_batch, hand_scale, later_step, loss_calls))
_STATS: Final = tuple(c for c in _DERIVED if c.what.startswith(("BatchNorm", "Dropout")))
LAYOUTS: Final = tuple(c for c in _DERIVED if c not in _STATS)  # a forward that exchanges rows by its layout
# A loss term that reaches part of the model (evidence/loss.py): the loss causes that hold under their own
# conditions first (a scaler, BatchNorm, dropout, the layouts), then the term.
LOSS_TERM: Final = tuple(Cause("loss-term", c.what, c.fix, c.why, c.when) for c in TABLE
                         if c.signal == "loss-other" and c.when is not always) + (
    Cause("loss-term", "a loss term reaching only part of the model differs (an auxiliary, KL or penalty term "
          "over the rank's own rows or counts, or its coefficient annealed or scaled otherwise)",
          "compute that term and its coefficient as the reference does: its schedule counted in optimizer steps, "
          "its normalisation over the global batch, its reduction (sum or mean) the same",
          "With the same weights, the loss differs while the gradients of the rest of the model agree: the term "
          "that differs does not reach the model's final output."),)
FORWARD: Final = LOSS_TERM + (FED_MISSING, FED_SLICE, FED_DRAW, FED_OTHER) + LAYOUTS + (ROUTED, BETWEEN, MODULE) + _STATS + (
    Cause("forward-other", "the model's forward computes otherwise on the ranks (a layer reading other ranks' data, "
          "a buffer or a mode differs)", "find the first module whose output differs for one batch on both sides "
          "and compute it as the reference does"),)
