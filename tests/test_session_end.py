"""What a pytest run leaves when it returns: no process (the forkserver included), no rank-log
folders; and folders that killed runs left are removed by the next run."""
import os
import signal
import subprocess

import pytest

from tests.ahead import ahead
from tests.conftest import Subpytest, processes_with_token, run_together

ONE = """
import pytest, torch.distributed as tdist

def rank():
    return tdist.get_rank()

@pytest.mark.gpu2
def test_one(dist):
    assert dist.run(rank) == [0, 1]
"""


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


MODES = {"warm": (), "isolate": ("--mgpu-isolate",)}


class _Dir:
    def __init__(self, path):
        self.path = path


@ahead("runs")
def end_sessions(tmp_path_factory):
    """Warm and fresh ranks, one pytest each, both at once, each with its own TMPDIR holding the folders
    of a dead run (to be removed) and of a live one (this process: to be kept)."""
    dead = dead_pid()
    started, tmps = [], {}
    for mode, extra in MODES.items():
        sp = Subpytest(_Dir(tmp_path_factory.mktemp(f"end-{mode}")))
        tmp = sp.pytester.path / "tmp"
        tmp.mkdir()
        for name in (f"pytest-mgpu-pool-{dead}-abc", f"pytest-mgpu-call-{dead}-abc", f"pytest-mgpu-pool-{os.getpid()}-keep"):
            (tmp / name).mkdir()
        (sp.pytester.path / "test_one.py").write_text(ONE)
        started.append((sp, ("--mgpu-fallback=cpu", *extra), {"TMPDIR": str(tmp)}))
        tmps[mode] = tmp
    try:
        return {mode: (ended, tmps[mode]) for mode, ended in zip(MODES, run_together(started))}
    finally:
        for sp, _, _ in started:
            for pid in processes_with_token(sp.token):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def runs(lane):
    """The module's sessions (above), run ahead of its tests."""
    yield from lane.take(end_sessions)


@pytest.mark.parametrize("mode", list(MODES))
def test_nothing_runs_once_pytest_returned_and_stale_folders_go(runs, mode):
    ended, tmp = runs[mode]
    assert ended.rc == 0, ended.out
    assert ended.left == {}  # right away: the forkserver was reaped too
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("pytest-mgpu-")) == [f"pytest-mgpu-pool-{os.getpid()}-keep"]
