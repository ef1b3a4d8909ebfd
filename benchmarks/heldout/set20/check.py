"""Check every heldout20 case by hand, without pytest-mgpu: the distributed loop on plain
``torch.multiprocessing`` + gloo ranks, the one-device reference in this process, both from
``torch.manual_seed(0)``; after every ``optimizer.step()`` each side's parameters are kept by name and
compared (heldout6's checker: ``benchmarks/heldout/set6/check.py``, run by heldout15's ``main``, with
heldout17's recorder that keeps only the outermost ``optimizer.step()``; no family of this set nests
optimizer steps, so it records every step, the skipped ones of a loss scaler excepted, as the scaler
never calls ``optimizer.step()`` then). Sharded parameters (``llama_tp_hand``'s vocab-, column- and
row-parallel weights, ``expert_choice_ep``'s stacked experts) are put together along their first differing
dimension. Printed per case: the
largest relative parameter difference from the reference at the last step and at any step, and between
replicas. A correct case should sit at float32 roundoff (~1e-6), a bug far above it.

    OMP_NUM_THREADS=1 python -m benchmarks.heldout.set20.check [family ...] [--world 4]

The correct variants run at ``--world`` (default 2); without ``--world`` (or with 2) the bugs run too,
at the family's ``BUG_WORLD`` (2 where absent), as ``parity_diagnosis.py`` runs them.
"""
from __future__ import annotations

import sys
from pathlib import Path

PKG = "benchmarks.heldout.set20"

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from benchmarks.heldout.set15.check import main  # heldout15's checker
    from benchmarks.heldout.set17.check import rank_body, recorder  # heldout17's outermost-step recorder

    main(sys.argv[1:], PKG, body=rank_body, record=recorder)
