"""The base side of the revision lane on disk: real git repositories and worktrees in tmp_path, each
removed afterwards; errors that say what to do."""
import os
import subprocess
import sys

import pytest

from pytest_mgpu.timing import worktree
from pytest_mgpu.timing.worktree import RevisionError, Worktrees
from tests.gitrepo import git, new_repo


@pytest.fixture
def repo(tmp_path):
    r = new_repo(tmp_path / "repo", {"pkg/work.py": "N = 1\n"})
    (r / "pkg" / "work.py").write_text("N = 2\n")
    git(r, "commit", "-qam", "head")
    return r


def registered(repo):
    return [line.split(" ", 1)[1] for line in git(repo, "worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")]


def test_checkout_maps_the_working_tree_onto_rev_and_is_removed(repo):
    trees = Worktrees("HEAD~1")
    try:
        c = trees.checkout(repo / "pkg" / "work.py")
        assert c.commit == git(repo, "rev-parse", "HEAD~1") and c.short and c.label == f"HEAD~1@{c.short}"
        assert os.path.basename(c.path).startswith(f"{worktree.PREFIX}{os.getpid()}-")
        assert open(c.base_path(str(repo / "pkg" / "work.py"))).read() == "N = 1\n"
        assert c.base_path("/usr/lib") is None  # outside the repository: the same code on both sides
        assert c.path_first([str(repo), "/usr/lib", str(repo / "pkg"), ""]) == (c.path, os.path.join(c.path, "pkg"))
        assert c.dirty == "" and trees.checkout(repo) is c  # one worktree per repository and REV
        assert len(registered(repo)) == 2
    finally:
        trees.close()
    assert registered(repo) == [str(repo.resolve())] and not os.path.exists(c.path)


def test_a_dirty_tree_is_named(repo):
    (repo / "pkg" / "work.py").write_text("N = 3\n")
    (repo / "pkg" / "new.py").write_text("")
    trees = Worktrees("HEAD")
    try:
        assert trees.checkout(repo).dirty == "2 uncommitted change(s)"
    finally:
        trees.close()


def test_not_a_git_repository_says_what_to_do(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(RevisionError, match=r"--mgpu-against=main: .*plain is not in a git repository.*"
                                            r"Run from a git clone.*or drop --mgpu-against"):
        Worktrees("main").check(tmp_path / "plain")


def test_an_unknown_rev_says_how_to_fetch_it(repo, tmp_path):
    with pytest.raises(RevisionError, match=r"--mgpu-against=origin/mian: no such revision in .*repo; fetch it "
                                            r"first \(`git fetch origin main`"):
        Worktrees("origin/mian").check(repo)
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth=1", f"file://{repo}", str(shallow))
    with pytest.raises(RevisionError, match=r"this clone is shallow: fetch the base first.*fetch-depth: 0"):
        Worktrees("HEAD~1").check(shallow)


def test_a_killed_sessions_worktree_is_pruned_by_the_next(repo, tmp_path):
    """A session killed with SIGKILL cannot remove its worktree; the next one in the repository does."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f"{worktree.PREFIX}{dead.pid}-x"
    git(repo, "worktree", "add", "--detach", str(left), "HEAD~1")
    mine = tmp_path / f"{worktree.PREFIX}{os.getpid()}-y"  # a live session's: kept
    git(repo, "worktree", "add", "--detach", str(mine), "HEAD~1")
    trees = Worktrees("HEAD~1")
    try:
        trees.checkout(repo)
        assert str(left) not in registered(repo) and not left.exists()
        assert str(mine) in registered(repo)
    finally:
        trees.close()
        git(repo, "worktree", "remove", "--force", str(mine))
