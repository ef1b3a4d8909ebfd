"""pytest --cov sees the lines that ``dist.run`` executes in ranks, warm and fresh, also when the call
raises there; without coverage the ranks get nothing of it."""
import os
import re
import signal
import sys

import pytest

from pytest_mgpu.launch.rank_coverage import ENV, RankCoverage, measuring, ranks_env
from tests.ahead import ahead
from tests.conftest import Subpytest, processes_with_token, run_together

OPS = """
def in_rank(x):
    y = x + 1
    return y * 2


def raises_in_rank(x):
    z = x * 3
    raise ValueError(z)


def never_called():
    return 0
"""
RANK_ONLY = {3, 4, 8, 9}  # the bodies of in_rank and raises_in_rank: they run in ranks only
NEVER = 13  # never_called's body: missing, or the report measured nothing

TEST = """
import pytest
from covpkg.ops import in_rank, raises_in_rank


@pytest.mark.gpu2
def test_in_ranks(dist):
    assert dist.run(in_rank, 1) == [4, 4]


@pytest.mark.gpu2
def test_raises_in_ranks(dist):
    with pytest.raises(Exception, match="ValueError"):
        dist.run(raises_in_rank, 1)
"""


def _missing(output: str, path: str) -> set:
    """The Missing column of ``path``'s row in a term-missing report."""
    row = re.search(rf"^{re.escape(path)}\s+\d+\s+\d+\s+\d+%\s*(.*)$", output, re.M)
    assert row, f"no row for {path} in the coverage report:\n{output}"
    missing = set()
    for part in filter(None, (p.strip() for p in row.group(1).split(","))):
        lo, _, hi = part.partition("-")
        missing.update(range(int(lo), int(hi or lo) + 1))
    return missing


MODES = {"warm": (), "fresh": ("--mgpu-isolate",)}


class _Dir:
    def __init__(self, path):
        self.path = path


@ahead("covered")
def cov_sessions(tmp_path_factory):
    """Warm and fresh ranks, one pytest --cov subprocess each (coverage starts before the plugin), both
    at once. How each ended, and its folder."""
    pytest.importorskip("pytest_cov")
    runs = []
    for mode, extra in MODES.items():
        sp = Subpytest(_Dir(tmp_path_factory.mktemp(f"cov-{mode}")))
        (sp.pytester.path / "covpkg").mkdir()
        (sp.pytester.path / "covpkg" / "__init__.py").write_text("")
        (sp.pytester.path / "covpkg" / "ops.py").write_text(OPS)
        (sp.pytester.path / "test_cov.py").write_text(TEST)
        runs.append((sp, ("--cov=covpkg", "--cov-report=term-missing", "--mgpu-fallback=cpu", *extra)))
    try:
        return {mode: (ended, sp.pytester.path) for mode, ended, (sp, _) in zip(MODES, run_together(runs), runs)}
    finally:
        for sp, _ in runs:
            for pid in processes_with_token(sp.token):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def covered(lane):
    """The module's sessions (above), run ahead of its tests."""
    yield from lane.take(cov_sessions)


@pytest.mark.parametrize("mode", list(MODES))
def test_cov_reports_lines_run_in_ranks(covered, mode):
    ended, folder = covered[mode]
    assert ended.rc == 0 and "2 passed" in ended.out, ended.out
    missing = _missing(ended.out, "covpkg/ops.py")
    assert NEVER in missing
    assert not missing & RANK_ONLY, f"lines run in ranks reported missing: {sorted(missing & RANK_ONLY)}"
    assert not list(folder.glob(".coverage.*")), "the ranks' data files were not combined"


def test_nothing_reaches_ranks_when_nothing_measures(monkeypatch):
    monkeypatch.delitem(sys.modules, "coverage", raising=False)
    assert ranks_env("/anywhere") == {} and measuring() is None
    assert "coverage" not in sys.modules  # looked up, never imported
    RankCoverage().resume({})  # a rank without the variable does nothing
    RankCoverage().pause()


def test_ranks_get_the_measuring_configuration(tmp_path, monkeypatch):
    coverage = pytest.importorskip("coverage")
    monkeypatch.chdir(tmp_path / "..")  # a test that moved elsewhere: the data file stays anchored
    cov = coverage.Coverage(data_file=".cov-anchor", source=["covpkg"], branch=True, data_suffix=True)
    cov.start()
    try:
        env = ranks_env(str(tmp_path))
    finally:
        cov.stop()
    rank = RankCoverage()
    rank.resume(env)
    rank.pause()
    assert rank.cov.config.data_file == str(tmp_path / ".cov-anchor")
    assert rank.cov.config.branch and rank.cov.config.source == ["covpkg"]
    assert ENV in env and not rank.broken
