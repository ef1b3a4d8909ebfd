"""The first step's path through the model: inside a probed forward call (``probe.py``), the input
and the output of each submodule call, per row, with the line of the user's code that called it.

Where the model's outputs differ from the reference's for the same rows and weights, the test
process walks both trails in call order and names the first input or output that differs
(``evidence/trail.py``): a module that computes otherwise from the same input, or the code between
two modules (a random draw, a mask, an index taken per rank). Each row is kept as its norm and
``SAMPLE`` of its values at fixed positions: enough to tell "the same up to roundoff" from "not",
cheap on a large activation. Only the first step's probed calls carry a trail; its hooks go with
the call.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..layout.names import holders
from .probe import first_output
from .where import caller_line

SAMPLE = 32  # values kept per row, at fixed positions spread over it
FED = "fed"  # the kind of the first mark: the outermost call's own input rows
ROUTED = "routed"  # a submodule's input of another number of rows: the tokens routed to it, each its own row
TOKENS = 4096  # tokens kept per routed call at most (more: none kept)
MARKS = 600  # marks kept per call at most (a deep model's first modules are where a forward goes apart)


@dataclass
class Mark:
    """One submodule call's input or output: per row, its norm and its sampled values."""

    key: Tuple[str, int, str]  # (module class, its k-th call of that class in this forward, "input" | "output" | FED)
    name: str  # the module's name below the model the loop wrote (wrappers' prefixes dropped)
    line: str  # "file:line" of the user's code that called it ("" inside a library's model)
    rows: List[Tuple[float, List[float]]] = field(default_factory=list)
    call: int = 0  # its k-th call by that name in this forward
    eps: float = 0.0  # the machine epsilon of its dtype: what roundoff is in it

    @property
    def named(self) -> Tuple[str, int, str]:
        """(name, call, kind): how it is matched first (a class converted on one side, SyncBatchNorm for
        BatchNorm2d, keeps its name); by ``key`` where names differ (wrappers that nest otherwise). An
        argument given by position (``argument mask``) is matched as by keyword (``mask``): a call by position
        on one side and by keyword on the other pairs each argument with its namesake, wherever it stands."""
        plain = self.name[len("argument "):] if self.key[2] == FED and self.name.startswith("argument ") else self.name
        return plain, self.call, self.key[2]


def eps_of(t: Any) -> float:
    """The machine epsilon of a floating tensor's dtype (0 for anything else)."""
    import torch

    return float(torch.finfo(t.dtype).eps) if isinstance(t, torch.Tensor) and t.is_floating_point() else 0.0


def row_marks(t: Any, n: int, tokens: int = 0) -> List[Tuple[float, List[float]]]:
    """Per row of ``t`` (``n`` rows, batch first): its norm and ``SAMPLE`` values at fixed positions;
    [] where ``t`` is no floating tensor of ``n`` rows. With ``tokens`` (the positions per row of the
    model's input), a 2-D ``t`` of ``n x tokens`` rows is the batch's tokens flattened (``view(-1, d)``, as
    a mixture of experts routes them): each row's tokens together are its row."""
    import torch

    if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.numel() == 0 or hasattr(t, "full_tensor") or \
            t.is_complex():
        return []
    if t.shape[0] != n:
        if tokens < 2 or t.dim() != 2 or t.shape[0] != n * tokens:
            return []
    with torch.no_grad():
        x = t.detach().reshape(n, -1)
        if not x.is_floating_point():
            x = x.to(torch.float64)
        m = x.shape[1]
        at = torch.linspace(0, m - 1, min(SAMPLE, m), device=x.device).round().long()
        picked = x[:, at].to("cpu", torch.float64)
        wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else None  # its own precision: 1e-7 of a norm
        norms = torch.linalg.vector_norm(x, dim=1, dtype=wide).tolist()
    return list(zip(norms, picked.tolist()))


def positional_names(module: Any) -> List[str]:
    """The names of ``module.forward``'s leading positional parameters (up to a ``*args``), in order;
    none where its signature cannot be read."""
    import inspect

    try:
        params = inspect.signature(module.forward).parameters.values()
    except Exception:  # a compiled or scripted forward whose signature cannot be read
        return []
    out: List[str] = []
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        out.append(p.name)
    return out


def fed_marks(top: str, given: Tuple[tuple, dict], n: int, first: int = 0, positional: Sequence[str] = ()) -> List[Mark]:
    """The outermost call's tensor arguments of ``n`` rows, sampled (kind ``FED``), the first first: how
    near another side's rows they are, and which argument differs where the first is the same. Each is
    named by its keyword, or ``argument <name>`` by position, ``name`` its parameter's in ``positional``
    (the forward of the module the loop wrote, inside its wrappers) or else its index."""
    import torch

    args, kwargs = given
    named = [(f"argument {positional[i] if i < len(positional) else i}", v) for i, v in enumerate(args)]
    named += list(kwargs.items())
    out: List[Mark] = []
    for i, (name, value) in enumerate((v for v in named if isinstance(v[1], torch.Tensor)), first):
        rows = row_marks(value, n)
        if rows:
            out.append(Mark((top, i, FED), name, "", rows, eps=eps_of(value)))
        elif not out and not first:
            return []  # the first tensor is the rows matched on: without it, nothing to read the others against
    return out


def holder_of(top: Any) -> str:
    """The prefix of the module the loop wrote inside ``top``'s wrappers (DDP's ``module.``, a
    Fabric module's), by identity: the innermost module holding all of ``top``'s parameters."""
    found = holders(top, lambda s: s, limit=8)
    return found[-1] if found else ""


def _written_names(top: Any, holder: str) -> List[str]:
    """The positional parameters of the forward of the module the loop wrote (``holder`` inside ``top``'s
    wrappers, whose own forward takes ``*args``)."""
    try:
        return positional_names(top.get_submodule(holder.rstrip(".")) if holder else top)
    except Exception:  # a ScriptModule has no get_submodule: names are a nicety, never a rank's crash
        return []


def _shown(name: str, holder: str) -> str:
    name = name[len(holder):] if holder and name.startswith(holder) else name
    return ".".join(p for p in name.split(".") if not p.startswith("_")) or name  # _orig_mod, _fsdp_wrapped_module


class Trail:
    """The marks of one outermost forward call of ``top`` with ``n`` input rows (``enter`` from the
    global forward pre-hook for each submodule call; ``close`` when the call ends)."""

    def __init__(self, top: Any, n: int, holder: str = "", given: Tuple[tuple, dict] = ((), {})):
        self.n = n
        self.marks: List[Mark] = fed_marks(type(top).__name__, given, n, positional=_written_names(top, holder))
        first = next((v for v in list(given[0]) + list(given[1].values()) if hasattr(v, "dim")), None)
        self._tokens = int(first.shape[1]) if first is not None and first.dim() >= 2 else 0  # positions per row
        self._names: Dict[int, str] = {id(m): name for name, m in top.named_modules()}
        self._holder = holder  # the prefix of the module the loop wrote, inside its wrappers
        self._by_class: Counter = Counter()  # calls so far per module class
        self._by_name: Counter = Counter()  # calls so far per module name
        self._handles: List[Any] = []

    def given(self, kwargs: dict) -> None:
        """The outermost call's keyword arguments, where its rows came from a positional one."""
        top = self.marks[0].key[0] if self.marks else ""
        had = {m.name for m in self.marks if m.key[2] == FED}  # read already where the call began
        more = fed_marks(top, ((), {k: v for k, v in kwargs.items() if k not in had}), self.n, first=len(self.marks))
        at = len([m for m in self.marks if m.key[2] == FED])  # before any submodule's marks
        self.marks[at:at] = more

    def enter(self, module: Any, x: Any) -> None:
        import torch

        name = self._names.get(id(module))
        if name is None or len(self.marks) >= MARKS or torch.compiler.is_compiling():
            return  # not part of this model (a loss module called inside its forward), or enough seen
        kind = type(module).__name__
        k = self._by_class[kind]
        self._by_class[kind] += 1
        shown = _shown(name, self._holder)
        call = self._by_name[shown]
        self._by_name[shown] += 1
        line = caller_line()
        rows = row_marks(x, self.n, self._tokens)
        if rows:
            self.marks.append(Mark((kind, k, "input"), shown, line, rows, call, eps_of(x)))
        elif isinstance(x, torch.Tensor) and x.dim() == 2 and x.is_floating_point() and 0 < x.shape[0] <= TOKENS:  # an expert's tokens
            routed = row_marks(x, x.shape[0])
            if routed:
                self.marks.append(Mark((kind, k, ROUTED), shown, line, routed, call, eps_of(x)))

        def ended(_module, _args, output):
            handle.remove()
            t = first_output(output)
            got = row_marks(t, self.n, self._tokens)
            if got and len(self.marks) < MARKS:
                self.marks.append(Mark((kind, k, "output"), shown, line, got, call, eps_of(t)))

        try:
            handle = module.register_forward_hook(ended)
        except RuntimeError:  # a ScriptModule takes no hook of its own
            return
        self._handles.append(handle)

    def close(self) -> List[Mark]:
        """The marks; every hook still on a module removed (a call that raised)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return self.marks
