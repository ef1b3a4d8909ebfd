"""The folder each phase of ``dist.assert_resumes`` runs in, and ``checkpoint_dir()``.

Each phase runs with the current directory set to a fresh folder of its own (the interrupted and the
resumed phase share one), so a trainer that writes ``snapshot.pt`` where it stands, and one that
takes a folder (``pytest_mgpu.checkpoint_dir()``), both work unchanged. The folders live under one
temporary parent made in the test process; it is removed after a pass and kept after a failure (the
message names it), so the checkpoint that failed can be opened.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile
from typing import Iterator, List

from ...timing.units import fmt_size

ENV = "PYTEST_MGPU_CHECKPOINT_DIR"


class Folder(str):
    """A path as ``str`` (``checkpoint_dir() + "/x.pt"``, ``os.path.join``) that also takes ``/``
    (``checkpoint_dir() / "x.pt"``, a ``pathlib.Path``)."""

    def __truediv__(self, other) -> pathlib.Path:
        return pathlib.Path(self) / other


def checkpoint_dir() -> Folder:
    """The folder where a trainer under ``dist.assert_resumes`` saves and finds its checkpoint.

    Each phase runs with this folder as its current directory; the interrupted and the resumed phase
    share one, so a checkpoint saved by the first is found by the second.

    Returns:
        The phase's folder: a ``str`` that also takes ``/`` (``checkpoint_dir() / "last.pt"`` is a
        ``pathlib.Path``).

    Raises:
        RuntimeError: Outside the ranks of ``dist.assert_resumes``.
    """
    path = os.environ.get(ENV)
    if not path:
        raise RuntimeError(
            "pytest_mgpu.checkpoint_dir() has a value only inside the ranks of dist.assert_resumes (each phase's "
            "own folder). Elsewhere, give your trainer a folder of your own (pytest's tmp_path, or a tempfile.mkdtemp())")
    return Folder(path)


@contextlib.contextmanager
def in_folder(path: str) -> Iterator[None]:
    """This rank works in ``path`` (current directory and ``checkpoint_dir()``) until the block ends."""
    before, saved = os.getcwd(), os.environ.get(ENV)
    os.chdir(path)
    os.environ[ENV] = path
    try:
        yield
    finally:
        os.chdir(before)
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved


class PhaseFolders:
    """The test process's folders: one parent, a subfolder per run."""

    def __init__(self) -> None:
        self.parent = tempfile.mkdtemp(prefix="pytest-mgpu-resume-")

    def new(self, name: str) -> str:
        path = os.path.join(self.parent, name)
        os.makedirs(path, exist_ok=True)
        return path

    def remove(self) -> None:
        import shutil

        shutil.rmtree(self.parent, ignore_errors=True)


def listing(path: str, limit: int = 8) -> str:
    """What a folder holds, for a message: "snapshot.pt (1.2 KiB)", "nothing"."""
    found: List[str] = []
    for root, _, files in os.walk(path):
        for f in sorted(files):
            full = os.path.join(root, f)
            found.append(f"{os.path.relpath(full, path)} ({fmt_size(os.path.getsize(full))})")
    if not found:
        return "nothing"
    more = f", and {len(found) - limit} more" if len(found) > limit else ""
    return ", ".join(found[:limit]) + more
