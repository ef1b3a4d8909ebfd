"""The revision lane's shortcut: a benchmark whose code is REV's is not measured further.

After the lane's first block, the head's ranks say which files of the repository they imported (the
timed function's module, and whatever it and its step imported, lazily too: ``ranksets.
repository_files``). When none of those differs between REV and the working tree, the base side
imports the very same code: more pairs would measure noise. The row is then "unchanged", a pass,
and its first block's pairs are shown, not judged.

Conservative on purpose (``Changes.blocking``): any changed file that is neither Python nor
documentation (data, a config, a compiled extension: read at run time, perhaps), and any Python
file deleted or renamed at REV (REV's copy could shadow an installed module of that name on the
base side), make every benchmark of the repository measure in full. pytest-mgpu's own files do not
count: both sides use the installed one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import FrozenSet, Iterable, List

from .worktree import Checkout, git

PYTHON = (".py",)
DOCUMENTATION = (".md", ".rst", ".png", ".svg", ".jpg", ".gif")  # never read by a training step


def _own_package(repo: str) -> str:
    """pytest-mgpu's own folder relative to ``repo`` ("" when it is installed elsewhere)."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # timing/changes.py's package
    rel = os.path.relpath(package, os.path.realpath(repo))
    return "" if rel.startswith(os.pardir) else rel


@dataclass(frozen=True)
class Changes:
    """The files (relative to the repository's top) that differ between REV and the working tree."""

    python: FrozenSet[str] = frozenset()  # modified, added or untracked Python files
    blocking: List[str] = field(default_factory=list)  # anything else: every benchmark measures in full
    unread: int = 0  # changed files no step reads (documentation, pytest-mgpu's own, bytecode)

    def unchanged(self, imported: Iterable[str], repo: str) -> str:
        """Why the imported files (absolute paths) are REV's code; "" when they may not be."""
        if self.blocking:
            return ""
        rel = {os.path.relpath(os.path.realpath(p), repo) for p in imported}
        if rel & self.python:
            return ""
        parts = [f"{len(self.python)} Python file(s) differ, none of them imported"] if self.python else []
        if self.unread:
            parts.append(f"{self.unread} file(s) no step reads differ (documentation, pytest-mgpu's own)")
        changed = "; ".join(parts) or "no file differs"
        return f"the {len(rel)} file(s) of the repository its ranks imported are the same at REV ({changed})"


def _bytecode(path: str) -> bool:
    """Python's own caches of a .py file (an untracked ``__pycache__`` where no .gitignore hides it)."""
    return path.endswith(".pyc") or "__pycache__" in path.split(os.sep)


def changes(checkout: Checkout) -> Changes:
    """``git diff --name-status REV`` (the working tree, staged or not) and the untracked files."""
    diff = git(checkout.repo, "diff", "--name-status", "--no-renames", "-z", checkout.commit)
    others = git(checkout.repo, "ls-files", "--others", "--exclude-standard", "-z")
    if diff.returncode or others.returncode:
        return Changes(blocking=[f"git could not tell what changed: {(diff.stderr or others.stderr).strip()}"])
    fields = diff.stdout.split("\0")
    entries = [(fields[i], fields[i + 1]) for i in range(0, len(fields) - 1, 2)]
    entries += [("?", path) for path in others.stdout.split("\0") if path]
    own = _own_package(checkout.repo)
    python, blocking, unread = set(), [], 0
    for status, path in entries:
        path = os.path.normpath(path)
        if (own and path.startswith(own + os.sep)) or path.endswith(DOCUMENTATION) or _bytecode(path):
            unread += not _bytecode(path)
            continue
        if path.endswith(PYTHON) and status in ("M", "A", "?"):
            python.add(path)
        else:
            blocking.append(f"{status} {path}")
    return Changes(frozenset(python), blocking, unread)
