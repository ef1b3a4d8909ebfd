"""How many pytest-xdist workers ``pytest -n auto`` starts: one per GPU lease, on a GPU machine.

xdist's own default is one worker per CPU core, which on a GPU machine is the wrong unit: every
distributed test leases its GPUs for itself (``devices.DeviceLeaser``), so a worker beyond the GPU count
only waits for a lease. The hook runs before collection (xdist's ``pytest_cmdline_main``), so the world
sizes of the selected tests are not known yet, and the default is one worker per GPU:

- gpu1 tests (and tests without ``dist``) then use every GPU at once; fewer workers, say GPUs divided by
  the largest world size any test might need, would leave GPUs idle through all of them;
- a gpuN test waits for N free GPUs (a flock, polled, holding no GPU and no CUDA context), so a larger
  test costs the others some waiting, never a shared device or an out-of-memory;
- ``-m gpuN`` names the world size of every selected test: then GPUs // N workers, each of which gets
  its lease at once (8 GPUs, ``-m gpu4``: 2 workers, not 8 of which 6 would wait);
- never more workers than usable CPU cores (each worker's ranks need host threads), and at least 1.

Without GPUs it returns None, and xdist decides as usual (``-n auto``: CPU cores), as it does when
``PYTEST_XDIST_AUTO_NUM_WORKERS`` is set. Counting GPUs creates no CUDA context (``detect_hardware``).
"""
from __future__ import annotations

import os
import re
from typing import Optional

from .devices import detect_hardware, usable_cpus
from .markers import MARKERS

_ONE_SIZE = re.compile(r"^\s*(gpu\d+)\s*$")


def auto_workers(markexpr: str = "") -> Optional[int]:
    """Workers for ``-n auto``: GPUs (// N under ``-m gpuN``), capped by CPU cores; None without GPUs."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # the user's own number: xdist reads it
    gpus = detect_hardware().cuda_count
    if gpus == 0:
        return None
    workers = gpus
    only = _ONE_SIZE.match(markexpr or "")
    if only and only.group(1) in MARKERS:
        workers = gpus // MARKERS[only.group(1)]
    return max(1, min(workers, usable_cpus()))


def under_xdist(config) -> bool:
    """Whether this pytest runs with pytest-xdist (the controller with -n/--dist/--tx, or a worker):
    tests then run at once and share the cores (timing warns), and cannot run inside a torchrun job.
    Read from the config, not from PYTEST_XDIST_WORKER: a pytest started inside a worker (pytester,
    a subprocess) inherits that variable but is no worker."""
    opt = config.option
    return bool(getattr(opt, "numprocesses", None) or getattr(opt, "dist", "no") not in (None, "no")
                or getattr(opt, "tx", None) or hasattr(config, "workerinput"))
