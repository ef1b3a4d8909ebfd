"""What crosses the process boundary between the test process and a rank.

Small picklable dataclasses only: a rank never unpickles pytest objects, and the parent never
unpickles anything but these and the user's own return values.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .byvalue import BadCallError, anchor_module, describe, dumps, importable


def safe_str(obj: object) -> str:
    """``str(obj)``, or a description of why it could not be made (a ``__str__`` that raises)."""
    try:
        return str(obj)
    except Exception as exc:
        try:
            why = f"{type(exc).__name__}: {exc}"
        except Exception:
            why = type(exc).__name__
        return f"<{type(obj).__qualname__} object: its __str__ raised {why}>"


def type_name(obj: object) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}".replace("builtins.", "")


@dataclass(frozen=True)
class FnRef:
    """A function on its way to the ranks. A module-level function is named by module and qualified
    name (importable in a fresh process); anything else callable (a nested function, a lambda, a
    ``functools.partial``, a callable object) travels pickled by value in ``blob``, and ``module`` is
    the module to import before unpickling it (None: none)."""

    module: Optional[str]
    qualname: str
    file: Optional[str]
    blob: Optional[bytes] = None

    @classmethod
    def of(cls, fn, caller: str = "dist.run") -> "FnRef":
        """``caller`` (``dist.run``, ``simulate``) is named in the messages: what the user called."""
        __tracebackhide__ = True  # a function that cannot travel is the caller's line, not ours
        if not callable(fn):
            raise BadCallError(f"{caller} needs a function, got {type(fn).__name__}: {fn!r}")
        if importable(fn):
            return cls(fn.__module__, fn.__qualname__, _file_of(fn.__module__))
        return cls.by_value(fn, caller)

    @classmethod
    def by_value(cls, fn, caller: str = "dist.run") -> "FnRef":
        """``fn`` pickled by value (its code object as it is: a test function keeps pytest's assertion
        rewriting), whatever its module; ``BadCallError`` names what it captures that cannot travel."""
        __tracebackhide__ = True
        blob = dumps(fn, caller)
        module = anchor_module(fn)
        qualname = getattr(fn, "__qualname__", None) or describe(fn)
        return cls(module, qualname, _file_of(module) if module else None, blob)

    def resolve(self):
        if self.blob is not None:
            if self.module:
                try:
                    self._import()
                except Exception:
                    pass  # unpickling names what is missing, if anything is
            return pickle.loads(self.blob)
        obj = self._import()
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj

    def _import(self):
        assert self.module is not None
        try:
            return importlib.import_module(self.module)
        except ImportError:
            # pytest's importlib mode registers test modules under names that are not importable
            # from sys.path; load the same file under the same name.
            if not self.file:
                raise
            spec = importlib.util.spec_from_file_location(self.module, self.file)
            if spec is None or spec.loader is None:
                raise
            mod = importlib.util.module_from_spec(spec)
            sys.modules[self.module] = mod
            spec.loader.exec_module(mod)
            return mod


def _file_of(module: Optional[str]) -> Optional[str]:
    mod = sys.modules.get(module) if module else None
    file = getattr(mod, "__file__", None) if mod is not None else None
    return os.path.abspath(file) if file else None


def pack_call(fn, args: tuple, kwargs: dict, caller: str = "dist.run") -> Tuple[FnRef, bytes]:
    """Check that ``fn(*args, **kwargs)`` can be sent to ranks; return its reference and payload.
    Arguments are pickled; one that plain pickle refuses (a lambda, a local function) by value."""
    __tracebackhide__ = True
    ref = FnRef.of(fn, caller)
    try:
        payload = pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        import cloudpickle

        try:
            payload = cloudpickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise BadCallError(_argument_problem(caller, ref, args, kwargs, exc)) from None
    return ref, payload


def _argument_problem(caller: str, ref: FnRef, args: tuple, kwargs: dict, exc: Exception) -> str:
    import cloudpickle

    culprit = "the arguments"
    named = [(f"positional argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for name, value in named:
        try:
            cloudpickle.dumps(value)
        except Exception:
            culprit = f"{name} ({type(value).__name__})"
            break
    return (f"{caller} cannot send {culprit} of {ref.qualname} to the ranks: {exc}. "
            "Pass plain data (tensors, numbers, strings, module-level classes) and build "
            "the rest inside the function.")


@dataclass
class RankTask:
    """Everything one rank needs to join the group and run one call."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device_type: str
    device_index: Optional[int]
    devices: Tuple[int, ...]
    emulated: bool
    store_host: str
    store_port: int
    store_prefix: str
    seed: int
    per_rank_seed: bool
    threads: int
    fn: Optional[FnRef]  # None in a warm pool worker's task: each call brings its own
    payload: bytes
    log_path: str
    pg_timeout_s: float
    launcher_pid: int = 0  # the test process; the rank ends itself when it is gone
    env: Dict[str, str] = field(default_factory=dict)


@dataclass
class RankOutcome:
    """What one rank reports back: a value, or the error it raised with its formatted traceback."""

    rank: int
    ok: bool
    value: Any = None
    exc_type: str = ""
    exc_message: str = ""
    traceback: str = ""
    phase: str = "run"  # "init" (joining the group), "run" (user code), "return" (sending the value)
    run_s: float = 0.0
    init_s: float = 0.0
    value_bytes: Optional[bytes] = None  # the value, pickled apart: rebuilt here under a guard
    value_type: str = ""  # its type, to name it when it cannot be rebuilt
    ready: bool = False  # "joined the group, starting the call": the call's time limit starts now
    notes: List[str] = field(default_factory=list)  # what the call left behind (children, threads)
    dirty: bool = False  # (warm ranks) the call changed the process groups: rejoin before the next
    collectives: Optional[list] = None  # (raised) this call's collectives, from the flight recorder
    last_collectives: Dict[int, int] = field(default_factory=dict)  # (returned) per group: its last one
    log_size: Optional[int] = None  # (warm ranks) bytes in its log after the call; None: unknown, read it
