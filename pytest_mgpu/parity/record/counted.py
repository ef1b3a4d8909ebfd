"""``assert_same_training``'s structure, inside a rank: the collectives the user's own loop issued and
the bytes this rank sent, per training step, for the structure goldens (``timing.structure``).

One ``CollectiveCounter`` is on for the whole loop and is cut into pieces as it runs:
- ``setup``: what the loop did before its first forward of a model with parameters (DDP's broadcast
  of the parameters, a mesh's set-up); empty where the loop calls no module;
- ``step k``: from the end of step k-1's ``optimizer.step()`` (of ``setup``, for step 0) to the end of
  step k's, for the ``steps`` steps recorded. A step is the recorder's: a ``log`` call followed by an
  outermost ``optimizer.step()`` (``record="log"``), or a counted outermost ``optimizer.step()``
  (``record="optimizer"``; a step that changed nothing is not a step, its collectives go to the next).
What the loop does after the last recorded step (an evaluation, a checkpoint) is left out.

Our own work inside the loop (the recorder gathering gradients and parameters at each step, the
watch reading a clipped norm) runs under ``counter.quiet()``: not counted. Where no step could be
cut (a ``record="log"`` loop that never calls ``optimizer.step()``) there is no structure, rather
than one that puts every step in one piece.

The counter leaves ``torch.compile`` alone (``ignore_compile_internals``): a dispatch mode on the
stack otherwise makes Dynamo skip every frame, so the user's compiled loop would run eagerly here. A
compiled graph's collectives are counted as its compiled code issues them.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional

from ...timing.structure.counter import CollectiveCounter
from ...timing.structure.figures import StepStructure


class LoopCounter(CollectiveCounter):
    """A ``CollectiveCounter`` under which ``torch.compile`` still compiles."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class LoopStructure:
    """The pieces of one rank's loop (``counting(side)`` around it); ``result()`` once it ran."""

    def __init__(self, steps: int):
        self.steps = steps
        self.pieces: List[StepStructure] = []
        self._counter: Optional[LoopCounter] = None
        self._side: Any = None  # the recorder's SideLog: its steps say where a step ends
        self._depth = 0
        self._setup = True

    @contextlib.contextmanager
    def counting(self, side) -> Iterator["LoopStructure"]:
        """Count while the loop runs. Installed after the recorder's optimizer hooks, so that at the
        end of an ``optimizer.step()`` the recorder has already decided whether it was a step; its
        last step stops the loop from its own hook (``StopTraining``), before this one's: the exit
        closes that step (a loop that ended by itself closed its steps at their optimizer steps)."""
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._side, self._counter = side, LoopCounter()
        handles = [register_module_forward_pre_hook(self._forward),
                   register_optimizer_step_pre_hook(self._pre), register_optimizer_step_post_hook(self._post)]
        try:
            with self._counter:
                yield self
        finally:
            for h in handles:
                h.remove()
        if self._depth > 0:  # the recorder stopped the loop at the end of its last optimizer.step()
            self._close_steps()

    def result(self) -> Optional[List[StepStructure]]:
        """``setup`` and every step, or None where not every recorded step was cut."""
        return list(self.pieces) if len(self.pieces) == self.steps + 1 else None

    # -- the hooks ------------------------------------------------------------------------------
    def _forward(self, module, args) -> None:
        if self._setup and next(module.parameters(), None) is not None:
            self._cut("setup")

    def _pre(self, optimizer, args, kwargs) -> None:
        self._depth += 1

    def _post(self, optimizer, args, kwargs) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._close_steps()

    def _close_steps(self) -> None:
        if self._setup:
            self._cut("setup", empty=True)  # no module called before the step: all of it is step 0's
        while len(self.pieces) - 1 < min(len(self._side.steps), self.steps):
            self._cut(f"step {len(self.pieces) - 1}")

    def _cut(self, name: str, empty: bool = False) -> None:
        counter = self._counter
        assert counter is not None
        if empty:
            self.pieces.append(StepStructure(name))
        else:
            self.pieces.append(StepStructure(name, dict(counter.counts), dict(counter.sent)))
            counter.counts.clear()
            counter.sent.clear()
        self._setup = False
