"""``dist.spawn``: run the user's own ``mp.spawn`` entry point unchanged, in this test's ranks.

Code written for ``torch.multiprocessing.spawn`` sets up its own process group: it sets
``MASTER_ADDR``/``MASTER_PORT`` (often a hard-coded port), or passes ``init_method="tcp://..."``, and
calls ``init_process_group``. Run as it is, two such tests (or two xdist workers) fight over the port.
Here the ranks already exist and already share a rendezvous store, so for the duration of the user's
function ``init_process_group`` is redirected: whatever address it names, the group is built on a
``PrefixStore`` of this test's store, under a key prefix no other call uses. The rank's own default
group is torn down first (the user's code expects none), and whatever group the user's code leaves
behind is destroyed afterwards; warm ranks rebuild their default group before the next call.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import sys
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple


if TYPE_CHECKING:
    from torch.distributed import Store
from .parity.records import Portable

_CALLS = itertools.count()  # in the test process: one store prefix per dist.spawn call


@dataclass
class SpawnValue:
    """One rank's return value, and what the redirection had to change (said in the report)."""

    value: Any
    notes: List[str] = field(default_factory=list)


def new_prefix() -> str:
    """A store prefix no other call of this pytest process uses (test-process side)."""
    return f"mgpu-spawn/{next(_CALLS)}/"


def spawn(dist, fn: Callable, args: tuple, kwargs: dict) -> List[Any]:
    """The test-process side: send ``fn`` to every rank through ``dist.run``; warn about changes."""
    __tracebackhide__ = True
    prefix = new_prefix()
    # a script written for GPUs, on CPU ranks: dist.run names the CUDA-only call
    outs = dist.run(spawn_entry, Portable.of(fn, "dist.spawn's fn"), prefix, args, kwargs)
    for note in dict.fromkeys(n for out in outs for n in out.notes):
        warnings.warn(f"dist.spawn: {note}", RuntimeWarning, stacklevel=3)
    return [out.value for out in outs]


def spawn_entry(fn: Portable, prefix: str, args: tuple, kwargs: dict) -> SpawnValue:
    """Runs in every rank: no process group while ``fn(rank, *args, **kwargs)`` runs, except the
    one the user's code builds itself (redirected onto this test's store)."""
    from ._context import rank_context

    ctx = rank_context()
    user_fn = fn.load()
    return without_group(prefix, lambda: user_fn(ctx.rank, *args, **kwargs))


def without_group(prefix: str, call: Callable[[], Any]) -> SpawnValue:
    """Run ``call()`` in this rank as an ``mp.spawn`` child runs: with no process group up, its own
    ``init_process_group`` joining this test's rendezvous under ``prefix``. Also what
    ``assert_same_training(spawn=True)`` runs each side's loop in."""
    import torch.distributed as tdist

    from ._context import rank_context

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])  # this test's store
    if tdist.is_initialized():
        tdist.destroy_process_group()
    redirect = Redirect(rank_context(), host, port, prefix)
    try:
        with redirect.installed():
            value = call()
    except BaseException:
        if tdist.is_initialized():
            tdist.destroy_process_group()  # no barrier: the peers may be gone
        raise
    finally:  # the user's code may set its own address (a hard-coded port): the next call needs the test's
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = host, str(port)
    if tdist.is_initialized():
        # The user's code left its group up (mp.spawn would just exit). Meet first: a rank that
        # tore its group down at once could close the sockets a slower peer is still connecting.
        tdist.barrier()
        tdist.destroy_process_group()
    return SpawnValue(value, redirect.notes)


_BOUND: Dict[int, Tuple[Any, int, int, List[str]]] = {}  # id(module dict) -> (dict, len, id(fn), names bound to fn)


def bound_to(fn: Any) -> List[Tuple[Dict[str, Any], str]]:
    """(module dict, name) for every module-level name bound to ``fn`` (``from torch.distributed
    import init_process_group``). A module's dict is read again only where it is new or its size
    changed since it was last read (a rank runs this at every spawned call: reading all 2,000 dicts
    took 10-14 ms); one that still holds the same number of names has its remembered ones checked."""
    out: List[Tuple[Dict[str, Any], str]] = []
    for mod in list(sys.modules.values()):
        names = getattr(mod, "__dict__", None)
        if not isinstance(names, dict):
            continue
        seen = _BOUND.get(id(names))
        if seen is None or seen[0] is not names or seen[1] != len(names) or seen[2] != id(fn):
            seen = _BOUND[id(names)] = (names, len(names), id(fn), [k for k, v in list(names.items()) if v is fn])
        out += [(names, key) for key in seen[3] if names.get(key) is fn]
    return out


class Redirect:
    """A stand-in for ``init_process_group`` that keeps the caller's backend, rank and world size
    but joins this test's rendezvous (``init_method``, ``store`` and the environment are ignored)."""

    def __init__(self, ctx, host: str, port: int, prefix: str):
        self.ctx, self.host, self.port, self.prefix = ctx, host, port, prefix
        self.notes: List[str] = []
        self._store: Optional[Store] = None
        self._inits = itertools.count()
        self.original: Optional[Callable] = None

    @contextlib.contextmanager
    def installed(self):
        """Replace every reference to the real ``init_process_group`` (``torch.distributed``'s and
        the names that ``from torch.distributed import init_process_group`` bound in any module)."""
        import torch.distributed as tdist

        self.original = original = tdist.init_process_group
        patched = []
        for names, key in bound_to(original):
            names[key] = self.init_process_group
            patched.append((names, key))
        try:
            yield self
        finally:
            for names, key in patched:
                names[key] = original

    def init_process_group(self, backend: Optional[str] = None, init_method: Optional[str] = None,
                           timeout: Optional[timedelta] = None, world_size: int = -1, rank: int = -1,
                           store=None, group_name: str = "", pg_options=None, device_id=None, **extra):
        """Signature-compatible with ``torch.distributed.init_process_group``."""
        import torch.distributed as tdist

        ctx = self.ctx
        world_size = int(os.environ.get("WORLD_SIZE", ctx.world_size)) if world_size in (-1, None) else world_size
        rank = int(os.environ.get("RANK", ctx.rank)) if rank in (-1, None) else rank
        if world_size != ctx.world_size:
            raise RuntimeError(
                f"init_process_group(world_size={world_size}) inside dist.spawn, but this test runs "
                f"{ctx.world_size} rank(s): pass dist.world_size to your code (mp.spawn's nprocs), or mark "
                f"the test gpu{world_size} / world_sizes({world_size})")
        backend = self._runnable(backend)
        if device_id is not None and ctx.device_type != "cuda":
            self._note(f"init_process_group(device_id={device_id!r}) was dropped: these ranks run on the CPU, "
                       "and device_id binds a process group to an accelerator (torchrun on CPU rejects "
                       "device_id=torch.device('cpu')); pass device_id only when the device is an accelerator")
            device_id = None
        if self._store is None:
            self._store = tdist.TCPStore(self.host, self.port, is_master=False, wait_for_workers=False,
                                         timeout=timeout or timedelta(seconds=300))
        prefixed = tdist.PrefixStore(f"{self.prefix}{next(self._inits)}/", self._store)
        kwargs = dict(backend=backend, store=prefixed, rank=rank, world_size=world_size,
                      group_name=group_name, pg_options=pg_options, device_id=device_id, **extra)
        if timeout is not None:
            kwargs["timeout"] = timeout
        if init_method not in (None, "env://") or store is not None:
            self._note(f"init_process_group({'store=...' if store is not None else repr(init_method)}) "
                       "joined this test's rendezvous instead")
        assert self.original is not None  # set by installed(), the only way this method is reached
        return self.original(**kwargs)

    def _runnable(self, backend: Optional[str]) -> Optional[str]:
        """``"nccl"`` on CPU ranks, on ranks sharing a GPU (NCCL refuses two ranks on one GPU) or without
        NCCL becomes this test's backend (gloo), with a note."""
        import torch
        import torch.distributed as tdist

        if backend is None or "nccl" not in str(backend).lower():
            return backend
        if self.ctx.backend == "nccl" and tdist.is_nccl_available() and torch.cuda.is_available():
            return backend
        where = "ranks sharing a GPU" if self.ctx.device_type == "cuda" else f"{self.ctx.device_type} ranks"
        self._note(f"backend {backend!r} cannot run on these {where}; ran as {self.ctx.backend!r}")
        return self.ctx.backend

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            print(f"pytest-mgpu: {text}", file=sys.stderr, flush=True)
