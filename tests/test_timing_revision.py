"""The revision lane (--mgpu-against=REV) in real pytest sessions over real git repositories made in
the test's folder: the row, "new" benchmarks, a dirty tree, errors that say what to do, and no
worktree left behind, also after Ctrl-C or a killed session. Wall times are never asserted: a slowed
revision is "SLOWER" or, on a machine too loaded to tell, "unstable" (never "same" or "faster")."""
import dataclasses
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest

from pytest_mgpu.timing import worktree
from tests.ahead import ahead
from tests.conftest import Subpytest, processes_with_token

WORK = '''
import os, torch, pytest_mgpu
N = {n}

def step_factory(n, record=None):
    x = torch.randn(n, n)
    if record:
        with open(os.path.join(record, f"{{os.getpid()}}-{{N}}"), "w") as f:
            f.write(__file__ + "\\n" + pytest_mgpu.__file__)
    def step():
        for _ in range(N):
            x @ x
    return step
'''
NEW_STEP = '''
def new_step(n):
    x = torch.randn(n, n)
    return lambda: x @ x
'''
TESTS = '''
import os, pytest
import work

RECORD = {record!r}

@pytest.mark.gpu2
def test_mm(dist):
    m = dist.benchmark(work.step_factory, 128, RECORD, min_run_time=1.0)
    print(m.format())
'''
NEW_TESTS = '''
@pytest.mark.gpu1
def test_new_function(dist):
    dist.benchmark(work.new_step, 32, min_run_time=0.05)

@pytest.mark.gpu1
def test_new_file(dist):
    import work2
    dist.benchmark(work2.fresh_step, 32, min_run_time=0.05)
'''


def git(repo, *args):
    out = subprocess.run(["git", *args], cwd=str(repo), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def worktrees(repo):
    return [line.split(" ", 1)[1] for line in git(repo, "worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")]


def _make_repo(r, record):
    """``r`` as a git repository: the base commit (N = 1, its ranks writing to ``record``)."""
    git(r, "init", "-q")
    git(r, "config", "user.email", "t@t")
    git(r, "config", "user.name", "t")
    (r / "work.py").write_text(WORK.format(n=1))
    (r / "test_perf.py").write_text(TESTS.format(record=str(record)))
    git(r, "add", "work.py", "test_perf.py")
    git(r, "commit", "-qm", "base")


def _remove_worktrees(r):
    for path in worktrees(r)[1:]:
        subprocess.run(["git", "worktree", "remove", "--force", path], cwd=str(r), timeout=60)


@pytest.fixture
def repo(pytester, tmp_path):
    """pytester's folder as a git repository: the base commit (N = 1), then a working tree with
    uncommitted changes (N = 6, a new function, a new file). Whatever a failing test leaves, the
    teardown removes."""
    record = tmp_path / "record"
    record.mkdir()
    _make_repo(pytester.path, record)
    yield pytester.path, record
    _remove_worktrees(pytester.path)


def _change(r):
    (r / "work.py").write_text(WORK.format(n=6) + NEW_STEP)
    (r / "work2.py").write_text("import torch\n\ndef fresh_step(n):\n    x = torch.randn(n, n)\n    return lambda: x @ x\n")
    with open(r / "test_perf.py", "a") as f:
        f.write(NEW_TESTS)


def test_the_lane_row_new_benchmarks_a_dirty_tree_and_no_worktree_left(pytester, repo):
    r, record = repo
    _change(r)
    base = git(r, "rev-parse", "--short", "HEAD")
    result = pytester.runpytest("--mgpu-fallback=cpu", "--mgpu-against=HEAD", "--mgpu-report=out.json", "-s")
    out = result.stdout.str()
    doc = json.loads((r / "out.json").read_text())
    rows = {row["name"]: row for row in doc["rows"]}
    mm = rows["step_factory"]
    assert mm["lane"] == "revision" and mm["against"] == f"HEAD@{base}"
    assert mm["base_s"] > 0 and mm["median_s"] > 0 and "3 uncommitted change(s)" in mm["head"]
    assert mm["verdict"]["status"] in ("slower", "unstable"), mm["verdict"]  # 6x the work: never same
    if mm["verdict"]["status"] == "slower":
        assert mm["verdict"]["low"] > 1.10
        result.stdout.fnmatch_lines([f"*timing regression: *step_factory slower than HEAD@{base} beyond the threshold "
                                     "(the revision lane). Fix: find what in this change made the step slower*",
                                     "*test_mm::step_factory against HEAD (*): base *, head * "
                                     "(the working tree with 3 uncommitted change(s)); head/base x*"])
        result.assert_outcomes(passed=2, failed=1)
    else:
        result.assert_outcomes(passed=3)
    assert rows["new_step"]["verdict"]["status"] == "new" and "cannot be imported at HEAD@" in out
    # the lane's head side is the measurement (no in-run reference, not the history's); a new one is timed as usual
    meas = {m["task"]["name"]: m for m in doc["measurements"]}
    assert meas["step_factory"]["lane_only"] and not meas["step_factory"]["reference_samples_s"]
    assert len(meas["step_factory"]["samples_s"]) >= 10 and meas["step_factory"]["peak_mem_bytes"][0] > 0
    assert not meas["new_step"]["lane_only"] and meas["new_step"]["reference_samples_s"]
    assert sum(1 for row in doc["rows"] if row["name"] == "step_factory") == 1  # no history row
    assert rows["fresh_step"]["verdict"]["status"] == "new"
    assert f"new in this change: work2.py does not exist at HEAD@{base}" in out
    result.stdout.fnmatch_lines(["*revision lane: vs HEAD (*); head: the working tree with 3 uncommitted change(s)*",
                                 "*group*strategy*W*median*baseline*change*lane*verdict*",
                                 f"*test_mm*step_fact*2*vs HEAD@{base} +dirty*"])
    table = out.split("pytest-mgpu timing", 1)[1]
    assert max(len(line) for line in table.splitlines() if "vs HEAD@" in line and "::" not in line) <= 120
    # each side imported its own work.py, and the same pytest-mgpu
    sides = {}
    for name in os.listdir(record):
        module, plugin = (record / name).read_text().splitlines()
        sides.setdefault(name.rsplit("-", 1)[1], set()).add((module, plugin))
    base_side, head_side = sides["1"], sides["6"]
    pids = {name: {n.rsplit("-", 1)[0] for n in os.listdir(record) if n.endswith("-" + name)} for name in ("1", "6")}
    assert pids["1"] and pids["1"] <= pids["6"], pids  # the lane's two sets swapped roles: each ran both revisions
    assert all(os.path.basename(os.path.dirname(m)).startswith(worktree.PREFIX) for m, _ in base_side)
    assert {m for m, _ in head_side} == {str(r / "work.py")}
    assert {p for _, p in base_side} == {p for _, p in head_side} == {pytest.importorskip("pytest_mgpu").__file__}
    assert worktrees(r) == [str(r)]
    tree = os.path.dirname(next(iter(base_side))[0])
    assert not os.path.exists(tree) and not [p for p in os.listdir(os.path.dirname(tree))
                                             if p.startswith(f"{worktree.PREFIX}{os.getpid()}-")]


def test_not_a_repository_and_an_unknown_rev_stop_the_run_saying_what_to_do(pytester, monkeypatch):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("--mgpu-against=origin/main")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mgpu-against=origin/main: * is not in a git repository*Run from a git clone*"])
    git(pytester.path, "init", "-q")
    git(pytester.path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "x")
    monkeypatch.setenv("PYTEST_MGPU_AGAINST", "origin/mian")  # the environment variable, this time
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mgpu-against=origin/mian: no such revision in *; fetch it first*"])


@dataclasses.dataclass
class Interrupted:
    """A --mgpu-against session stopped by a signal once its lane ran: its repository, its runner,
    the worktrees while the lane ran and once it ended, what went wrong before the signal (None:
    nothing), and how the next session in the repository ended (SIGKILL only: exit code, output)."""
    repo: Path
    runner: Subpytest
    running: list
    ended: Optional[list] = None
    problem: Optional[str] = None
    next_session: Optional[tuple] = None


@pytest.fixture(scope="module")
def interrupted(lane):
    """The interrupted sessions (below), run ahead of the tests that read them."""
    yield from lane.take(interrupted_sessions)


@ahead("interrupted")
def interrupted_sessions(tmp_path_factory):
    """Two --mgpu-against sessions started at once in two repositories (N = 2 in the working tree),
    each sent its signal (SIGINT, SIGKILL) as soon as its base ranks have set their step up; after
    SIGKILL, the next session in that repository (collection only) starts at once. Each test reads
    its own. Their start-ups and lanes overlap instead of adding up."""
    sessions = {}
    try:
        for sig in (signal.SIGINT, signal.SIGKILL):
            r, record = tmp_path_factory.mktemp(f"repo{sig.value}"), tmp_path_factory.mktemp(f"record{sig.value}")
            _make_repo(r, record)
            (r / "work.py").write_text(WORK.format(n=2))  # the base (N=1) writes the record when set up
            runner = Subpytest(path=r)
            p = runner.popen("--mgpu-fallback=cpu", "--mgpu-against=HEAD", "test_perf.py")
            sessions[sig] = (Interrupted(r, runner, []), p, record)
        end = time.monotonic() + 240.0
        waiting = set(sessions)
        while waiting:
            for sig in sorted(waiting):
                done, p, record = sessions[sig]
                if [n for n in os.listdir(record) if n.endswith("-1")]:  # the lane is running
                    done.running = worktrees(done.repo)
                    os.killpg(p.pid, sig)
                elif p.poll() is not None:
                    done.problem = f"the session ended before its lane ran:\n{p.stdout.read()}"
                elif time.monotonic() > end:
                    done.problem = "the base ranks never set their step up"
                else:
                    continue
                waiting.discard(sig)
            time.sleep(0.1)
        after = None
        for sig in (signal.SIGKILL, signal.SIGINT):  # the killed one ends at once; its next session starts
            done, p, _ = sessions[sig]
            if done.problem is None:
                p.communicate(timeout=120)
                done.ended = worktrees(done.repo)
                if sig == signal.SIGKILL:
                    after = done.runner.popen("--co", "-q", "--mgpu-against=HEAD", "test_perf.py")
        if after is not None:
            out, _ = after.communicate(timeout=240)
            sessions[signal.SIGKILL][0].next_session = (after.returncode, out)
        yield {sig: done for sig, (done, _, _) in sessions.items()}
    finally:
        for done, p, _ in sessions.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
            for pid in processes_with_token(done.runner.token):
                os.kill(pid, signal.SIGKILL)
            _remove_worktrees(done.repo)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_session_leaves_no_worktree(interrupted, sig):
    """Ctrl-C while the lane runs: the session removes its worktree. SIGKILL: it cannot, and the next
    session in the repository removes it at its start."""
    done = interrupted[sig]
    r = done.repo
    assert done.problem is None, done.problem
    assert len(done.running) == 2
    if sig == signal.SIGKILL:
        assert len(done.ended) == 2  # what a killed session leaves
        code, out = done.next_session  # the next session in the repository removes it
        assert code == 0, out
    else:
        assert done.ended == [str(r)]
    assert worktrees(r) == [str(r)]
    assert done.runner.leftovers() == []


def test_the_against_option_from_command_line_environment_or_ini(monkeypatch):
    """--mgpu-against beats PYTEST_MGPU_AGAINST beats ini mgpu_against; none: the lane is off."""
    from pathlib import Path

    from pytest_mgpu.settings import resolve_timing

    def reader(values):
        return lambda name: values.get(name)

    root = Path("/root")
    monkeypatch.delenv("PYTEST_MGPU_AGAINST", raising=False)
    assert resolve_timing(reader({}), reader({}), root).against is None
    assert resolve_timing(reader({}), reader({"mgpu_against": "main"}), root).against == "main"
    monkeypatch.setenv("PYTEST_MGPU_AGAINST", "origin/main")
    assert resolve_timing(reader({}), reader({"mgpu_against": "main"}), root).against == "origin/main"
    assert resolve_timing(reader({"mgpu_against": "HEAD~1"}), reader({"mgpu_against": "main"}), root).against == "HEAD~1"
    monkeypatch.setenv("PYTEST_MGPU_AGAINST", "")  # empty: not given
    assert resolve_timing(reader({}), reader({}), root).against is None


def test_a_base_whose_code_raises_is_reported_not_failed(pytester, repo):
    """REV's step raises: the row says "base failed" with REV's error, and the change's test passes."""
    r, _ = repo
    (r / "work.py").write_text(WORK.format(n=1).replace("    x = torch.randn(n, n)\n",
                                                        "    x = torch.randn(n, n)\n    raise ValueError('REV is broken')\n", 1))
    git(r, "commit", "-qam", "a broken base")
    (r / "work.py").write_text(WORK.format(n=1))
    result = pytester.runpytest("--mgpu-fallback=cpu", "--mgpu-against=HEAD", "test_perf.py")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_mm*vs HEAD@* +dirty*base failed*",
                                 "*test_mm::step_factory vs HEAD@*: base failed: HEAD@*'s code failed: *"])
    assert worktrees(r) == [str(r)]


ONCE = '''
import builtins
if getattr(builtins, "_mgpu_test_work_loaded", False):  # as a module registering a global name would
    raise RuntimeError("work was already imported in this process")
builtins._mgpu_test_work_loaded = True
'''


def test_code_that_cannot_be_imported_twice_is_measured_without_the_swap(pytester, repo):
    """The lane's sets swap roles, so a rank imports both revisions of a module: one that refuses a
    second import in the same process is measured again on new sets that keep their roles, and the
    row says so (its verdict stands, with the caveat), instead of failing or blaming REV."""
    r, _ = repo
    (r / "work.py").write_text(WORK.format(n=1) + ONCE)
    git(r, "commit", "-qam", "a module that refuses a second import")
    (r / "work.py").write_text(WORK.format(n=6) + ONCE)
    result = pytester.runpytest("--mgpu-fallback=cpu", "--mgpu-against=HEAD", "--mgpu-report=out.json", "test_perf.py")
    doc = json.loads((r / "out.json").read_text())
    v = next(row for row in doc["rows"] if row["lane"] == "revision")["verdict"]
    assert v["status"] in ("slower", "unstable"), v  # 6x the work, judged
    assert "measured without swapping the sets of ranks" in v["note"] and "already imported" in v["note"], v
    assert "base failed" not in result.stdout.str()
    assert worktrees(r) == [str(r)]


def test_a_benchmark_whose_imported_code_is_revs_is_unchanged_after_one_block(pytester, repo):
    """Only a file its ranks never import changed: the lane stops after its first block and the row is
    "unchanged" (a pass, its pairs shown, not judged), saying what was compared. A change to the
    imported file is measured in full (the first test of this file)."""
    r, _ = repo
    (r / "helper.py").write_text("def unused():\n    return 1\n")  # untracked, never imported
    (r / "NOTES.md").write_text("docs\n")
    result = pytester.runpytest("--mgpu-fallback=cpu", "--mgpu-against=HEAD", "--mgpu-report=out.json",
                                "--mgpu-structure=check", "test_perf.py")  # structure judged without goldens too
    result.assert_outcomes(passed=1)
    doc = json.loads((r / "out.json").read_text())
    (m,) = doc["measurements"]
    v = m["revision"]["verdict"]
    assert v["status"] == "unchanged" and set(m["revision"]["pairs_block"]) == {0}, v
    assert v["note"].startswith("the 1 file(s) of the repository its ranks imported are the same at HEAD@")
    assert v["note"].endswith("(1 Python file(s) differ, none of them imported; 1 file(s) no step reads differ "
                              "(documentation, pytest-mgpu's own))")  # NOTES.md
    assert m["lane_only"] and m["samples_s"]
    (call,) = doc["structure"]  # recorded while the head set up in the first block
    assert call["call"] == "benchmark step_factory" and call["status"] == "new", call
    result.stdout.fnmatch_lines(["*test_mm*vs HEAD@* +dirty*unchanged*"])
    assert worktrees(r) == [str(r)]
