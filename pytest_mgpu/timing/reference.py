"""The in-run reference: a fixed workload timed next to the user's step, in every rank, A B A B.

Why: on a shared machine the speed of the whole machine moves between launches (lognormal sd
0.10-0.20 on a shared 2-core machine: docs/design/timing-gate.md), far more than a step's own noise inside a launch. A reference that does
not depend on the code under test, run interleaved with the step after the same barrier, sees the
same contention; the gate then judges x = ln(step median / reference median), which cancels the
shared part of that drift (duet benchmarking, Bulej et al., ICPE 2020; RMIT, Abedi & Brecht 2017).

What: dense fp32 matrix products of a fixed size, seed and count, on the rank's device with the
rank's thread count. Matrix products are what torch's compute-bound steps (linear and conv layers)
spend their time in, so they slow down with the same neighbours and the same frequency drops. Measured
(``benchmarks/timing/gate_power.py``, docs/design/timing-gate.md): on the 2-core machine oversubscribed by other test suites, the
correlation between step and reference medians across launches was only 0.31 (a 35 ms step is preempted
far more than this 2 ms reference), so there x = ln(step/reference) spread almost as much as the raw
medians (0.67 vs 0.69 log sd). The rule stays honest anyway (its interval uses the measured spread); a
longer reference would track preemption better but costs every iteration of every test its time.

The workload's hash is stored with every launch in a baseline history: a history recorded with
another reference is not comparable and is not judged against.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Callable


@dataclass(frozen=True)
class ReferenceSpec:
    kind: str = "matmul-fp32"
    size: int = 256  # 6 products: about 1-2 ms on one core of the 2-core CI machine
    reps: int = 6
    seed: int = 0

    def digest(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


REFERENCE = ReferenceSpec()
REFERENCE_HASH = REFERENCE.digest()
# On a GPU the gate judges the step's own median: x = ln(step median). The reference there is a few
# microsecond-sized kernels whose time is launch latency, noisier than the step it would divide
# (measured on an H200: docs/design/gpu-status.md, "Timing"). Its launches carry this hash instead of
# REFERENCE_HASH, so a history of one kind never judges the other.
UNNORMALIZED = ReferenceSpec(kind="none", size=0, reps=0)
UNNORMALIZED_HASH = UNNORMALIZED.digest()


def normalizes(device_type: str, emulated: bool) -> bool:
    """Whether the gate divides a step's median by the in-run reference's: on CPU ranks (emulated or
    real), where the machine's speed drifts with its neighbours; not on a GPU."""
    return device_type != "cuda" or emulated


def gate_reference_hash(device_type: str, emulated: bool) -> str:
    """The hash a launch on these ranks is stored with: which statistic its x is."""
    return REFERENCE_HASH if normalizes(device_type, emulated) else UNNORMALIZED_HASH


def make_reference(device, spec: ReferenceSpec = REFERENCE) -> Callable[[], None]:
    """The reference as a callable, its inputs made once (on ``device``) so a call only computes."""
    import torch

    g = torch.Generator().manual_seed(spec.seed)
    a = torch.randn(spec.size, spec.size, generator=g).to(device)
    b = (torch.randn(spec.size, spec.size, generator=g) / spec.size ** 0.5).to(device)
    out = torch.empty_like(a)

    def run() -> None:
        for _ in range(spec.reps):
            torch.mm(a, b, out=out)

    return run
