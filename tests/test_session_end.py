"""What a pytest run leaves when it returns: no process (the forkserver included), no rank-log
folders; and folders that killed runs left are removed by the next run."""
import os
import subprocess

import pytest

from tests.conftest import processes_with_token

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


@pytest.mark.parametrize("mode", ["warm", "isolate"])
def test_nothing_runs_once_pytest_returned_and_stale_folders_go(subpytest, mode, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    dead = dead_pid()
    stale = [tmp / f"pytest-mgpu-pool-{dead}-abc", tmp / f"pytest-mgpu-call-{dead}-abc"]
    live = tmp / f"pytest-mgpu-pool-{os.getpid()}-keep"  # its owner (this process) is alive
    for d in stale + [live]:
        d.mkdir()
    subpytest.pytester.makepyfile(test_one=ONE)
    args = ["--mgpu-fallback=cpu"] + (["--mgpu-isolate"] if mode == "isolate" else [])
    rc, out = subpytest.run(*args, TMPDIR=str(tmp))
    assert rc == 0, out
    left = {p: open(f"/proc/{p}/cmdline").read().replace("\0", " ") for p in processes_with_token(subpytest.token)}
    assert left == {}  # right away: the forkserver was reaped too
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("pytest-mgpu-")) == [live.name]
