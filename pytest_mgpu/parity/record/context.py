"""What a forward is called from, read from the call stack: inside a custom ``autograd.Function`` (a
forward that trains all the same), or inside ``torch.distributed.pipelining``'s shape inference (a
made-up batch, not a step's rows). Each is called from the watch's pre-hook: frame 2 is the module call.
"""
from __future__ import annotations

import sys
from types import FrameType
from typing import Optional


def in_function(depth: int = 16) -> bool:
    """Called inside a custom ``autograd.Function``'s forward (reentrant activation checkpointing runs
    its module there, with gradients off): a training forward all the same."""
    frame: Optional[FrameType] = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        name = frame.f_code.co_filename.replace("\\", "/")
        if name.endswith(("torch/autograd/function.py", "torch/utils/checkpoint.py")):
            return True
        frame = frame.f_back
    return False


def pipeline_inference(depth: int = 12) -> bool:
    """Called from a ``torch.distributed.pipelining`` stage's shape or metadata inference, which runs
    the stage forward (and backward) once on a batch of its own before the first step."""
    frame: Optional[FrameType] = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        name = frame.f_code.co_name
        if ("metadata_inference" in name or "shape_inference" in name) and \
                frame.f_globals.get("__name__", "").startswith("torch.distributed.pipelining"):
            return True
        frame = frame.f_back
    return False
