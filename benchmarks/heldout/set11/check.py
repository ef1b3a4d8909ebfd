"""Check every heldout10 case by hand, without pytest-mgpu: the distributed loop on plain
``torch.multiprocessing`` + gloo ranks, the one-device reference in this process, both from
``torch.manual_seed(0)``; after every ``optimizer.step()`` each side's parameters are kept by name and
compared (see ``benchmarks/heldout/set6/check.py``). Printed per case: the largest relative parameter
difference from the reference at the last step and at any step, and between replicas. A correct case
should sit at float32 roundoff (~1e-6), a bug far above it.

    OMP_NUM_THREADS=1 python -m benchmarks.heldout.set11.check [family ...] [--world 4]

The checker is heldout6's, run over this set's families.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from benchmarks.heldout.set6.check import main

    main("benchmarks.heldout.set11", sys.argv[1:])
