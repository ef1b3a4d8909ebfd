"""The revision lane's shortcut on a real git repository: which changes leave a benchmark's imported
code REV's (unchanged: not measured further), and which make every benchmark measure in full."""
import pytest

from pytest_mgpu.timing.changes import changes
from pytest_mgpu.timing.worktree import Checkout
from tests.gitrepo import git, new_repo


@pytest.fixture
def repo(tmp_path):
    names = ("pkg/__init__.py", "pkg/model.py", "pkg/other.py", "test_perf.py", "README.md", "config.yaml")
    return new_repo(tmp_path / "repo", {name: "# base\n" for name in names})


def _checkout(r):
    return Checkout("HEAD", git(r, "rev-parse", "HEAD"), "abc", str(r), str(r) + "-base", "")


def imported(r):
    return [str(r / "pkg" / "__init__.py"), str(r / "pkg" / "model.py")]


def test_nothing_changed_or_only_what_the_ranks_did_not_import(repo):
    assert "the 2 file(s) of the repository its ranks imported are the same at REV (no file differs)" == \
        changes(_checkout(repo)).unchanged(imported(repo), str(repo))
    (repo / "pkg" / "other.py").write_text("# changed\n")  # modified, not imported
    (repo / "test_new.py").write_text("# untracked\n")
    (repo / "README.md").write_text("# docs change\n")
    (repo / "pkg" / "__pycache__").mkdir()
    (repo / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    found = changes(_checkout(repo))
    assert found.python == {"pkg/other.py", "test_new.py"} and not found.blocking
    assert found.unchanged(imported(repo), str(repo)).endswith(
        "(2 Python file(s) differ, none of them imported; 1 file(s) no step reads differ (documentation, "
        "pytest-mgpu's own))")
    git(repo, "checkout", "pkg/other.py")
    (repo / "test_new.py").unlink()
    assert changes(_checkout(repo)).unchanged(imported(repo), str(repo)).endswith(
        "are the same at REV (1 file(s) no step reads differ (documentation, pytest-mgpu's own))")  # not "no file"


def test_an_imported_file_changed_staged_or_not_is_measured(repo):
    (repo / "pkg" / "model.py").write_text("# changed\n")
    assert changes(_checkout(repo)).unchanged(imported(repo), str(repo)) == ""
    git(repo, "add", "pkg/model.py")
    assert changes(_checkout(repo)).unchanged(imported(repo), str(repo)) == ""


@pytest.mark.parametrize("change", ["data", "deleted", "renamed"])
def test_data_or_a_python_file_gone_at_rev_make_every_benchmark_measure(repo, change):
    """A config may be read at run time; a .py file REV has and the head has not could shadow an
    installed module of that name on the base side."""
    if change == "data":
        (repo / "config.yaml").write_text("lr: 2\n")
    elif change == "deleted":
        (repo / "pkg" / "other.py").unlink()
    else:
        git(repo, "mv", "pkg/other.py", "pkg/renamed.py")
    found = changes(_checkout(repo))
    assert found.blocking and changes(_checkout(repo)).unchanged(imported(repo), str(repo)) == ""
