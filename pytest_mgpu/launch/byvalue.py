"""Callables that travel to the ranks by value: nested functions, lambdas, ``functools.partial`` of them,
callable objects. They are pickled with cloudpickle (code and captured values); what cannot travel is
refused here, in the test process, naming the captured variable that holds it.

A module-level function is not handled here: it travels as a reference (module and name), which is
cheaper and keeps working when its module changes between calls.
"""
from __future__ import annotations

import functools
import pickle
import sys
import types
from typing import Any, Iterator, List, Optional, Tuple


class BadCallError(TypeError):
    """``dist.run`` was given something that cannot be sent to a rank."""


def importable(fn: Any) -> bool:
    """True where ``fn`` is a plain function or class its module names at the top level (a rank can
    import it by name); False for nested functions, lambdas, partials, callable objects, ``__main__``."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(fn, (types.FunctionType, type, types.BuiltinFunctionType)):
        return False
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return False
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj is fn


def anchor_module(obj: Any) -> Optional[str]:
    """The module the rank imports before unpickling ``obj`` (its function's or class's): the
    module-level names the code refers to by reference live there, also in a test file that only
    pytest knows how to import."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
    module = getattr(obj, "__module__", None) if isinstance(obj, (types.FunctionType, type)) \
        else type(obj).__module__
    return module if isinstance(module, str) and module != "__main__" else None


def dumps(obj: Any, caller: str) -> bytes:
    """``obj`` pickled by value, or ``BadCallError`` naming the captured variable that cannot travel."""
    __tracebackhide__ = True
    import cloudpickle

    what = describe(obj)
    device = _device_bound(obj)
    if device is not None:
        name, kind = device
        raise BadCallError(
            f"{caller} cannot send {what} to the ranks: it captures `{name}`, {kind} made in the test "
            "process. Each rank owns its own device: create it inside the function (or pass a CPU "
            "tensor as an argument and move it to pytest_mgpu.rank_device() there)."
        )
    try:
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        culprit = _culprit(obj)
        why = f"{type(exc).__name__}: {exc}"
    if culprit is None:
        raise BadCallError(f"{caller} cannot send {what} to the ranks ({why}). Define it at the top level of "
                           "a module, or pass what it needs as plain arguments.")
    name, value = culprit
    raise BadCallError(
        f"{caller} cannot send {what} to the ranks: it captures `{name}` ({type(value).__module__}."
        f"{type(value).__qualname__}), which cannot be pickled ({why}). Open or create it inside the "
        "function, or pass plain data (a path, numbers, tensors) instead."
    )


def describe(obj: Any) -> str:
    if isinstance(obj, functools.partial):
        return f"functools.partial({describe(obj.func)}, ...)"
    name = getattr(obj, "__qualname__", None)
    if isinstance(obj, (types.FunctionType, types.MethodType)) and name:
        return f"{name!r}"
    return f"a {type(obj).__qualname__} object"


def captures(obj: Any, depth: int = 0) -> Iterator[Tuple[str, Any]]:
    """What ``obj`` carries along, as (name, value): closure cells, the globals its code reads (not
    modules), defaults, a partial's arguments, an object's attributes; nested functions' captures too,
    named ``outer.name``."""
    if depth > 4:
        return
    items: List[Tuple[str, Any]] = []
    if isinstance(obj, functools.partial):
        items += [("", obj.func)] + [(f"argument {i}", a) for i, a in enumerate(obj.args)]
        items += [(k, v) for k, v in obj.keywords.items()]
    elif isinstance(obj, types.MethodType):
        items += [("self", obj.__self__), ("", obj.__func__)]
    elif isinstance(obj, types.FunctionType):
        code = obj.__code__
        cells = obj.__closure__ or ()
        for name, cell in zip(code.co_freevars, cells):
            try:
                items.append((name, cell.cell_contents))
            except ValueError:  # an empty cell: a name not yet bound
                pass
        items += [(n, obj.__globals__[n]) for n in _global_names(code) if n in obj.__globals__]
        items += [(f"default {i}", d) for i, d in enumerate(obj.__defaults__ or ())]
        items += list((obj.__kwdefaults__ or {}).items())
    elif not isinstance(obj, type):
        items += list(getattr(obj, "__dict__", {}).items())
    for name, value in items:
        if isinstance(value, types.ModuleType) or (name and name.startswith("@")):  # modules go by name
            continue
        yield name, value
        if not importable(value) and isinstance(value, (types.FunctionType, functools.partial)):
            for inner, v in captures(value, depth + 1):
                yield (f"{name}.{inner}" if name else inner), v


def _global_names(code: types.CodeType) -> List[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _global_names(const)
    return names


def _culprit(obj: Any) -> Optional[Tuple[str, Any]]:
    import cloudpickle

    for name, value in captures(obj):
        if not name or isinstance(value, (types.FunctionType, functools.partial)):
            continue  # a function's own captures are tried one by one after it
        try:
            cloudpickle.dumps(value)
        except Exception:
            return name, value
    return None


def _device_bound(obj: Any) -> Optional[Tuple[str, str]]:
    """The first captured tensor or module that lives on a GPU, with what it is; None without one."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for name, value in captures(obj):
        if isinstance(value, torch.Tensor) and value.device.type not in ("cpu", "meta"):
            return name, f"a {value.device.type} tensor"
        if isinstance(value, torch.nn.Module):
            for p in value.parameters():
                if p.device.type not in ("cpu", "meta"):
                    return name, f"a module with parameters on {p.device.type}"
    return None
