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


class BadCallError(TypeError):
    """``dist.run`` was given something that cannot be sent to a rank."""


@dataclass(frozen=True)
class FnRef:
    """A module-level function named by module and qualified name, importable in a fresh process."""

    module: str
    qualname: str
    file: Optional[str]

    @classmethod
    def of(cls, fn, caller: str = "dist.run") -> "FnRef":
        """``caller`` (``dist.run``, ``simulate``) is named in the messages: what the user called."""
        __tracebackhide__ = True  # a function that cannot travel is the caller's line, not ours
        if not callable(fn):
            raise BadCallError(f"{caller} needs a function, got {type(fn).__name__}: {fn!r}")
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", None)
        if module is None or qualname is None:
            raise BadCallError(
                f"{caller} needs a plain module-level function, got {fn!r}; "
                "define `def my_fn(...)` at the top level of the test module"
            )
        if "<locals>" in qualname or "<lambda>" in qualname:
            raise BadCallError(
                f"{caller} cannot send {qualname!r} to other processes: it is a nested function or a "
                "lambda, which only exists inside the test process. Move it to the top level of "
                f"{module!r} (or any importable module) and pass what it needs as arguments."
            )
        if module == "__main__":
            raise BadCallError(
                f"{qualname!r} lives in __main__, which rank processes cannot import; "
                "put it in a module"
            )
        mod = sys.modules.get(module)
        file = getattr(mod, "__file__", None) if mod is not None else None
        ref = cls(module, qualname, os.path.abspath(file) if file else None)
        return ref

    def resolve(self):
        try:
            mod = importlib.import_module(self.module)
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
        obj = mod
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj


def pack_call(fn, args: tuple, kwargs: dict, caller: str = "dist.run") -> Tuple[FnRef, bytes]:
    """Check that ``fn(*args, **kwargs)`` can be sent to ranks; return its reference and payload."""
    ref = FnRef.of(fn, caller)
    try:
        payload = pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # find the culprit for the message
        culprit = "the arguments"
        for i, a in enumerate(args):
            try:
                pickle.dumps(a)
            except Exception:
                culprit = f"positional argument {i} ({type(a).__name__})"
                break
        else:
            for k, v in kwargs.items():
                try:
                    pickle.dumps(v)
                except Exception:
                    culprit = f"keyword argument {k!r} ({type(v).__name__})"
                    break
        raise BadCallError(
            f"{caller} cannot send {culprit} of {ref.qualname} to the ranks: {exc}. "
            "Pass plain data (tensors, numbers, strings, module-level classes) and build "
            "the rest inside the function."
        ) from None
    return ref, payload


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
