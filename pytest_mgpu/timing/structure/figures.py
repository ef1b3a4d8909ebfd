"""The structure of one call: per rank, per step, the collectives by public name (``simulate.wire``),
their count and the bytes this rank sends, and peak memory where it is exact (CUDA's allocator, or the
simulated rank's tracker); ``None`` where it is not measured (real CPU ranks). Plain data that
crosses processes and goes to JSON as is."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Literal, Optional, cast, get_args

CallKind = Literal["simulate", "benchmark", "parity", "training"]


@dataclass
class StepStructure:
    """One step of one rank: op name -> count, op name -> bytes sent, peak bytes (None: not exact here)."""

    name: str
    counts: Dict[str, int] = field(default_factory=dict)
    sent: Dict[str, int] = field(default_factory=dict)
    peak_bytes: Optional[int] = None

    @property
    def sent_total(self) -> int:
        return sum(self.sent.values())

    def to_dict(self) -> dict:
        d: dict = {"step": self.name, "counts": dict(sorted(self.counts.items())),
                   "sent": dict(sorted(self.sent.items()))}
        if self.peak_bytes is not None:
            d["peak_bytes"] = self.peak_bytes
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "StepStructure":
        peak = d.get("peak_bytes")
        return cls(str(d["step"]), {str(k): int(v) for k, v in d.get("counts", {}).items()},
                   {str(k): int(v) for k, v in d.get("sent", {}).items()}, None if peak is None else int(peak))


@dataclass
class CallStructure:
    """One call of a test: ``call`` names it within the test (``simulate#0 fsdp_step``,
    ``benchmark ddp``); ``ranks`` maps each measured rank to its steps."""

    call: str
    kind: CallKind
    world_size: int
    ranks: Dict[int, List[StepStructure]] = field(default_factory=dict)
    device: str = ""  # the real ranks' device type ("cpu", "cuda"); "" for a simulated rank

    def to_dict(self) -> dict:
        d: dict = {"kind": self.kind, "world_size": self.world_size}
        if self.device:
            d["device"] = self.device
        d["ranks"] = {str(r): [s.to_dict() for s in steps] for r, steps in sorted(self.ranks.items())}
        return d

    @classmethod
    def from_dict(cls, call: str, d: dict) -> "CallStructure":
        raw = d.get("kind")
        kind = cast(CallKind, raw) if raw in get_args(CallKind) else "benchmark"  # a file older than the kind
        return cls(call, kind, int(d.get("world_size", 0)),
                   {int(r): [StepStructure.from_dict(s) for s in steps] for r, steps in d.get("ranks", {}).items()},
                   str(d.get("device", "")))


def of_simulation(sim, index: int) -> CallStructure:
    """A ``Simulation``'s structure: its steps (marked, else one per ``optimizer.step()``), else the
    whole call as one step. The simulated rank's peak is exact (every storage is tracked)."""
    steps = [StepStructure(s.name, dict(s.collectives), dict(s.comm_bytes_by_op), int(s.peak_bytes))
             for s in sim.steps]
    if not steps:
        steps = [StepStructure("whole call", dict(sim.collectives), dict(sim.comm_bytes_by_op), int(sim.peak_bytes))]
    name = sim.fn.rsplit(".", 1)[-1] or "fn"
    return CallStructure(f"simulate#{index} {name}", "simulate", sim.world_size, {sim.rank: steps})


def of_benchmark(name: str, world_size: int, per_rank: Dict[int, List[StepStructure]],
                 device: str = "") -> CallStructure:
    """A ``dist.benchmark`` call's structure, from every rank's recorded steps."""
    return CallStructure(f"benchmark {name}", "benchmark", world_size, dict(per_rank), device)


def of_parity(strategy: str, index: int, world_size: int, per_rank: Dict[int, List[StepStructure]],
              device: str = "") -> CallStructure:
    """An ``assert_parity`` call's structure: per rank, per training step, what the strategy's forward,
    backward and optimizer step issued (the one all-reduce that averages the loss for the report
    included; the gathers that record gradients and parameters for the comparison not)."""
    return CallStructure(f"parity#{index} {strategy}", "parity", world_size, dict(per_rank), device)


def of_training(name: str, index: int, world_size: int, per_rank: Dict[int, List[StepStructure]],
                device: str = "") -> CallStructure:
    """An ``assert_same_training`` call's structure: per rank, what the user's loop issued before its
    first forward (``setup``) and in each training step up to the end of its ``optimizer.step()``
    (the gathers that record gradients and parameters for the comparison not included)."""
    return CallStructure(f"same_training#{index} {name}", "training", world_size, dict(per_rank), device)
