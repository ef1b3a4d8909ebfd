"""What a simulation gives back: ``Simulation`` (the test's), its steps and memory figures, and the
terminal table. Plain data, so the figures cross from the simulated rank to the test process."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Iterator, List, Sequence

from ..timing.measure import fmt_time

# Short names for the table's cells (the full names are the keys of ``Simulation.collectives``).
ABBREVIATIONS = {
    "all_gather_into_tensor": "AG", "reduce_scatter_tensor": "RS", "all_reduce": "AR",
    "all_to_all_single": "A2A", "broadcast": "BC", "all_gather": "AG*", "reduce_scatter": "RS*",
    "all_gather_into_tensor_coalesced": "AGc", "reduce_scatter_tensor_coalesced": "RSc",
    "all_reduce_coalesced": "ARc",
}


def fmt_bytes(n: float) -> str:
    """Three significant digits from bytes to TiB: shards at 1,024 ranks are a few KiB, models GiB
    (``timing.measure.fmt_bytes`` rounds to whole KiB/MiB, which reads 0 for a small shard)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def fmt_collectives(counts: Dict[str, int]) -> str:
    """``AG 16 RS 8``: a collectives cell that fits a terminal row."""
    if not counts:
        return "-"
    return " ".join(f"{ABBREVIATIONS.get(k, k)} {v}" for k, v in sorted(counts.items()))


class Counts(Dict[str, int]):
    """Op name -> count (or bytes): a plain dict that answers 0 for an op never issued, so
    ``sim.collectives["all_gather_into_tensor"]`` reads 0 where the step issued none, and
    ``sim.collectives == {"all_reduce": 2}`` compares as the dict it is. Reading a missing op adds
    nothing to it."""

    def __missing__(self, key: str) -> int:
        return 0

    def __repr__(self) -> str:
        return dict.__repr__(self)


@dataclass(frozen=True)
class MemoryFigures(Mapping):
    """Bytes this rank holds at one moment (its local shards), by what holds them. Read as attributes
    (``m.params``) or as a mapping (``m["params"]``).

    Attributes:
        params: Parameters' storage, each once.
        grads: Gradients'.
        optimizer: The optimizer's state.
        buffers: Modules' buffers.
        live: Every tensor storage alive then.
    """

    params: int = 0
    grads: int = 0
    optimizer: int = 0
    buffers: int = 0
    live: int = 0

    def __getitem__(self, key: str) -> int:
        if key not in self._keys():
            raise KeyError(f"{key!r}: memory figures are {', '.join(self._keys())}")
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    @classmethod
    def _keys(cls) -> List[str]:
        return [f.name for f in fields(cls)]


@dataclass
class StepFigures:
    """One step: the user's ``step(name)``, or the work up to and including one ``optimizer.step()``.

    Attributes:
        name: The step's name.
        collectives: Op name -> how many the step issued.
        comm_bytes: Bytes this rank sent in the step.
        peak_bytes: The most tensor memory alive at once in the step.
        memory: What the rank held at the step's end.
        wall_s: Seconds the step took in the simulated rank.
        comm_bytes_by_op: Op name -> bytes sent.
    """

    name: str
    collectives: Dict[str, int]
    comm_bytes: int
    peak_bytes: int
    memory: MemoryFigures  # at the step's end
    wall_s: float
    comm_bytes_by_op: Dict[str, int] = field(default_factory=dict)  # op name -> bytes sent

    def __post_init__(self) -> None:
        self.collectives, self.comm_bytes_by_op = Counts(self.collectives), Counts(self.comm_bytes_by_op)


@dataclass
class SimRecord:
    """What the simulated rank sends back (``Simulation`` without what only the test process knows)."""

    value: Any
    collectives: Dict[str, int]
    comm_bytes: int
    peak_bytes: int
    memory: MemoryFigures
    steps: List[StepFigures]
    wall_s: float
    comm_bytes_by_op: Dict[str, int] = field(default_factory=dict)


@dataclass
class Simulation:
    """One call of ``fn`` as rank ``rank`` of a fake process group of ``world_size`` ranks, as
    ``pytest_mgpu.simulate`` returns it.

    Attributes:
        world_size: The ranks of the job played.
        rank: The rank played.
        value: ``fn``'s return value.
        collectives: Op name -> count, by the names users know (``all_gather_into_tensor``,
            ``reduce_scatter_tensor``, ``all_reduce``, ...), raw c10d and functional ops alike;
            0 for an op never issued.
        comm_bytes: Bytes this rank sends, under the ring algorithms NCCL uses for large messages.
        peak_bytes: The most tensor memory alive at once.
        memory: What the rank holds at the end of the last step (of the call, without steps).
        steps: Per-step figures: one per ``optimizer.step()``, or per ``step(name)`` block.
        wall_s: Seconds ``fn`` took in the simulated rank.
        call_s: Seconds of the whole call: process start, ``fn``, return.
        fn: ``fn``'s qualified name.
        comm_bytes_by_op: Op name -> bytes sent (0 for an op never issued).
    """

    world_size: int
    rank: int
    value: Any
    collectives: Dict[str, int]
    comm_bytes: int
    peak_bytes: int
    memory: MemoryFigures
    steps: List[StepFigures] = field(default_factory=list)
    wall_s: float = 0.0  # fn in the simulated rank
    call_s: float = 0.0  # the whole simulate() call: process start, fn, return
    fn: str = ""
    comm_bytes_by_op: Dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.collectives, self.comm_bytes_by_op = Counts(self.collectives), Counts(self.comm_bytes_by_op)

    def format(self, tablefmt: str = "simple") -> str:
        """A heading and one row per step, then the whole call, as the timing report draws tables.

        Args:
            tablefmt: A ``tabulate`` table format ("simple", "github", ...).
        """
        from tabulate import tabulate

        head = (f"simulate({self.fn}): rank {self.rank} of {self.world_size}, fake process group on cpu; "
                f"fn {fmt_time(self.wall_s)}, call {fmt_time(self.call_s)}")
        names = sorted({n for s in self.steps for n in s.collectives} | set(self.collectives))
        headers = ["step"] + names + ["sent", "peak", "params", "grads", "optimizer", "wall"]
        rows = [self._row(s.name, s.collectives, s.comm_bytes, s.peak_bytes, s.memory, s.wall_s, names)
                for s in self.steps]
        rows.append(self._row("whole call", self.collectives, self.comm_bytes, self.peak_bytes, self.memory,
                              self.wall_s, names))
        table = tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True)
        return head + "\n" + table

    @staticmethod
    def _row(name: str, counts: Dict[str, int], sent: int, peak: int, memory: MemoryFigures, wall: float,
             names: Sequence[str]) -> List[str]:
        return ([name] + [str(counts.get(n, 0)) for n in names]
                + [fmt_bytes(sent), fmt_bytes(peak), fmt_bytes(memory.params), fmt_bytes(memory.grads),
                   fmt_bytes(memory.optimizer), fmt_time(wall)])

    def summary_row(self) -> Dict[str, Any]:
        """Plain data for the session's table of simulations (crosses xdist as JSON)."""
        return {"fn": self.fn, "world_size": self.world_size, "rank": self.rank,
                "collectives": dict(self.collectives), "comm_bytes": self.comm_bytes,
                "peak_bytes": self.peak_bytes, "memory": dict(self.memory), "wall_s": self.wall_s}
