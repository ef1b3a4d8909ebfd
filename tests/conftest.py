"""Shared helpers for the plugin's own tests (pytester runs real pytest sessions)."""
from __future__ import annotations

import dataclasses
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.ahead import Lane, ahead, needs_ahead

# pytester's in-process runs drop modules first imported inside them; torch's C extension cannot be
# imported twice in one process, so import it (and what the inner runs use) here, once.
import torch  # noqa: F401
import torch.distributed  # noqa: F401
import torchvision  # noqa: F401

# Hypothesis's pytest plugin (where it is installed) imports hypothesis at the end of every session, the
# in-process inner ones too, which then drop it: 74 modules imported again per pytester session, each
# assertion-rewritten again (pytest rewrites the packages of its plugins; where Python writes no bytecode
# files, as with PYTHONDONTWRITEBYTECODE, nothing of that is kept): about 0.8 s per session on 2 cores.
# Imported here, once, it stays.
try:
    import hypothesis.internal.observability  # noqa: F401
except ImportError:
    pass

# pytest ends every session, the in-process inner ones too, with five full garbage collections (its
# unraisable-exception check); over torch's and torchvision's objects they cost about 0.2 s each, once
# per pytester session here. Those objects live as long as the process: move them out of the collector's
# reach, so a collection only walks what the tests made.
gc.freeze()

# The test process computes in one intra-op thread. Its own work is small (in-process loops of small
# models, judgements), and it shares the 2 cores with the lane's sessions and the ranks: a parallel op
# then waits for a thread the scheduler gave away (an in-process minGPT loop of 6 steps took 0.37 s alone
# and 13-19 s in the whole run with two threads). The ranks set their own threads.
torch.set_num_threads(1)


def processes_with_token(token: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries ``token``: everything a pytest run
    started with that token in its environment left behind, however deep."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if token.encode() in env and state != "Z":
            found.append(int(entry))
    return found


def command_lines(pids: list[int]) -> dict[int, str]:
    """Each process's command line, or "" for one that ended meanwhile."""
    lines = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                lines[pid] = f.read().replace("\0", " ")
        except OSError:
            lines[pid] = ""
    return lines


def wait_for_no_processes(token: str, timeout: float = 10.0) -> list[int]:
    """Killed processes take a moment to be reaped; poll (bounded) until none is left."""
    end = time.monotonic() + timeout
    left = processes_with_token(token)
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = processes_with_token(token)
    return left


# Every token of this session starts with this one: what the lane (tests/ahead.py) left running at the
# session's end is found by it. The environment as the session started: a test's monkeypatched variables
# are not the lane's, which starts its subprocesses while that test runs.
SESSION_TOKEN = f"mgpu-test-{uuid.uuid4().hex[:12]}"
SESSION_ENV = dict(os.environ)


def base_env() -> dict:
    """The environment a subprocess of a test starts from: the test's (monkeypatched or not) in the main
    thread; the session's at its start in the lane's thread."""
    return dict(os.environ if threading.current_thread() is threading.main_thread() else SESSION_ENV)

# The plugins a test's own pytest subprocess never uses, left out of it: each costs CPU at every start
# (hypothesis's at the end of every session, anyio's and pytest-benchmark's at start-up), about 1-1.5 s
# of CPU per pytest on 2 cores, and a serial run of tests/ starts some 40 of them.
UNUSED_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:anyio", "-p", "no:benchmark")

INTERRUPTIBLE_PYTEST = ("import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
                        "sys.exit(pytest.console_main())")


class Subpytest:
    """Runs pytest in a subprocess tagged with a unique environment token, to count what it leaves."""

    def __init__(self, pytester: pytest.Pytester | None = None, path: Path | None = None):
        self.pytester = pytester
        self.path = path if path is not None else pytester.path
        self.token = f"{SESSION_TOKEN}-{uuid.uuid4().hex}"

    def env(self, **extra) -> dict:
        env = base_env()
        env.pop("PYTEST_XDIST_WORKER", None)
        env.pop("PYTEST_MGPU_FALLBACK", None)
        env["MGPU_TEST_TOKEN"] = self.token
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env

    def popen(self, *args, **env) -> subprocess.Popen:
        # Ctrl-C as in a terminal: a command started in the background by a non-interactive shell
        # (`cmd &`, nohup, some CI scripts) inherits SIGINT ignored, and Python then installs no
        # KeyboardInterrupt handler: the Ctrl-C tests failed in every run started that way.
        cmd = [sys.executable, "-c", INTERRUPTIBLE_PYTEST, "-p", "no:cacheprovider", *UNUSED_PLUGINS, *args]
        return subprocess.Popen(
            cmd,
            cwd=str(self.path),
            env=self.env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def run(self, *args, timeout: float = 240, **env) -> tuple[int, str]:
        p = self.popen(*args, **env)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            raise AssertionError(f"pytest subprocess did not end within {timeout}s:\n{out}")
        return p.returncode, out

    def leftovers(self, timeout: float = 10.0) -> list[int]:
        return wait_for_no_processes(self.token, timeout)


@dataclasses.dataclass
class Ended:
    """A pytest subprocess session that ended: its exit code, its output, and the processes carrying
    its token right when it ended (before any wait for them to be reaped), with their command lines, and
    the seconds from its start to its end."""
    rc: int
    out: str
    left: dict[int, str]
    wall: float = 0.0


def run_together(runs: list, timeout: float = 300) -> list[Ended]:
    """Several pytest subprocess sessions at once, each ``(Subpytest, args)`` or ``(Subpytest, args,
    env)``: their start-ups and waits (limits that must pass, ranks blocked on purpose) overlap instead
    of adding up. Returns how each ended, in order; a session past ``timeout`` is killed and fails the
    caller, naming it."""
    t0 = time.monotonic()
    procs = [run[0].popen(*run[1], **(run[2] if len(run) > 2 else {})) for run in runs]
    ended: list = [None] * len(runs)

    def wait(i: int) -> None:
        try:
            out, _ = procs[i].communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(procs[i].pid, signal.SIGKILL)
            out, _ = procs[i].communicate()
            ended[i] = AssertionError(f"pytest subprocess {' '.join(runs[i][1])} did not end within {timeout}s:\n{out}")
            return
        ended[i] = Ended(procs[i].returncode, out, command_lines(processes_with_token(runs[i][0].token)),
                         time.monotonic() - t0)

    threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in ended:
        if not isinstance(e, Ended):
            raise e if isinstance(e, BaseException) else AssertionError("a pytest subprocess was not waited for")
    return ended


def one_session(sp: Subpytest, args: tuple, timeout: float = 300, **env) -> tuple[Ended, list[int]]:
    """One pytest subprocess session: how it ended, and the processes it left (waited for, bounded);
    whatever is left is killed after."""
    try:
        (ended,) = run_together([(sp, args, env)], timeout=timeout)
        return ended, sp.leftovers()
    finally:
        for pid in processes_with_token(sp.token):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture(scope="session", autouse=True)
def one_forkserver(request):
    """This session's launcher, opened at its start as its first test with ``dist`` would open it. The
    forkserver is one per process, and an in-process pytester session stops it at its end unless a
    launcher of the process is still open; with this one open, every such session forks its ranks from
    the same forkserver instead of starting one (torch preloaded, about 2 s on 2 cores) and stopping it
    (about 1 s). Nothing starts here: the forkserver starts with the first ranks."""
    from pytest_mgpu.launch.spawn import preload_also
    from pytest_mgpu.plugin import SESSION_KEY

    preload_also(["torch._dynamo"])  # FSDP2's first fully_shard imports it: once here, not in every rank
    session = request.config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.launcher  # noqa: B018 (the property opens it)
    yield


@pytest.fixture
def subpytest(pytester) -> Subpytest:
    sp = Subpytest(pytester)
    yield sp
    for pid in processes_with_token(sp.token):  # never leave anything behind, even on failure
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture
def no_gpus(monkeypatch):
    """This machine seen as a runner without GPUs, whatever it has: for the tests of what pytest-mgpu
    does there (skips, CPU fallback, --mgpu-require-gpus), run in-process by pytester."""
    from pytest_mgpu import session
    from pytest_mgpu.devices import Hardware, usable_cpus

    monkeypatch.setattr(session, "detect_hardware", lambda: Hardware((), (), usable_cpus()))


def _ahead() -> bool:
    return os.environ.get("MGPU_TESTS_AHEAD", "1") != "0" and "PYTEST_XDIST_WORKER" not in os.environ


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The modules whose tests read work of the lane run last (each whole, in its place among them):
    the lane then does that work while the other tests run, and no test waits for it."""
    if _ahead():
        late = {item.module.__name__ for item in items if getattr(item, "module", None) is not None and needs_ahead(item)}
        items[:] = sorted(items, key=lambda item: getattr(item, "module", None) is not None and item.module.__name__ in late)


@pytest.fixture(scope="session", autouse=True)
def lane(request, tmp_path_factory):
    """The subprocess sessions registered with ``@ahead`` (tests/ahead.py) that this session's tests
    need, run in the background from its start; ``MGPU_TESTS_AHEAD=0`` runs each when its fixture is
    first asked for instead (as do xdist workers: each would start every module's)."""
    # pytest makes its base temporary folder on first use, without a lock: made here, before the lane's
    # thread, a test's tmp_path and the lane's mktemp cannot each make one (mktemp then fails "not a
    # normalized and relative path": the second read of the base gets the other's)
    tmp_path_factory.getbasetemp()
    started = Lane(tmp_path_factory, list(request.session.items), _ahead())
    yield started

    def kill() -> None:
        for pid in processes_with_token(SESSION_TOKEN):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    started.close(kill)


@ahead("xdist_together", shared=True)
def xdist_session(tmp_path_factory):
    """The one pytest-xdist session of every part registered in tests/xdist_together.py (see there)."""
    from tests import xdist_together as together

    path = tmp_path_factory.mktemp("xdist_together")
    sp = Subpytest(path=path)
    recorded = {}
    for part in together.PARTS.values():
        if part.recorded_first is not None:
            (path / part.file).write_text(part.recorded_first)
            recorded[part.file] = sp.run("--mgpu-fallback=cpu", "--mgpu-save-baselines", part.file, timeout=300)
    for part in together.PARTS.values():
        (path / part.file).write_text(part.text)
    try:
        rc, out = sp.run(*together.ARGS, *together.PARTS, timeout=400)
        yield together.Together(path, rc, out, together.junit_cases(path / "junit.xml"),
                                together.read_report(path / "r.json"), sp.leftovers(), recorded)
    finally:
        for pid in processes_with_token(sp.token):  # never leave anything behind, even on failure
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture(scope="session")
def xdist_together(lane):
    """The one pytest-xdist session of every part registered in tests/xdist_together.py, run once per
    session, ahead of the tests that read it."""
    yield from lane.take(xdist_session)
