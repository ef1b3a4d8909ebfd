"""What each rank of the user's loop holds, read from what it recorded (test process): which
ranks hold the same parameters (a pipeline stage, or every rank), which share one batch (tensor
or sequence parallel peers), and so how the ranks' losses make the one-device loss.

- Data-parallel replicas (DDP, FSDP, the dp dimension of a 2-D mesh) each hold their shard's mean
  loss: the global loss is their mean.
- Tensor/sequence-parallel peers hold one loss between them: the same number on each (a replicated
  output, ``loss_parallel``), counted once. Where the peers' losses differ (each computed a loss over
  its own shard of the output), how the parts add up cannot be told from outside: the loss is not
  compared, the gradients and parameters are, and the report says so.
- Pipeline stages hold other parameters; the loss lives on the ranks that backpropagated one (the
  last stage). A rank that backpropagated no scalar holds no loss and is left out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Tuple

from ..record.recorder import SideLog, StepLog

SAME_LOSS = 1e-6  # relative: peers' copies of one replicated loss (bitwise in practice)


@dataclass
class Layout:
    """The ranks grouped by what they hold."""

    stages: List[List[int]]  # ranks holding the same parameter names, in rank order (one group: no pipeline)
    groups: List[List[int]]  # ranks sharing one batch (tensor/sequence parallel peers); singletons otherwise
    notes: List[str] = field(default_factory=list)
    shared: FrozenSet[str] = frozenset()  # names every rank holds, where ranks also hold names of their own (experts)
    experts_by_hand: bool = False  # the tensors the peers' pieces make are experts (set once mapping found them)
    own_rows: bool = False  # ...and each of those ranks fed rows of its own: each holds its own rows' loss

    @classmethod
    def of(cls, ranks: List[SideLog], tied: FrozenSet[str] = frozenset()) -> "Layout":
        """``tied``: tensors that ranks holding other parts each keep a copy of (a pipeline's tied
        embedding): held by several stages, not what makes them data-parallel replicas of a part."""
        by_names: Dict[Tuple[str, ...], List[int]] = {}
        for r, side in enumerate(ranks):
            names = tuple(sorted(side.steps[0].params)) if side.steps else ()
            by_names.setdefault(names, []).append(r)
        groups: List[List[int]] = []
        placed: set = set()
        for r, side in enumerate(ranks):
            if r in placed:
                continue
            peers = sorted({r} | {p for p in side.tp_peers if 0 <= p < len(ranks)} - placed)
            placed.update(peers)
            groups.append(peers)
        sets = [set(names) - tied for names in by_names]
        shared = frozenset(set.intersection(*sets)) if len(sets) > 1 else frozenset()
        return cls(list(by_names.values()), groups, shared=shared)

    @property
    def pipeline(self) -> bool:
        """Ranks hold disjoint parts of the model (pipeline stages)."""
        return len(self.stages) > 1 and not self.shared

    @property
    def expert_parallel(self) -> bool:
        """Ranks share some parameters and hold others of their own (experts): data-parallel replicas
        for the shared ones, each its own part of the reference for the rest."""
        return len(self.stages) > 1 and bool(self.shared)

    @property
    def tensor_parallel(self) -> bool:
        return any(len(g) > 1 for g in self.groups)

    def loss(self, step: int, logs: List[StepLog]) -> Optional[float]:
        """The one-device loss the ranks' losses make at this step; None where it cannot be told
        (the reason is added to ``notes`` once)."""
        holders = [r for r, s in enumerate(logs) if s.backwards > 0]
        if not holders:
            return math.nan
        parts = []
        for group in [[r] for g in self.groups for r in g] if self.own_rows else self.groups:
            held = [logs[r].loss for r in group if r in holders]
            if not held:
                continue
            if len(held) > 1 and not _same(held):
                self._note(f"the loss was not compared: ranks {', '.join(map(str, group))} share one batch on a "
                           f"tensor/sequence-parallel mesh but hold different losses (step {step}: "
                           f"{', '.join(f'{x:.6g}' for x in held)}), each a part computed on its own shard of the "
                           "output; how the parts add up (a sum or a mean) cannot be told from outside. Gradients "
                           "and parameters were compared. To compare the loss too, reduce it over the mesh (e.g. "
                           "loss_parallel, or a Replicate output) before backward")
                return None
            parts.append(math.fsum(held) / len(held))
        return math.fsum(parts) / len(parts)

    def describe(self) -> str:
        """How the ranks were judged, for the report ("" for one rank)."""
        words = []
        if not self.tensor_parallel and len(self.stages) == 1 and len(self.stages[0]) > 1:
            ranks = self.stages[0]
            consecutive = ranks == list(range(ranks[0], ranks[-1] + 1))
            span = f"{ranks[0]}-{ranks[-1]}" if consecutive else ", ".join(map(str, ranks))
            words.append(f"data-parallel replicas: ranks {span} each hold the whole model, judged as replicas of "
                         "rank 0's, their rows together against the reference's batch")
        if self.pipeline:
            words.append(f"{len(self.stages)} pipeline stages (" + "; ".join(
                f"ranks {', '.join(map(str, s))}" for s in self.stages) + "), each matched to its part of the model")
        if self.expert_parallel:
            words.append(f"expert parallel: every rank holds {len(self.shared)} shared tensor(s), judged as "
                         "replicas of rank 0's, and its own experts, judged against their part of the model")
        if self.tensor_parallel:
            peers_are = "tensor/sequence-parallel peers share one batch and one loss"
            if self.experts_by_hand:
                peers_are = "expert-parallel ranks (experts sharded by hand)" + (
                    ", each with its own rows and loss" if self.own_rows else " share one batch and one loss")
            words.append(peers_are + " (" + "; ".join(
                "ranks " + ", ".join(map(str, g)) for g in self.groups if len(g) > 1) + ")")
            peers = [g for g in self.groups if len(g) > 1]
            if len(peers) > 1 and len({len(g) for g in peers}) == 1:
                words.append("data-parallel replicas across those groups (" + "; ".join(
                    "ranks " + ", ".join(str(g[i]) for g in peers) for i in range(len(peers[0]))) + ")")
        return "; ".join(words)

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _same(values: List[float]) -> bool:
    lo, hi = min(values), max(values)
    return hi - lo <= SAME_LOSS * max(abs(lo), abs(hi), 1e-30) or not all(map(math.isfinite, values))
