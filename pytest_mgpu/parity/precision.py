"""Parity checks compute float32 as IEEE float32 on GPUs: TF32 off for matrix products and cuDNN
convolutions while a check runs, the user's settings put back afterwards.

Why: PyTorch lets cuDNN convolutions use TF32 by default (10 bits of mantissa). On a real H200 the
measured line of a small BatchNorm CNN then came to 12% of the step-0 loss, wide enough that a
pipeline cutting the batch into 4 micro-batches (every BatchNorm normalizing 2 samples instead of 8:
outputs 15% off, gradients 165%) passed as "matches one device", while the same check on CPU ranks
failed it. Whether a distributed run trains like one device does not depend on TF32; in IEEE float32
the line is the one the CPU measures. A loop that turns TF32 on itself keeps it (the facts then say
tf32 and the line is measured in it).
"""
from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def ieee_float32() -> Iterator[None]:
    """TF32 off (matmul precision "highest", cuDNN's allow_tf32 False) inside; restored on exit."""
    import torch

    saved = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.backends.cudnn.allow_tf32 = saved[2]
