"""The test process judges a parity check in one thread.

Its tensors are the records of a few steps: the judgement's elementwise ops and norms are small,
and torch's intra-op threads buy them little on a quiet machine. On a loaded one they cost a great
deal: each parallel op waits for a second thread the scheduler has given away. Measured on 2 cores
at load 5.6: ``torch.isfinite(t).all()`` on 104,000 float64 took 48-99 ms with 2 threads and 1-2 ms
with 1; judging 20 steps of a minGPT-like trainer took 0.58 s and 0.09 s.
"""
from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to 1 inside; the caller's count restored on exit."""
    import torch

    saved = torch.get_num_threads()
    if saved > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if saved > 1:
            torch.set_num_threads(saved)
