"""The in-run reference: a fixed workload timed next to the user's step, in every rank, A B A B.

Why: on a shared machine the speed of the whole machine moves between launches (lognormal sd
0.10-0.20 here, MEASURED.md), far more than a step's own noise inside a launch. A reference that does
not depend on the code under test, run interleaved with the step after the same barrier, sees the
same contention; the gate then judges x = ln(step median / reference median), which cancels the
shared part of that drift (duet benchmarking, Bulej et al., ICPE 2020; RMIT, Abedi & Brecht 2017).

What: dense fp32 matrix products of a fixed size, seed and count, on the rank's device with the
rank's thread count. Matrix products are what torch's compute-bound steps (linear and conv layers)
spend their time in, so they slow down with the same neighbours and the same frequency drops. The
figures that chose it (step/reference correlation across launches, spread of x) are in
``benchmarks/gate_power.py``'s output, quoted in README's Timing section.

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
