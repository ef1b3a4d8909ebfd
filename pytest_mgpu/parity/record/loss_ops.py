"""The operations a loss is made of, as the loop wrote them: from the end of the first step's training
forward (the call whose output is probed, ``probe.py``) to the backward it feeds, each torch function the
user's code calls there, outside any model's forward: its name, its arguments other than tensors, and its
line. The test process lines the reference's up against rank 0's (``evidence/loss_ops.py``): where the
loss differs on the same outputs, the first operation that differs is where.

Read through a ``TorchFunctionMode`` held only in that window of the first step (tens of calls), so the
other steps and every model's forward run as they would without it. A call made by torch itself inside
a function the user called (``cross_entropy``'s ``log_softmax``) is not seen: the mode is off while it
handles a call. Calls made by this plugin's hooks, inside a model's forward (a model that computes its own
loss) or under ``torch.compile`` are left out; a library's function the user called is read at the user's
line that called it.
"""
from __future__ import annotations

import linecache
import math
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

from .where import loop_frame, shown

LIMIT = 400  # calls kept per window: a loss is tens; more is a loop that never called backward
SOURCE = 90  # characters of the line's source kept
SKIPPED = frozenset({"size", "dim", "numel", "__len__", "__bool__", "item", "tolist", "__format__", "__repr__",
                     "__index__", "__int__", "__float__", "__iter__", "__hash__", "is_floating_point", "data_ptr",
                     "__get__", "__set__", "backward", "register_hook", "stride", "element_size", "nelement",
                     "is_complex", "is_contiguous", "requires_grad_", "retain_grad"})


class Op(NamedTuple):
    """One call: its ``name`` and ``args`` (each said as a key holds it: tensors ``_``, named ones ``k=v``),
    ``shown`` (how a message says it), ``line`` (``file:line`` in the loop) and ``source`` (that line's code)."""

    name: str
    args: Tuple[str, ...]
    shown: str
    line: str
    source: str

    @property
    def key(self) -> str:
        """What two sides' calls are lined up by: the name and the arguments."""
        return f"{self.name}({', '.join(self.args)})"


def _value(v: Any) -> str:
    """An argument as a key holds it: tensors as ``_``, numbers by value (4 and 4.0 alike)."""
    import torch

    if isinstance(v, torch.Tensor):
        return "_"
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return repr(v)
    if isinstance(v, (int, float)):
        return f"{float(v):.6g}" if math.isfinite(float(v)) else repr(float(v))
    if isinstance(v, slice):
        return ":".join("" if p is None else _value(p) for p in (v.start, v.stop)) + \
            ("" if v.step is None else f":{_value(v.step)}")
    if v is Ellipsis:
        return "..."
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(_value(x) for x in v) + ")" if isinstance(v, tuple) else \
            "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, (torch.dtype, torch.device)):
        return str(v).replace("torch.", "")
    return type(v).__name__


SYMBOLS = {"div": "/", "true_divide": "/", "mul": "*", "add": "+", "sub": "-", "pow": "**", "__truediv__": "/",
           "__mul__": "*", "__add__": "+", "__sub__": "-", "__pow__": "**", "__rtruediv__": "r/", "__rmul__": "*",
           "__radd__": "+", "__rsub__": "r-", "__rpow__": "r**", "rsub": "r-"}
NOISY_KWARGS = frozenset({"_stacklevel", "size_average", "reduce", "out"})


def op_of(name: str, args: tuple, kwargs: dict, line: str, source: str) -> Op:
    """The call as an ``Op``: an arithmetic one with a number said as ``x / 4``, ``x[:, 1:]`` for an index,
    ``name(_, dim=1)`` otherwise."""
    pos = [_value(a) for a in args]
    named = [f"{k}={_value(v)}" for k, v in kwargs.items() if k not in NOISY_KWARGS and v is not None]
    op = Op(name, tuple(pos + named), "", line, source)
    if name in SYMBOLS and len(pos) == 2 and not named:
        said = f"x {SYMBOLS[name]} {pos[1] if pos[0] == '_' else pos[0]}"
    elif name == "__getitem__" and len(pos) == 2:
        said = f"x[{pos[1][1:-1] if pos[1].startswith('(') else pos[1]}]"
    else:
        said = op.key
    return op._replace(shown=said)


class Recorder:
    """Calls into ``ops`` while ``on`` (a ``TorchFunctionMode`` pushed by ``start``, popped by ``stop``);
    ``busy()`` true inside a model's forward (those calls are the model's, not the loss's)."""

    def __init__(self, busy: Callable[[], bool]):
        self.busy = busy
        self.ops: Optional[List[Op]] = None
        self._mode: Any = None

    def start(self, ops: List[Op]) -> None:
        import torch
        from torch.overrides import TorchFunctionMode

        self.stop()
        if self._mode is not None:
            return  # the last window's mode could not be popped yet: this window is not read
        recorder = self

        class Calls(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if recorder.ops is not None and len(recorder.ops) < LIMIT and not torch.compiler.is_compiling():
                    try:
                        recorder.note(func, args, kwargs)
                    except Exception:  # noqa: BLE001 (reading a call must never break the loop's)
                        recorder.ops = None
                return func(*args, **kwargs)

        self.ops, self._mode = ops, Calls()
        self._mode.__enter__()

    def note(self, func, args, kwargs) -> None:
        name = getattr(func, "__name__", "")
        if not name or name in SKIPPED or (name[0] == "_" and not name.endswith("__")) or self.busy():
            return
        frame = loop_frame(2)
        if frame is None:
            return  # this plugin's own call, or a library's code
        file, lineno = frame
        source = linecache.getline(file, lineno).strip()[:SOURCE]
        assert self.ops is not None
        self.ops.append(op_of(name, tuple(args), dict(kwargs), f"{shown(file)}:{lineno}", source))

    def stop(self) -> None:
        """The window ends (the backward it feeds, the step's end): nothing more is read. The mode is
        popped where it is the innermost one; inside its own handler (a ``Tensor.backward`` it passes on)
        or under a mode the loop pushed after it, it stays, reading nothing, until a later ``stop``."""
        import torch

        self.ops = None
        mode = self._mode
        if mode is None:
            return
        n = torch._C._len_torch_function_stack()
        if n and torch._C._get_function_stack_at(n - 1) is mode:
            mode.__exit__(None, None, None)
            self._mode = None

    remove = stop  # removed with the watch's hooks, as a hook's handle is
