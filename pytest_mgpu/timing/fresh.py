"""Inside a rank: the benchmarked function as a fresh rank would see it, whatever ran in this rank before.

A warm rank keeps the modules it imported from call to call. A step that builds its model on its
first call and keeps it in its module (``dist.benchmark(fn)`` where ``fn`` is the step itself, whose
first call is the setup) then builds it only in the first launch a rank runs: DDP's constructor
(an all_gather of the parameter shapes, the broadcasts of the parameters) lands in the setup of
that launch and in no later one, and which launch that is depends on the order of the tests and on
re-launches (an unstable measurement is launched again, and its second launch's structure is kept).
The structure gate then reads a change in unchanged code.

So each launch of a benchmark runs its function from a new copy of its module, executed again from
its file, as a fresh rank's import would: module state starts empty in every launch. The copy is
registered under the module's name for the launch (pickle, dataclasses and ``torch.compile`` look
modules up there) and the module this rank had is put back afterwards. In a rank that had not
imported the module yet (a fresh rank), the ordinary import is that copy already. A module that
cannot be executed twice in one process (one that registers a custom op at import) runs from the
rank's own copy, as before.
"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
from typing import Any, Callable, Iterator

from ..launch.protocol import FnRef


@contextlib.contextmanager
def fresh_function(ref: FnRef) -> Iterator[Callable[..., Any]]:
    """``with fresh_function(ref) as fn:`` ``fn`` from a module copy executed anew for this launch
    (``ref.resolve()`` where the module has no file, or was not imported in this rank before)."""
    name = ref.module
    before = sys.modules.get(name) if name is not None and ref.blob is None else None
    if name is None or before is None or not ref.file or ref.file.endswith("__init__.py"):
        yield ref.resolve()  # a closure travels by value: it is its own copy already
        return
    spec = importlib.util.spec_from_file_location(name, ref.file)
    if spec is None or spec.loader is None:
        yield ref.resolve()
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        try:
            spec.loader.exec_module(module)
            obj: Any = module
            for part in ref.qualname.split("."):
                obj = getattr(obj, part)
        except Exception:  # a module that cannot run twice in a process (it registers a custom op)
            sys.modules[name] = before
            obj = ref.resolve()  # the rank's own copy: what the launch ran before this module
        yield obj
    finally:
        sys.modules[name] = before
