"""The base side of the revision lane on disk: a temporary ``git worktree`` of REV.

``--mgpu-against=REV`` measures the code of revision REV of the repository that holds the test file
beside the working tree. The code of REV is checked out with ``git worktree add --detach`` into a
temporary folder (``pytest-mgpu-rev-<pid>-...``), put first on the base ranks' ``sys.path``
(``Checkout.path_first``), and removed when the session ends, also after Ctrl-C (``close``, and
``atexit`` as a second line). A session that was killed (SIGKILL, SIGTERM) cannot remove its own:
the next session's ``prune_stale`` removes worktrees whose owning process is gone.

Git is asked, never guessed: the repository is ``git rev-parse --show-toplevel`` of the test file's
folder, REV is whatever ``git rev-parse --verify REV^{commit}`` accepts (a branch, a tag, a sha,
``HEAD~1``, ``origin/main``), and a dirty tree is ``git status --porcelain``. Each failure says what
to do next (``RevisionError``).
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

from ..launch.processes import alive

PREFIX = "pytest-mgpu-rev-"
_OWNED = re.compile(rf"^{PREFIX}(\d+)-")
GIT_TIMEOUT_S = 120.0  # a worktree of a large repository is a full checkout


class RevisionError(Exception):
    """The revision lane cannot measure REV; the message says why and what to do."""


def git(cwd: Union[str, Path], *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=str(cwd), capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        raise RevisionError("--mgpu-against needs git, and no `git` is on PATH: install git, or drop "
                            "--mgpu-against") from None
    except subprocess.TimeoutExpired:
        raise RevisionError(f"git {' '.join(args)} took more than {GIT_TIMEOUT_S:g} s in {cwd}") from None


@dataclass(frozen=True)
class Checkout:
    """REV checked out beside the working tree of ``repo``."""

    rev: str  # as the user gave it
    commit: str  # full sha
    short: str  # git's abbreviation
    repo: str  # top of the working tree (the head side)
    path: str  # the worktree of REV (the base side)
    dirty: str  # "" or what is uncommitted in the working tree (which is what the head side measures)

    @property
    def label(self) -> str:
        return f"{self.rev}@{self.short}"

    def base_path(self, path: Optional[str]) -> Optional[str]:
        """``path`` (a file or folder in the working tree) at REV; None when it lies outside the
        repository (its code is the same on both sides)."""
        if not path:
            return None
        real = os.path.realpath(path)
        try:
            rel = os.path.relpath(real, self.repo)
        except ValueError:
            return None
        if rel == os.curdir:
            return self.path
        if rel.startswith(os.pardir + os.sep) or rel == os.pardir:
            return None
        return os.path.join(self.path, rel)

    def path_first(self, sys_path) -> Tuple[str, ...]:
        """The entries of ``sys_path`` that lie in the repository, as folders of REV: they go first
        on the base ranks' ``sys.path``, so REV's modules shadow the working tree's."""
        out = []
        for entry in sys_path:
            mapped = self.base_path(entry or os.getcwd())
            if mapped is not None and os.path.isdir(mapped) and mapped not in out:
                out.append(mapped)
        return tuple(out)


def find_repo(where: Union[str, Path], rev: str) -> str:
    folder = where if os.path.isdir(where) else os.path.dirname(str(where))
    out = git(folder, "rev-parse", "--show-toplevel")
    if out.returncode != 0:
        raise RevisionError(
            f"--mgpu-against={rev}: {where} is not in a git repository, so there is no revision to measure "
            "against. Run from a git clone (in CI: actions/checkout), or drop --mgpu-against.")
    return os.path.realpath(out.stdout.strip())


def resolve(repo: str, rev: str) -> Tuple[str, str]:
    """(full sha, short sha) of REV in ``repo``, or a RevisionError saying how to get it."""
    out = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if out.returncode != 0 or not out.stdout.strip():
        shallow = git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        hint = ("this clone is shallow: fetch the base first, e.g. `git fetch --depth=50 origin main` "
                "(actions/checkout: fetch-depth: 0)" if shallow else
                "fetch it first (`git fetch origin main` for origin/main), or name a branch, tag or sha "
                "that `git rev-parse` knows")
        raise RevisionError(f"--mgpu-against={rev}: no such revision in {repo}; {hint}.")
    commit = out.stdout.strip()
    short = git(repo, "rev-parse", "--short", commit).stdout.strip() or commit[:7]
    return commit, short


def dirty_state(repo: str) -> str:
    """What is uncommitted in the working tree ("" when clean): the head side measures it as it is."""
    out = git(repo, "status", "--porcelain")
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()] if out.returncode == 0 else []
    if not lines:
        return ""
    return f"{len(lines)} uncommitted change(s)"


def add(repo: str, commit: str) -> str:
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    out = git(repo, "worktree", "add", "--detach", path, commit)
    if out.returncode != 0:
        shutil.rmtree(path, ignore_errors=True)
        raise RevisionError(f"--mgpu-against: `git worktree add --detach {path} {commit}` failed in {repo}: "
                            f"{out.stderr.strip() or out.stdout.strip()}")
    return os.path.realpath(path)


def remove(repo: str, path: str) -> None:
    """Remove the worktree, and its registration in the repository, whatever state it is in."""
    out = git(repo, "worktree", "remove", "--force", path)
    if out.returncode != 0 or os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)
        git(repo, "worktree", "prune")


def prune_stale(repo: str) -> None:
    """Remove worktrees of this repository (and their folders) left by sessions that are gone."""
    out = git(repo, "worktree", "list", "--porcelain")
    for line in out.stdout.splitlines():
        if line.startswith("worktree "):
            path = line[len("worktree "):]
            m = _OWNED.match(os.path.basename(path))
            if m and not alive(int(m.group(1))):
                remove(repo, path)
    git(repo, "worktree", "prune")


class Worktrees:
    """The session's checkouts, one per (repository, REV), made on first use, removed by ``close``."""

    def __init__(self, rev: str):
        self.rev = rev
        self._by_repo: Dict[str, Union[Checkout, RevisionError]] = {}
        self._closed = False
        atexit.register(self.close)

    def check(self, where: Union[str, Path]) -> None:
        """Fail now (at the start of the session) if ``where`` is not in git or REV is unknown there;
        and remove what killed sessions left in that repository."""
        repo = find_repo(where, self.rev)
        resolve(repo, self.rev)
        prune_stale(repo)

    def checkout(self, test_file: Union[str, Path]) -> Checkout:
        repo = find_repo(test_file, self.rev)
        found = self._by_repo.get(repo)
        if found is None:
            try:
                commit, short = resolve(repo, self.rev)
                prune_stale(repo)
                found = Checkout(self.rev, commit, short, repo, add(repo, commit), dirty_state(repo))
            except RevisionError as exc:
                found = exc
            self._by_repo[repo] = found
        if isinstance(found, RevisionError):
            raise RevisionError(str(found))
        return found

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for c in self._by_repo.values():
            if isinstance(c, Checkout):
                remove(c.repo, c.path)
        self._by_repo.clear()
