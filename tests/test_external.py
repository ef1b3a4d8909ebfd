"""pytest inside ranks started by torchrun (and srun): real torchrun jobs on this machine, one node and
two nodes over loopback; a failure and a hang on one rank end the whole job, and nothing is left running.

Each torchrun start costs several seconds here (an agent and one pytest per rank, each importing torch),
so every job checks several things at once, and the module's independent jobs (one node, two nodes, a
hang, srun tasks) start together in the fixture `launched`; each test reads its own job. The fast checks at the end exercise detection, agreement
and the store-based control plane in-process, on a real TCPStore.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as tdist

from pytest_mgpu.launch.control import ControlPlane, Post, WorldBroken
from pytest_mgpu.launch.external import (
    ExternalError,
    PhaseRecord,
    detect,
    first_host,
    merge,
)
from tests.ahead import ahead
from tests.conftest import SESSION_TOKEN, UNUSED_PLUGINS, base_env, processes_with_token, wait_for_no_processes

HARD_TIMEOUT_S = 150  # a job that does not end by itself fails the test instead of hanging CI
# Every rank is a pytest: leave out plugins these runs do not use (about 1 s of CPU per rank here).
PYTEST = ("-m", "pytest", "-p", "no:cacheprovider", *UNUSED_PLUGINS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """torchrun (or srun-like) jobs in a pytester directory, each process tagged to count leftovers."""

    def __init__(self, path: Path):
        self.path = path
        self.token = f"{SESSION_TOKEN}-ext-{uuid.uuid4().hex}"

    def env(self, **extra) -> dict:
        env = {k: v for k, v in base_env().items()
               if not k.startswith(("PYTEST_XDIST", "PYTEST_MGPU", "TORCHELASTIC", "SLURM_"))
               and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        env.update(MGPU_TEST_TOKEN=self.token, PYTHONUNBUFFERED="1", **extra)
        return env

    def start(self, cmd, **env) -> subprocess.Popen:
        return subprocess.Popen(cmd, cwd=str(self.path), env=self.env(**env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def torchrun(self, *launcher_args, pytest_args=()) -> list:
        return [sys.executable, "-m", "torch.distributed.run", *launcher_args, *PYTEST,
                "--mgpu-rank-logs", str(self.path / "rank-logs"), *pytest_args]

    def wait(self, procs, timeout: float = HARD_TIMEOUT_S):
        """(returncodes, outputs) of processes started together; kills them all if one overstays."""
        results = [None] * len(procs)

        def reader(i, p):
            results[i] = p.communicate()[0]

        threads = [threading.Thread(target=reader, args=(i, p)) for i, p in enumerate(procs)]
        for t in threads:
            t.start()
        end = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        if any(t.is_alive() for t in threads):
            self.kill(procs)
            for t in threads:
                t.join(10)
            raise AssertionError(f"the job did not end within {timeout}s:\n" + "\n----\n".join(map(str, results)))
        return [p.returncode for p in procs], results

    def kill(self, procs=()):
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in processes_with_token(self.token):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def leftovers(self):
        return wait_for_no_processes(self.token, 15.0)


@pytest.fixture
def job(pytester):
    j = Job(pytester.path)
    yield j
    j.kill()  # never leave anything behind, even when the test failed


@dataclass
class Ended:
    """One of the module's jobs that ended: its processes' return codes and outputs, in start order."""
    job: Job
    rcs: list
    outs: list


# each job of `launched`: its files, and the commands of its processes (a function of the Job)
def _one_node(j: Job):
    return [j.torchrun("--standalone", "--nproc_per_node=2",
                       pytest_args=("-rs", "--mgpu-fallback=cpu", "test_one_node.py"))], {}


def _two_nodes(j: Job):
    port, run_id = free_port(), uuid.uuid4().hex[:8]
    return [j.torchrun("--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                       f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={run_id}",
                       "--rdzv_conf=join_timeout=60",
                       pytest_args=("-rs", "--mgpu-fallback=cpu", "test_four.py"))] * 2, {}


def _hang(j: Job):
    return [j.torchrun("--standalone", "--nproc_per_node=2",
                       pytest_args=("--mgpu-fallback=cpu", "test_hang.py"))], {}


def _srun(j: Job):
    port = free_port()
    cmd = [sys.executable, *PYTEST, "--mgpu-rank-logs", "logs", "test_two.py"]
    return [cmd, cmd], {"env_of": [slurm_env(r, port) for r in range(2)]}


@pytest.fixture(scope="module")
def launched(lane):
    """The module's launcher jobs (below), run ahead of its tests."""
    yield from lane.take(launched_jobs)


@ahead("launched")
def launched_jobs(tmp_path_factory):
    """The module's independent launcher jobs, started at once so that their start-ups and limits overlap:
    name -> Ended (or the AssertionError of a job that did not end in time, raised by the test that reads
    it). Each job has its own folder and token, so each test still counts only its own leftovers."""
    files = {"one_node": {"test_one_node.py": ONE_NODE}, "two_nodes": {"test_four.py": FOUR},
             "hang": {"test_hang.py": HANG}, "srun": {"test_two.py": SRUN_TESTS, "conftest.py": SRUN_CONFTEST}}
    commands = {"one_node": _one_node, "two_nodes": _two_nodes, "hang": _hang, "srun": _srun}
    jobs, procs, ended = {}, {}, {}
    try:
        for name, texts in files.items():
            j = jobs[name] = Job(tmp_path_factory.mktemp(name))
            for file, text in texts.items():
                (j.path / file).write_text(text)
            cmds, extra = commands[name](j)
            envs = extra.get("env_of", [{}] * len(cmds))
            procs[name] = [j.start(cmd, **env) for cmd, env in zip(cmds, envs)]

        def wait(name: str) -> None:
            try:
                ended[name] = Ended(jobs[name], *jobs[name].wait(procs[name]))
            except AssertionError as e:
                ended[name] = e

        threads = [threading.Thread(target=wait, args=(name,), daemon=True) for name in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        yield ended
    finally:
        for name, j in jobs.items():  # never leave anything behind, even when a test failed
            j.kill(procs.get(name, ()))


def ended_job(launched, name: str) -> Ended:
    e = launched[name]
    if isinstance(e, BaseException):
        raise e
    return e


def one_summary(out: str) -> str:
    """The job's one summary line; more than one would mean more than one rank reported."""
    lines = re.findall(r"^=+ (.*(?:passed|failed|skipped|no tests ran).* in [\d.]+s.*) =+$", out, re.M)
    assert len(lines) == 1, f"expected one report (rank 0's), found {len(lines)}:\n{out}"
    return lines[0]


ONE_NODE = """
import os, pytest, torch, torch.distributed as tdist
import pytest_mgpu

def gather_ranks():
    t = torch.tensor([float(tdist.get_rank() + 1)])
    tdist.all_reduce(t)
    ctx = pytest_mgpu.rank_context()
    return (ctx.rank, ctx.local_rank, ctx.world_size, t.item(), os.getpid())

def single():
    ctx = pytest_mgpu.rank_context()
    return (ctx.rank, ctx.world_size, tdist.get_rank())

def raise_after_collective(bad):
    t = torch.ones(1)
    tdist.all_reduce(t)
    print(f"rank {tdist.get_rank()} was here")
    if tdist.get_rank() == bad:
        raise ValueError(f"rank {bad} disagrees")
    return t

def raise_before_collective(bad):
    if tdist.get_rank() == bad:
        raise RuntimeError(f"rank {bad} fails before the collective")
    t = torch.ones(1)
    tdist.all_reduce(t)         # the other rank waits here for the one that failed
    return t

@pytest_mgpu.world_sizes(1, 2, 4)
def test_gathered(dist):
    out = dist.run(gather_ranks)
    assert [o[:4] for o in out] == [(0, 0, 2, 3.0), (1, 1, 2, 3.0)]
    assert out[int(os.environ["RANK"])][4] == os.getpid()   # this rank ran its own part
    assert dist.backend == "gloo" and dist.emulated

@pytest.mark.gpu2
def test_run_single(dist):
    assert dist.run_single(single) == (0, 1, 0)

@pytest.mark.skipif(os.environ["RANK"] == "1", reason="rank 1 does not want this")
def test_skipped_on_one_rank():
    pass

@pytest.mark.gpu2
def test_fails_on_one_rank(dist):
    dist.run(raise_after_collective, 1)

def test_body_fails_on_one_rank():
    assert os.environ["RANK"] != "1", "the body failed on rank 1"

@pytest.mark.gpu2
def test_skips_before_dist_run_on_one_rank(dist):
    if os.environ["RANK"] == "1":
        pytest.skip("rank 1 leaves before dist.run")
    dist.run(gather_ranks)

def test_still_running():
    pass

@pytest.mark.gpu2
def test_stuck_failure_ends_the_job(dist):
    dist.run(raise_before_collective, 0, timeout=4)

def test_never_runs():
    pass
"""


def test_torchrun_one_node(launched):
    """torchrun --standalone --nproc_per_node=2 -m pytest: the plugin joins the job, dist.run gathers
    every rank's value; skips and failures on one rank become the outcome on both; a failure that leaves
    a rank inside a collective ends the job, reported by the surviving rank with the stuck one's stack."""
    e = ended_job(launched, "one_node")
    (rc,), (out,), job = e.rcs, e.outs, e.job
    assert rc != 0, out
    summary = one_summary(out)
    assert "4 failed, 3 passed, 3 skipped" in summary, out
    # a test of another world size: skipped with one reason naming the job's size
    assert "needs 1 rank(s), this torchrun job has 2" in out and "needs 4 rank(s)" in out, out
    assert re.search(r"SKIPPED \[1\] test_one_node.py:\d+: on rank\(s\) 1 of 2: rank 1 does not want this",
                     out), out
    # a failure on one rank fails the test on every rank, naming the rank and its traceback
    assert "rank 1 raised ValueError: rank 1 disagrees" in out, out
    assert "what rank 1 captured (call)" in out and "rank 1 was here" in out, out  # its output, too
    assert "call failed on rank(s) 1 of 2 (passed here, on rank 0): AssertionError: the body failed on rank 1" \
        in out, out
    assert "rank 1 did not enter this dist.run" in out, out
    # ... and nobody was left waiting: test_still_running, after them, is one of the 3 passed
    # the stuck failure: rank 1 waits in all_reduce for rank 0, which failed; the job ends
    assert "rank 0 raised RuntimeError: rank 0 fails before the collective" in out, out
    assert "rank 1 was still running after another rank failed" in out, out
    assert "[mgpu rank 1] ending this rank" in out and "tdist.all_reduce(t)" in out, out
    assert "Interrupted: the torchrun job ends" in out, out
    assert "test_never_runs" not in out, out
    assert job.leftovers() == []


FOUR = """
import os, pytest, torch, torch.distributed as tdist
import pytest_mgpu

def where():
    t = torch.tensor([float(tdist.get_rank())])
    tdist.all_reduce(t)
    ctx = pytest_mgpu.rank_context()
    return (ctx.rank, ctx.local_rank, int(os.environ["GROUP_RANK"]), t.item())

@pytest.mark.gpu4
def test_four_ranks_on_two_nodes(dist):
    assert dist.run(where) == [(0, 0, 0, 6.0), (1, 1, 0, 6.0), (2, 0, 1, 6.0), (3, 1, 1, 6.0)]

@pytest.mark.gpu2
def test_two_ranks(dist):
    dist.run(where)
"""


def test_torchrun_two_nodes(launched):
    """Two torchrun invocations on this machine acting as two nodes (c10d rendezvous on 127.0.0.1)
    run a 4-rank test; only rank 0 (on node 0) prints the report."""
    e = ended_job(launched, "two_nodes")
    rcs, outs, job = e.rcs, e.outs, e.job
    both = "\n".join(outs)
    assert rcs == [0, 0], both
    assert "1 passed, 1 skipped" in one_summary(both), both
    assert "needs 2 rank(s), this torchrun job has 4" in both, both
    assert job.leftovers() == []


HANG = """
import time, pytest, torch.distributed as tdist

def hang_on(bad):
    if tdist.get_rank() == bad:
        time.sleep(600)
    return tdist.get_rank()

@pytest.mark.gpu2
def test_hang(dist):
    dist.run(hang_on, 0, timeout=3)

def test_never_runs():
    pass
"""


def test_torchrun_hang_on_one_rank_ends_the_job(launched):
    """A rank that hangs (rank 0 here) is named with its stack in the report, prints its stack itself, and
    the whole job ends long before the 300 s default timeout. With rank 0 gone, rank 1 reports."""
    e = ended_job(launched, "hang")
    (rc,), (out,), job = e.rcs, e.outs, e.job
    assert rc != 0, out
    assert "1 failed" in one_summary(out), out
    assert ("rank 0 did not finish within 3s (hung; the limit set by dist.run(timeout=3)): blocked outside any "
            "collective, ") in out, out  # from what rank 0 said of itself before it ended
    assert "time.sleep(600)" in out, out
    assert "[mgpu rank 0] ending this rank" in out, out
    assert "rank 0 was lost: rank 1 reports from here" in out, out
    assert "test_never_runs" not in out, out
    assert job.leftovers() == []


def slurm_env(rank: int, port: int, ntasks: int = 2) -> dict:
    return dict(SLURM_PROCID=str(rank), SLURM_NTASKS=str(ntasks), SLURM_STEP_ID="0", SLURM_LOCALID=str(rank),
                SLURM_NODEID="0", SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="localhost",
                SLURM_STEP_TASKS_PER_NODE=str(ntasks), MASTER_PORT=str(port))


SRUN_CONFTEST = """
import os
def pytest_collection_modifyitems(items):
    if os.environ["SLURM_PROCID"] == "1":
        items.reverse()
"""
SRUN_TESTS = "def test_a(): pass\ndef test_b(): pass\n"


def test_srun_ranks_collecting_different_tests_stop(launched):
    """Tasks of an srun step (the variables srun sets; rank 0 hosts the store) that collect different
    tests stop before running any, saying where the lists differ."""
    e = ended_job(launched, "srun")
    rcs, outs, job = e.rcs, e.outs, e.job
    assert rcs == [pytest.ExitCode.USAGE_ERROR] * 2, outs
    assert "the ranks collected different tests" in outs[0], outs
    assert "position 0: rank 0 has test_two.py::test_a, rank 1 has test_two.py::test_b" in outs[0], outs
    assert "passed" not in outs[0], outs
    assert job.leftovers() == []


def test_xdist_is_refused_in_a_launched_rank(job, pytester):
    pytester.makepyfile(test_x="def test_x(): pass\n")
    env = dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               TORCHELASTIC_RUN_ID="xdist-check")
    cmd = [sys.executable, *PYTEST, "-n", "2", "test_x.py"]
    (rc,), (out,) = job.wait([job.start(cmd, **env)], timeout=60)
    assert rc == pytest.ExitCode.USAGE_ERROR, out
    assert "pytest-xdist (-n/--dist) cannot run inside a torchrun job" in out, out


# -- in-process checks: detection, agreement, the control plane ------------------------------------
TORCHRUN_ENV = dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", GROUP_RANK="1",
                    MASTER_ADDR="node0", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="abc")


def test_detect_torchrun_and_srun():
    w = detect(TORCHRUN_ENV)
    assert (w.rank, w.world_size, w.local_rank, w.node_rank, w.launcher) == (3, 4, 1, 1, "torchrun")
    s = detect(dict(SLURM_PROCID="5", SLURM_NTASKS="8", SLURM_STEP_ID="0", SLURM_LOCALID="1", SLURM_NODEID="2",
                    SLURM_JOB_ID="9", SLURM_STEP_NODELIST="gpu[07-09,12],cpu1", SLURM_TASKS_PER_NODE="4(x2)"))
    assert (s.rank, s.world_size, s.local_rank, s.local_world_size, s.master_addr, s.launcher) == \
        (5, 8, 1, 4, "gpu07", "srun")
    # torchrun started by srun (one agent per node): torchrun's variables win
    assert detect({**TORCHRUN_ENV, "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"}).rank == 3


def test_detect_leaves_ordinary_runs_alone():
    assert detect({}) is None
    assert detect(TORCHRUN_ENV, mode="off") is None
    # an sbatch script is SLURM_PROCID=0 of the job, but no job step: not a rank
    assert detect(dict(SLURM_PROCID="0", SLURM_NTASKS="4", SLURM_JOB_ID="1")) is None
    # a process started from inside a joined rank (pytester, a subprocess) runs on its own
    assert detect({**TORCHRUN_ENV, "PYTEST_MGPU_JOINED": str(os.getpid() + 1)}) is None
    with pytest.raises(ExternalError, match="MASTER_ADDR, MASTER_PORT not"):
        detect(dict(RANK="0", WORLD_SIZE="2"))
    with pytest.raises(ExternalError, match="not started by torchrun or srun"):
        detect({}, mode="on")
    assert first_host("a1,b[1-2]") == "a1" and first_host("n[003-5]x") == "n003x"


def test_merge_failure_beats_skip_beats_pass():
    ok = PhaseRecord("passed")
    bad = PhaseRecord("failed", text="Traceback...\nValueError: x", crash="ValueError: x")
    skip = PhaseRecord("skipped", skip=("t.py", 3, "Skipped: no data"))
    v = merge(0, {0: ok, 1: bad, 2: skip}, "call")
    assert v.outcome == "failed" and v.message.startswith("call failed on rank(s) 1 of 3 (passed here, on rank 0)")
    assert "ValueError: x" in v.message
    noisy = PhaseRecord("failed", text=bad.text, crash=bad.crash, output="\n--- Captured stdout call ---\nhi")
    v = merge(0, {0: bad, 1: noisy}, "call")  # the same error: only what rank 1 printed is added
    assert v.message == "" and v.sections == [("mgpu: what rank 1 captured (call)", noisy.output)]
    v = merge(1, {0: ok, 1: bad}, "call")
    assert v.outcome == "failed" and v.message == "" and v.sections == []
    v = merge(0, {0: ok, 1: skip}, "setup")
    assert v.outcome == "skipped" and v.skip == ("t.py", 3, "Skipped: on rank(s) 1 of 2: no data")
    assert merge(1, {0: ok, 1: skip}, "setup").skip == v.skip  # one reason on every rank
    assert merge(0, {0: ok, 1: ok}, "call").outcome == "passed"


@pytest.fixture
def planes():
    """Control planes of a 3-rank 'job' on one real TCPStore, one client per rank (no monitor threads)."""
    server = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))

    def plane(rank):
        client = tdist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                                timeout=timedelta(seconds=30))
        return ControlPlane(tdist.PrefixStore("t/", client), rank, 3, say=lambda text: None, stack_wait_s=0.1)

    yield [plane(r) for r in range(3)]


def run_ranks(planes, work):
    """work(plane) in a thread per rank; returns each rank's result or exception."""
    got = {}

    def body(p):
        try:
            got[p.rank] = work(p)
        except Exception as exc:
            got[p.rank] = exc

    threads = [threading.Thread(target=body, args=(p,)) for p in planes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return got


def test_exchange_gathers_values_over_the_store_limit(planes):
    big = os.urandom(9 << 20)  # the store refuses single values over 8 MiB
    got = run_ranks(planes, lambda p: p.exchange("x", (p.rank, big if p.rank == 2 else b""), timeout_s=30))
    for r in range(3):
        assert [got[r][k].data[0] for k in range(3)] == [0, 1, 2]
        assert got[r][2].data[1] == big
    again = run_ranks(planes, lambda p: p.exchange("y", p.rank, timeout_s=30))
    assert all([again[r][k].data for k in range(3)] == [0, 1, 2] for r in range(3))


def test_exchange_names_the_rank_that_does_not_arrive(planes):
    got = run_ranks(planes[:2], lambda p: p.exchange("the end of t (call)", timeout_s=1.0))
    for r in (0, 1):
        assert isinstance(got[r], WorldBroken), got
        assert got[r].lost == (2,) or got[r].by_peer
    first = next(g for g in got.values() if not g.by_peer)
    assert "rank(s) 2 did not arrive at the end of t (call)" in str(first)
    assert planes[2]._store.check(["lost/2"])  # its monitor would post its stack and end it


def test_after_a_failure_the_others_get_a_grace_period(planes):
    def work(p):
        if p.rank == 2:
            return None  # stuck somewhere: never arrives
        return p.exchange("end", ok=p.rank != 1, timeout_s=60, grace_s=1.0)

    got = run_ranks(planes, work)
    first = next(g for g in (got[0], got[1]) if isinstance(g, WorldBroken) and not g.by_peer)
    assert "rank(s) 2 still busy" in str(first) and "after rank(s) 1 failed" in str(first)


def _comm_error(rank):
    from pytest_mgpu.launch.protocol import RankOutcome

    return RankOutcome(rank=rank, ok=False, exc_type="torch.distributed.DistBackendError",
                       exc_message="[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234")


def _launcher(rank):
    from types import SimpleNamespace

    from pytest_mgpu.launch.external import ExternalLauncher

    return ExternalLauncher(SimpleNamespace(rank=rank))


def test_a_lost_rank_that_sent_no_stack_is_the_cause_not_its_peers_connection_errors():
    """torchrun: rank 0 died in a collective; ranks 1, 2 report gloo's error first. Evidence, not
    arrival order: the rank that vanished without a stack is the cause."""
    from pytest_mgpu.launch.base import LaunchSpec

    wb = WorldBroken("rank(s) 0 still busy 10s after rank(s) 1, 2 failed", lost=(0,),
                     posts={r: Post(r, "end", False, _comm_error(r)) for r in (1, 2)}, stacks={})
    failure = _launcher(1)._failure(LaunchSpec(nprocs=3), wb, started=True)
    assert [p.rank for p in failure.primary()] == [0], failure.format()
    assert failure.problems[0].kind == "died" and failure.ranks == [0, 1, 2]
    assert "cause: rank(s) 0" in failure.format().splitlines()[0]


def test_a_lost_rank_waiting_in_a_collective_is_a_consequence_of_a_real_error():
    from pytest_mgpu.launch.protocol import RankOutcome
    from pytest_mgpu.launch.base import LaunchSpec

    stack = 'Current thread 0x1 (most recent call first):\n  File "/x/torch/distributed/distributed_c10d.py", line 9 in barrier'
    posts = {1: Post(1, "end", False, RankOutcome(rank=1, ok=False, exc_type="ValueError", exc_message="bad"))}
    wb = WorldBroken("rank(s) 0 still busy", lost=(0,), posts=posts, stacks={0: stack})
    failure = _launcher(1)._failure(LaunchSpec(nprocs=2), wb, started=True)
    assert [p.rank for p in failure.primary()] == [1], failure.format()
