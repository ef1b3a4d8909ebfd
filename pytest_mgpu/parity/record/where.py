"""Where in the user's code a recorder's hook fired: the innermost frame of the call stack outside
torch, this plugin, the standard library and installed packages, as ``"file:line"`` (the file by
its name).

A hook fires inside torch (``Tensor.backward`` -> ``torch.autograd.backward``, ``Optimizer.step``'s
wrapper, ``Module.__call__``), often inside a library that wraps the user's call (accelerate's
``backward``, a ``Trainer``'s loop); the first frame from the inside that is none of those is the
line the user wrote. Walking frames is pointer chasing; what a file is, is decided once per file.
"""
from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
from types import FrameType
from typing import Dict, List, Optional, Tuple

DEPTH = 60  # frames walked at most: deeper than any loop's call into torch
# What a location is of: the hooks that record one.
KINDS = ("forward", "backward", "clip_grad_norm_", "optimizer.step", "scheduler.step")
STEP_DEFINED = "optimizer defined"  # an optimizer class of the user's own: where its step is written
# Kinds that say how a forward ran, beside its location as a "forward" or "forward under no_grad":
EVAL_FORWARD = "forward in eval mode"  # a training forward (with gradients), some modules in eval()
TRAIN_NO_GRAD = "no_grad forward in train mode"  # a forward without gradients (validation) in train()
PLATEAU = "plateau settings"  # not a line: a ReduceLROnPlateau's mode, factor, patience, threshold and cooldown
Where = Dict[str, Tuple[str, ...]]  # kind -> the distinct locations seen, in order


@functools.lru_cache(maxsize=1)
def _ours() -> Tuple[str, ...]:
    """The folders whose frames are a call's machinery: torch and this plugin (the pytest_mgpu package)."""
    import torch

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return tuple(p.rstrip(os.sep) + os.sep for p in (os.path.dirname(os.path.abspath(torch.__file__)), here))


@functools.lru_cache(maxsize=1)
def _roots() -> Tuple[str, ...]:
    """The folders whose files are not the user's: torch, this plugin, the standard library, site-packages."""
    paths = {p.rstrip(os.sep) for p in _ours()}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            paths.add(os.path.abspath(p))
    try:
        paths.update(os.path.abspath(p) for p in site.getsitepackages())
    except AttributeError:  # a virtualenv's old site module
        pass
    return tuple(sorted(p.rstrip(os.sep) + os.sep for p in paths))


@functools.lru_cache(maxsize=4096)
def library(filename: str) -> bool:
    """A file of torch, this plugin, the standard library or an installed package (or no file)."""
    if not filename or filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    return path.startswith(_roots())


@functools.lru_cache(maxsize=4096)
def shown(filename: str) -> str:
    """The file as a message shows it: its name (a cause line has little room; the loop's author knows
    which file holds it)."""
    return os.path.basename(filename)


def user_line(skip: int = 1) -> str:
    """``"file:line"`` of the innermost frame outside the libraries, starting ``skip`` frames above
    the caller's; "" where the stack holds none within ``DEPTH`` frames."""
    found = _user_frame(sys._getframe(skip + 1), DEPTH, ours_stop=False)
    return f"{shown(found[0])}:{found[1]}" if found else ""


def caller_line(depth: int = 24) -> str:
    """``file:line`` of the first frame outside torch and this plugin, where that frame is the user's
    code; "" where it is a library's (a timm or transformers model's own forward) or not found."""
    frame: Optional[FrameType] = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return ""
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(_ours()):
            return "" if library(frame.f_code.co_filename) else f"{shown(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def loop_frame(skip: int = 1, depth: int = DEPTH) -> Optional[Tuple[str, int]]:
    """(file, line) of the innermost frame of the user's code, ``skip`` frames above the caller's, through
    torch's and installed libraries' frames; None where a frame of this plugin comes first (its own hooks'
    calls) or none is found."""
    return _user_frame(sys._getframe(skip + 1), depth, ours_stop=True)


def _user_frame(frame: Optional[FrameType], depth: int, ours_stop: bool) -> Optional[Tuple[str, int]]:
    """(file, line) of the first frame from ``frame`` outwards that is the user's code (no library's); with
    ``ours_stop``, None where a frame of this plugin comes first."""
    plugin = _ours()[1]
    for _ in range(depth):
        if frame is None:
            return None
        name = frame.f_code.co_filename
        if ours_stop and os.path.abspath(name).startswith(plugin):
            return None
        if not library(name):
            return name, frame.f_lineno
        frame = frame.f_back
    return None


def add(where: Dict[str, List[str]], kind: str, line: str) -> None:
    """Note ``line`` as a location of ``kind`` (each location once, in the order first seen)."""
    if line:
        seen = where.setdefault(kind, [])
        if line not in seen:
            seen.append(line)


def merged(*parts: Dict[str, List[str]]) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    for part in parts:
        for kind, lines in part.items():
            for line in lines:
                add(out, kind, line)
    return out


def frozen(where: Dict[str, List[str]]) -> Where:
    """The locations as a step keeps them (small, picklable)."""
    return {k: tuple(v) for k, v in where.items()}


def call_kwargs(depth: int = 6) -> dict:
    """The keyword arguments of the module call whose global forward pre-hook runs now: torch gives a
    global pre-hook the positional ones only (``model(**batch)`` passes none), so they are read from the
    frame of ``Module._call_impl`` that called the hook; {} where no such frame is found near it."""
    frame: Optional[FrameType] = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            break
        if frame.f_code.co_name == "_call_impl" and frame.f_code.co_filename.endswith(os.path.join("nn", "modules",
                                                                                                    "module.py")):
            kwargs = frame.f_locals.get("kwargs")
            return kwargs if isinstance(kwargs, dict) else {}
        frame = frame.f_back
    return {}


_STEPS: Dict[type, str] = {}  # optimizer class -> where its step is written ("" where not the user's)


def step_defined(optimizer) -> str:
    """``"Muon.step at train.py:40"`` where the optimizer's ``step`` is written in the user's code (an
    optimizer of their own); "" for torch's and installed packages' optimizers."""
    import inspect

    cls = type(optimizer)
    if cls not in _STEPS:
        step = inspect.unwrap(getattr(cls, "step", None) or (lambda: None))  # torch wraps step (profiling)
        code = getattr(step, "__code__", None)
        _STEPS[cls] = "" if code is None or library(code.co_filename) else \
            f"{cls.__name__}.step at {shown(code.co_filename)}:{code.co_firstlineno}"
    return _STEPS[cls]
