"""What makes the revision lane's two sets of ranks alike but for their code: each rank pinned to the
same cores on both sets, and a set's imported user modules dropped when it changes roles.

Why: a set of warm ranks carries a speed of its own for as long as it lives. Measured on the 2-core
machine (``benchmarks/timing/revision_bias.py``, ResNet18 DDP step, 2 gloo ranks per set, the same code on
both sides): the head/base ratio of separate A/A measurements scattered with sd 0.077-0.13 in log
(five of eight called "faster", x0.78-0.86) where each measurement's own interval said se 0.02-0.025.
Part of it is where the scheduler put each set's threads (unpinned, the same two sets moved from x1.0
to x0.8 between measurements; pinned, they stayed within sd 0.016); part stays with the processes
even when pinned (fresh pinned sets: x0.88 to x1.12, some sets ~12% faster for their whole life, their
compute alone 36 vs 51 ms on the same core: where their memory landed). Pairs within one measurement
cannot see either: every pair carries it alike.

So the lane (``revision.run_duet``) pins rank r of both sets to the same cores (``pinned``), and
swaps the sets' roles between blocks of pairs: set A runs the head and set B the base, then A the base
and B the head. A set's own speed then enters the blocks with alternating signs, and the mean over
blocks (``pairing.judge_pairs``) cancels it. Swapping roles means a warm rank imports the other
revision's modules: ``forget_modules`` drops every module loaded from the repository or the worktree
(pytest-mgpu's own excepted: it is the installed one on both sides) before the next block imports
them again from the new role's ``sys.path``.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Iterator, List, Optional, Sequence, Set, Tuple

OWN_PACKAGE = "pytest_mgpu"


def cores_for(rank: int, world: int, allowed: Sequence[int]) -> Set[int]:
    """The cores of rank ``rank``: an equal, contiguous share of ``allowed`` (the cores the process
    may use), or one core each, round robin, when there are more ranks than cores. The same rank
    gets the same cores in both sets of ranks."""
    cores = sorted(allowed)
    if not cores:
        return set()
    if world <= 1:
        return set(cores)
    if world > len(cores):
        return {cores[rank % len(cores)]}
    share = len(cores) // world
    return set(cores[rank * share:(rank + 1) * share])


def _threads() -> List[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _set_affinity(cores: Set[int]) -> None:
    for tid in _threads():  # every thread: gloo's and the intra-op pool's were started before this call
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cores)


@contextlib.contextmanager
def pinned(rank: int, world: int) -> Iterator[Optional[Set[int]]]:
    """Pin this rank's threads to ``cores_for(rank, world)`` for the block, then put back the cores
    it had. Where affinity is not supported (not Linux), nothing is pinned (None)."""
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    allowed = os.sched_getaffinity(0)
    mine = cores_for(rank, world, sorted(allowed))
    _set_affinity(mine)
    try:
        yield mine
    finally:
        _set_affinity(allowed)


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


INSTALLED_DIRS = frozenset({"site-packages", "dist-packages"})
_PREFIXES = sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})


def _installed(path: str) -> bool:
    """A file of an installed package or of the interpreter: the same on both sides, whatever the
    revision. Found in practice: a virtual environment inside the repository (``.venv/``, as
    ``python -m venv .venv`` makes it, and CI scripts do) holds torch under the repository's root;
    dropping torch's modules and importing torch again fails ("function '_has_torch_function' already
    has a docstring")."""
    return bool(INSTALLED_DIRS.intersection(path.split(os.sep))) or _inside(path, _PREFIXES)


def _repository_modules(roots: Sequence[str]) -> List[Tuple[str, str]]:
    """(name, real path) of every module loaded from under ``roots``, except pytest-mgpu's own and
    installed packages (``_installed``: a virtual environment inside the repository)."""
    real = [os.path.realpath(r) for r in roots if r]
    if not real:
        return []
    found = []
    for name, module in list(sys.modules.items()):
        if name == OWN_PACKAGE or name.startswith(OWN_PACKAGE + "."):
            continue
        file = getattr(module, "__file__", None)  # torch.ops says "_ops.py": no place, not the user's
        if not isinstance(file, str) or not os.path.isabs(file) or not file.endswith((".py", ".pyc")):
            continue
        if _installed(file):  # before realpath: most modules are, and realpath costs a stat per part
            continue
        path = os.path.realpath(file)
        if _inside(path, real) and not _installed(path):
            found.append((name, path))
    return found


def repository_files(roots: Sequence[str]) -> List[str]:
    """The files of the modules ``forget_modules`` would drop: what this rank imported from the
    repository (``changes``: is it REV's code?)."""
    return sorted({path for _, path in _repository_modules(roots)})


def forget_modules(roots: Sequence[str]) -> List[str]:
    """Drop from ``sys.modules`` every module whose file lies under one of ``roots`` (the
    repository's working tree and REV's worktree), except pytest-mgpu's own and installed packages
    (``_installed``: a virtual environment inside the repository). Returns their names.

    The next import of such a module runs its file again, from whichever folder is first on
    ``sys.path``. A compiled extension module cannot be loaded twice in one process: it is left in
    place, so the user's own C extensions are the head's on both sides."""
    gone = [name for name, _ in _repository_modules(roots)]
    for name in gone:
        del sys.modules[name]
    if gone:
        importlib.invalidate_caches()
    return gone
