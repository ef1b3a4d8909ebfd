"""The code that runs inside a rank: detach, join the group, seed, run the user's function, report.

Runs in a child of the forkserver (torch already imported there). It never imports pytest.
"""
from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import random
import signal
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, List, Optional

from .._context import RankContext, set_rank_context, torch_devices
from . import flight
from .processes import alive, become_subreaper, descendants, end_descendants
from .protocol import RankOutcome, RankTask, safe_str, type_name
from .rank_coverage import RankCoverage

STACK_SIGNAL = signal.SIGUSR1
_PR_SET_PDEATHSIG = 1


def _release_forkserver() -> None:
    """Drop the forkserver's keep-alive pipe that multiprocessing hands every child.

    The forkserver only exits once every holder of that pipe is gone; ranks that hold it keep it
    alive after the test process dies, and it keeps them alive through PDEATHSIG: a cycle of orphans.
    """
    try:
        from multiprocessing import forkserver

        fs: Any = forkserver._forkserver  # private attributes, which typeshed does not declare
        if fs._forkserver_alive_fd is not None:
            os.close(fs._forkserver_alive_fd)
        fs._forkserver_alive_fd = None
        fs._forkserver_address = None  # a forkserver the user's code needs starts afresh
        fs._forkserver_pid = None
    except Exception:
        pass


def _watch_launcher(launcher_pid: int) -> None:
    """End this rank and everything below it as soon as the test process is gone, however it died.

    A thread waits on a pidfd of the test process. PDEATHSIG is only the fallback where there is no
    pidfd: a rank's parent is the forkserver, which exits the moment the test process dies, and a
    SIGKILL from PDEATHSIG then beat the watch to it, orphaning the rank's children (a child
    outlived a SIGKILLed pytest in 5 of 6 runs on a loaded machine)."""
    import threading

    if os.getppid() == 1 or not alive(launcher_pid):
        os._exit(70)
    try:
        fd = os.pidfd_open(launcher_pid)
    except (AttributeError, OSError):
        _set_pdeathsig()
        return

    def watch():
        import select

        select.select([fd], [], [])
        try:
            for child in descendants(os.getpid()):
                try:
                    os.kill(child, signal.SIGKILL)
                except OSError:
                    pass
            os.killpg(0, signal.SIGKILL)
        finally:
            os._exit(70)

    threading.Thread(target=watch, name="mgpu-launcher-watch", daemon=True).start()


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # not Linux: the launcher still kills the tree explicitly
        pass


def detach(log_path: str, launcher_pid: int) -> None:
    """Own process group (so the whole tree can be killed), subreaper of its descendants, dies with
    the test process, logs to a file."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    become_subreaper()
    _release_forkserver()
    _watch_launcher(launcher_pid)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    # Fatal signals (segfault, abort) print the Python stack; SIGUSR1 prints it on the launcher's
    # request when the rank hangs, and (chained) has the flight recorder's evidence written.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    flight.arm()
    faulthandler.register(STACK_SIGNAL, file=sys.stderr, all_threads=True, chain=True)


class _Seeded:
    """The seed this process last gave ``torch.manual_seed`` (module state: one rank per process)."""

    seed: Optional[int] = None


def _accelerator_up(torch) -> bool:
    """Whether an accelerator's generators exist (seeded directly) rather than wait in its lazy queue."""
    for name in ("cuda", "xpu", "mtia"):
        mod = getattr(torch, name, None)
        is_initialized = getattr(mod, "is_initialized", None)
        if callable(is_initialized) and is_initialized():
            return True
    # a registered custom device (torch's own test for seeding one): seeded directly each time
    name = getattr(torch._C, "_get_privateuse1_backend_name", lambda: "")()
    return bool(name) and hasattr(torch, name)


def seed_torch(seed: int) -> None:
    """``torch.manual_seed(seed)``, at the cost of the CPU generator alone where the rest is already so.

    On a machine without an initialized accelerator, ``torch.manual_seed`` queues the seed for CUDA,
    XPU and MTIA, each with a formatted stack (~0.35 ms a call, most of a warm rank's seeding). A warm
    rank seeded with the same value before holds those queued seeds already: only the CPU generator
    is set again. Once an accelerator is up, or for a new seed, it is the full call."""
    import torch

    if seed == _Seeded.seed and not _accelerator_up(torch):
        torch.default_generator.manual_seed(seed)
        return
    torch.manual_seed(seed)
    _Seeded.seed = seed


def seed_everything(seed: int) -> None:
    random.seed(seed)
    seed_torch(seed)
    try:
        import numpy

        numpy.random.seed(seed % (2**32))
    except ImportError:
        pass


BOOTSTRAP_FILES = {os.path.abspath(__file__)}
"""Files whose frames lead a rank's traceback and say nothing to the user: this bootstrap, and those a
call's own entry point adds (``hide_frames_of``: the simulated tier's rank)."""


def hide_frames_of(path: str) -> None:
    BOOTSTRAP_FILES.add(os.path.abspath(path))


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the user's frames on: the bootstrap's own frames say nothing."""
    tb = exc.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in BOOTSTRAP_FILES:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def error_outcome(task: RankTask, exc: BaseException, phase: str) -> RankOutcome:
    """An exception as text: its type, message (even when its ``__str__`` raises) and traceback; the
    exception object itself never crosses, as it may not unpickle in the test process."""
    try:
        tb = _user_traceback(exc)
    except Exception:
        tb = ""
    return RankOutcome(rank=task.rank, ok=False, exc_type=type_name(exc), exc_message=safe_str(exc),
                       traceback=tb, phase=phase)


def _to_cpu(value):
    import torch
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.detach().cpu(), value)


def prepare_rank(task: RankTask) -> None:
    """Environment, threads, seed, device and the RankContext: what every call starts from."""
    import torch

    os.environ.update(task.env)
    os.environ.update(
        RANK=str(task.rank),
        WORLD_SIZE=str(task.world_size),
        LOCAL_RANK=str(task.local_rank),
        LOCAL_WORLD_SIZE=str(task.world_size),
        MASTER_ADDR=task.store_host,
        MASTER_PORT=str(task.store_port),
    )
    torch.set_num_threads(max(1, task.threads))
    seed_everything(task.seed + (task.rank if task.per_rank_seed else 0))
    if task.device_type == "cuda":
        torch.cuda.set_device(task.device_index)
    set_rank_context(
        RankContext(
            rank=task.rank,
            world_size=task.world_size,
            local_rank=task.local_rank,
            device_type=task.device_type,
            device_index=task.device_index,
            backend=task.backend,
            emulated=task.emulated,
            seed=task.seed,
            devices=torch_devices(task.device_type, task.devices),
        )
    )


def join_group(task: RankTask, store=None, prefix: Optional[str] = None):
    """Init the default process group through the test process's TCPStore; returns the store."""
    import torch.distributed as dist

    if store is None:
        store = dist.TCPStore(
            task.store_host,
            task.store_port,
            is_master=False,
            timeout=timedelta(seconds=task.pg_timeout_s),
            wait_for_workers=False,
        )
    dist.init_process_group(
        task.backend,
        store=dist.PrefixStore(prefix or task.store_prefix, store),
        rank=task.rank,
        world_size=task.world_size,
        timeout=timedelta(seconds=task.pg_timeout_s),
    )
    return store


def init_rank(task: RankTask):
    prepare_rank(task)
    return join_group(task)


JOINED_KEY = "pytest_mgpu/joined"


def count_joined(store, task: RankTask) -> None:
    """Tell the peers this rank's ``init_process_group`` has returned (see ``wait_for_peers``)."""
    import torch.distributed as dist

    dist.PrefixStore(task.store_prefix, store).add(JOINED_KEY, 1)


def wait_for_peers(store, task: RankTask) -> None:
    """Before a fresh rank closes its sockets, wait until every peer has joined the group.

    gloo's ``init_process_group`` can return on one rank while a peer is still inside
    ``connectFullMesh``; a rank whose function returned at once then exited, and the peer failed with
    "Connection closed by peer" while joining: 3 of about 430 fresh 2-rank calls of a function without
    collectives on the loaded 2-core machine. Bounded by the group's own timeout; a store that is gone
    (the test process ended) ends the wait."""
    if task.world_size <= 1:
        return
    import torch.distributed as dist

    end = time.monotonic() + task.pg_timeout_s
    delay = 0.001
    try:
        joined = dist.PrefixStore(task.store_prefix, store)
        while joined.add(JOINED_KEY, 0) < task.world_size and time.monotonic() < end:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    except Exception:
        pass


def starts_itself(fn):
    """Mark a rank-side function that prepares the rank further (a simulation joins its fake group and
    imports the user's module) and calls ``flight.running()`` when the user's function starts."""
    fn.starts_itself = True
    return fn


def run_call(task: RankTask) -> RankOutcome:
    """Import the user's function, unpickle its arguments, run it; never raises."""
    t0 = time.perf_counter()
    try:
        assert task.fn is not None  # a call's task names its function (only warm workers' lack one)
        fn = task.fn.resolve()
        args, kwargs = pickle.loads(task.payload)
    except BaseException as exc:
        return error_outcome(task, exc, "import")
    if not getattr(fn, "starts_itself", False):
        flight.running()
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:
        flight.finished()
        out = error_outcome(task, exc, "run")
        out.run_s = time.perf_counter() - t0
        out.collectives = flight.collectives()
        return out
    flight.finished()
    run_s = time.perf_counter() - t0
    last = flight.last_collectives()
    try:
        value = _to_cpu(value)
    except Exception as exc:  # a meta tensor has no data: say so, without the plugin's own frames
        return RankOutcome(rank=task.rank, ok=False, exc_type=type_name(exc), phase="return", run_s=run_s,
                           exc_message=f"its return value ({type_name(value)}) could not be copied to the "
                           f"CPU: {safe_str(exc)}")
    return RankOutcome(rank=task.rank, ok=True, value=value, run_s=run_s, last_collectives=last)


def send_outcome(conn, outcome: RankOutcome) -> None:
    """Send an outcome; its value travels pickled apart, so the test process can rebuild it under a
    guard that names this rank and the value's type."""
    if outcome.ok and not outcome.ready:
        try:
            outcome.value_bytes = pickle.dumps(outcome.value, protocol=pickle.HIGHEST_PROTOCOL)
            outcome.value_type = type_name(outcome.value)
            outcome.value = None
        except Exception as exc:
            outcome = RankOutcome(
                rank=outcome.rank, ok=False, exc_type="TypeError", phase="return",
                exc_message=(f"the value returned by rank {outcome.rank} ({type_name(outcome.value)}) cannot "
                             f"be pickled ({safe_str(exc)}); return tensors, numbers, strings or containers "
                             "of them"),
            )
    conn.send_bytes(pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL))


def leftover_note(rank: int, commands) -> List[str]:
    """The report line for the processes a call left running (ended by ``end_descendants``)."""
    if not commands:
        return []
    shown = "; ".join(c[:120] for c in commands[:5]) + ("; ..." if len(commands) > 5 else "")
    what = "1 child process" if len(commands) == 1 else f"{len(commands)} child processes"
    return [f"rank {rank} left {what} running: {shown}; ended"]


def rank_main(task: RankTask, conn) -> None:
    """Entry point of a fresh rank process (target of the forkserver Process)."""
    flight.begin(task.log_path, task.backend)
    detach(task.log_path, task.launcher_pid)
    t0 = time.perf_counter()
    try:
        store = init_rank(task)
        count_joined(store, task)
    except BaseException as exc:
        send_outcome(conn, error_outcome(task, exc, "init"))
        sys.stdout.flush()
        os._exit(3)
    init_s = time.perf_counter() - t0
    # Under pytest --cov only; after joining, so the group forms as fast as without it. Saved before
    # the outcome goes: the launcher may kill the rank as soon as it has it.
    coverage = RankCoverage()
    coverage.resume(task.env)
    # "ready" once the user's module is imported: the call's limit is not charged for a slow import
    flight.when_running(lambda: send_outcome(conn, RankOutcome(rank=task.rank, ok=True, ready=True, init_s=init_s)))
    outcome = run_call(task)
    outcome.init_s = init_s
    if outcome.ok:  # this process is gone before a peer's failure is known: its record goes now
        outcome.collectives = flight.collectives()
    outcome.notes = leftover_note(task.rank, end_descendants())
    coverage.pause()
    send_outcome(conn, outcome)
    sys.stdout.flush()
    sys.stderr.flush()
    wait_for_peers(store, task)
    if outcome.ok:
        import torch.distributed as dist

        try:
            dist.destroy_process_group()
        except Exception:
            pass
    # Skip interpreter teardown: atexit handlers of torch and user code can block on dead peers.
    os._exit(0 if outcome.ok else 1)
