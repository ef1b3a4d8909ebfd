"""Check every heldout7 case by hand, without pytest-mgpu: the distributed loop on plain
``torch.multiprocessing`` + gloo ranks, the one-device reference in this process, both from
``torch.manual_seed(0)``. After every ``optimizer.step()`` each side's parameters are kept by name
(the name in the outermost module run forward that holds them, DDP's ``module.`` removed); the
ranks' tensors are put together in rank order (a tensor of the reference's shape: rank 0's, the
ranks' spread printed; a tensor one rank holds: that rank's; a sliced tensor: the family's ``SHARDS``
entry, else concatenated along the dimension whose size differs). Printed per case: the largest
relative parameter difference from the reference, ``||ranks - ref|| / ||ref||``, at the last step
and at any step, and the largest relative difference between replicas. A correct case should sit at
float32 roundoff (~1e-6), a bug far above it.

    OMP_NUM_THREADS=1 python -m benchmarks.heldout.set7.check [family ...] [--world 4]

The checker is heldout6's (``benchmarks/heldout/set6/check.py``), run over this set's families.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from benchmarks.heldout.set6.check import main

    main("benchmarks.heldout.set7", sys.argv[1:])
