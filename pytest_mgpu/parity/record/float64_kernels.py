"""The float64 shadow's random draws, without a dispatch mode: while ``float64_kernels()`` is on, the
CPU and CUDA kernels of every aten overload tagged ``nondeterministic_seeded`` (bernoulli_, uniform_,
normal_, randn, rand, randint, randperm, multinomial, native_dropout, ...) are replaced by ones that,
for float64 tensors (or a factory call taking the default dtype), draw as float32 would through the
original kernel (what ``torch.library.get_kernel`` returns), then widen or copy back. Every other op runs its own
kernel, untouched: only the few random calls of a step pass through Python.

``as_float32`` is the rule itself, shared with the reference implementation, the dispatch mode
``loop_companions.float64_dispatch`` (which also remembers the pinning ops); the two give the same
records to the bit (tests/test_parity_float64_kernels.py).
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Dict, Iterator, Tuple

KEYS = ("CPU", "CUDA")


def as_float32(func, call: Callable[..., Any], args: tuple, kwargs: Dict[str, Any]):
    """``call(*args, **kwargs)`` for the random op ``func`` as float32 would draw it: float64 tensors
    narrowed (and, in place, copied back), float32 results widened, and a factory call that takes
    the default dtype (float64 in the shadow) made with float32 as the default."""
    import torch

    tensors = [t for t in leaves(args, kwargs) if isinstance(t, torch.Tensor)]
    wide = any(t.dtype == torch.float64 for t in tensors)
    factory = not tensors and "dtype" not in kwargs  # the default dtype (float64 here) applies
    if not (wide or factory):
        return call(*args, **kwargs)

    def narrow(t):
        return t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t

    def widen(t):
        return t.double() if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t

    n_args, n_kwargs = mapped(narrow, args), {k: mapped(narrow, v) for k, v in kwargs.items()}
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        out = call(*n_args, **n_kwargs)
    finally:
        torch.set_default_dtype(saved)
    if func._schema.name.endswith("_"):  # in place (uniform_, normal_, bernoulli_): write back
        return args[0].copy_(n_args[0])
    return mapped(widen, out)


def mapped(f: Callable[[Any], Any], x: Any) -> Any:
    """``f`` over an op's arguments or results, lists and tuples opened: ``tree_map`` for them."""
    if isinstance(x, (list, tuple)):
        return type(x)(mapped(f, e) for e in x)
    return f(x)


def leaves(args: tuple, kwargs: Dict[str, Any]) -> Iterator[Any]:
    """An aten op's arguments, lists opened (``Tensor[]``): what ``tree_leaves`` gives for them, at a
    tenth of its cost (the DDP tutorial's data set draws 512 tensors one ``torch.rand`` at a time)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


@functools.lru_cache(maxsize=1)
def seeded_overloads() -> Tuple[Tuple[Any, Tuple[str, ...]], ...]:
    """The aten overloads tagged ``nondeterministic_seeded`` that reach a CPU or CUDA kernel (a
    CompositeImplicitAutograd one, such as ``dropout``, decomposes into them first), with those keys.
    Enumerated once per process (80 ms)."""
    import torch

    seeded, found = torch.Tag.nondeterministic_seeded, []
    for name in sorted(torch._C._dispatch_get_all_op_names()):
        if not name.startswith("aten::"):
            continue
        base, _, overload = name[len("aten::"):].partition(".")
        op = getattr(getattr(torch.ops.aten, base, None), overload or "default", None)
        if op is None or seeded not in op.tags \
                or torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"):
            continue
        keys = tuple(k for k in KEYS if torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, k))
        if keys:
            found.append((op, keys))
    return tuple(found)


def _kernel(op, original, inside: threading.local) -> Callable[..., Any]:
    """``op``'s kernel in the shadow: ``as_float32`` around the original, for the outermost random op
    only (a dispatch mode sees no op called from inside another's kernel: ``rand``'s own
    ``uniform_``); the ones inside run as they are."""

    def call(keys):
        def original_call(*args, **kwargs):
            inside.depth = getattr(inside, "depth", 0) + 1
            try:
                return original.call_boxed(keys, *args, **kwargs)
            finally:
                inside.depth -= 1

        return original_call

    def kernel(keys, *args, **kwargs):
        if getattr(inside, "depth", 0):
            return original.call_boxed(keys, *args, **kwargs)
        return as_float32(op, call(keys), args, kwargs)

    return kernel


@contextlib.contextmanager
def float64_kernels() -> Iterator[None]:
    """The seeded ops' kernels replaced while inside (see the module docstring); restored on the way
    out, whatever the loop raised. Nested or repeated uses stack: an inner one's "original" is the
    outer one's kernel, which passes float32 through."""
    import torch

    lib, inside = torch.library.Library("aten", "IMPL"), threading.local()
    # No CUDA tensor without a device: its registrations (5 of 7 ms) saved. device_count asks NVML
    # first, which, unlike is_available, leaves a later fork free to use CUDA.
    cuda = torch.cuda.device_count() > 0
    try:
        for op, keys in seeded_overloads():
            for key in keys if cuda else [k for k in keys if k != "CUDA"]:
                original = torch._C._dispatch_get_computed_kernel_for_dispatch_key(  # torch.library.get_kernel,
                    op._name, getattr(torch._C.DispatchKey, key))  # without its 30 us of checks a call
                lib.impl(op, _kernel(op, original, inside), key, with_keyset=True)
        yield
    finally:
        lib._destroy()
