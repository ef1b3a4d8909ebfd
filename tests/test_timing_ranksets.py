"""What keeps the revision lane's two sets of ranks alike: the same cores per rank, and a role swap
that re-imports the user's modules from the other revision."""
import os
import sys

import pytest

from pytest_mgpu.timing.ranksets import cores_for, forget_modules, pinned


def test_each_rank_gets_the_same_share_of_cores_in_both_sets():
    assert cores_for(0, 2, [0, 1]) == {0} and cores_for(1, 2, [0, 1]) == {1}
    assert cores_for(1, 4, range(16)) == {4, 5, 6, 7}  # a GPU box: 4 cores per rank
    assert cores_for(3, 4, [0, 1]) == {1}  # more ranks than cores: round robin
    assert cores_for(0, 1, [2, 3]) == {2, 3}  # one rank keeps every core it may use
    assert cores_for(0, 2, [5, 9]) == {5}  # the cores the process was given, not 0..n


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_pinned_pins_every_thread_and_puts_the_cores_back():
    import threading

    before = os.sched_getaffinity(0)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()  # a thread started before the pin: gloo's are
    try:
        with pinned(1, 2) as mine:
            assert os.sched_getaffinity(0) == mine == cores_for(1, 2, sorted(before))
            assert os.sched_getaffinity(worker.native_id) == mine
        assert os.sched_getaffinity(0) == before and os.sched_getaffinity(worker.native_id) == before
    finally:
        stop.set()
        worker.join()


def test_forget_modules_drops_the_repositorys_modules_and_keeps_the_rest(tmp_path, monkeypatch):
    head, base = tmp_path / "head", tmp_path / "base"
    for folder, n in ((head, 6), (base, 1)):
        (folder / "pkg").mkdir(parents=True)
        (folder / "pkg" / "__init__.py").write_text("")
        (folder / "pkg" / "work.py").write_text(f"N = {n}\n")
    monkeypatch.syspath_prepend(str(head))
    import pkg.work

    assert pkg.work.N == 6
    gone = forget_modules([str(head), str(base)])
    assert set(gone) == {"pkg", "pkg.work"} and "pkg.work" not in sys.modules
    assert "pytest_mgpu.timing.ranksets" in sys.modules and "os" in sys.modules
    monkeypatch.syspath_prepend(str(base))
    import pkg.work as again  # the other revision's file, now first on sys.path

    assert again.N == 1
    forget_modules([str(base)])


def test_forget_modules_keeps_installed_packages_inside_the_repository(tmp_path, monkeypatch):
    """A virtual environment inside the repository (``.venv/``) holds torch under the repository's
    root: its modules are installed ones and must stay (importing torch twice fails)."""
    repo = tmp_path / "repo"
    site = repo / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "installed_dep.py").write_text("N = 1\n")
    (repo / "users_code.py").write_text("N = 2\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(repo))
    import installed_dep
    import users_code

    assert (installed_dep.N, users_code.N) == (1, 2)
    monkeypatch.chdir(repo)  # torch.ops' __file__ is "_ops.py", relative: it must not read as the repo's
    gone = forget_modules([str(repo)])
    assert gone == ["users_code"] and "installed_dep" in sys.modules and "torch.ops" in sys.modules
    del sys.modules["installed_dep"]
