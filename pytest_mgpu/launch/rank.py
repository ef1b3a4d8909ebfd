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
from typing import Optional

from .._context import RankContext, set_rank_context
from .protocol import RankOutcome, RankTask

STACK_SIGNAL = signal.SIGUSR1
_PR_SET_PDEATHSIG = 1


def _release_forkserver() -> None:
    """Drop the forkserver's keep-alive pipe that multiprocessing hands every child.

    The forkserver only exits once every holder of that pipe is gone; ranks that hold it keep it
    alive after the test process dies, and it keeps them alive through PDEATHSIG: a cycle of orphans.
    """
    try:
        from multiprocessing import forkserver

        fs = forkserver._forkserver
        if fs._forkserver_alive_fd is not None:
            os.close(fs._forkserver_alive_fd)
        fs._forkserver_alive_fd = None
        fs._forkserver_address = None  # a forkserver the user's code needs starts afresh
        fs._forkserver_pid = None
    except Exception:
        pass


def _watch_launcher(launcher_pid: int) -> None:
    """End this rank and its children as soon as the test process is gone, however it died."""
    import threading

    def watch():
        try:
            fd = os.pidfd_open(launcher_pid)
        except (AttributeError, OSError):
            return  # no pidfd (old kernel): PDEATHSIG and the launcher's kill still apply
        import select

        select.select([fd], [], [])
        try:
            os.killpg(0, signal.SIGKILL)
        finally:
            os._exit(70)

    if os.getppid() == 1 or not _alive(launcher_pid):
        os._exit(70)
    threading.Thread(target=watch, name="mgpu-launcher-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _detach(log_path: str, launcher_pid: int) -> None:
    """Own process group (so the whole tree can be killed), die with the parent, log to a file."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # not Linux: the launcher still kills the tree explicitly
        pass
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
    # request when the rank hangs.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(STACK_SIGNAL, file=sys.stderr, all_threads=True, chain=False)


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % (2**32))
    except ImportError:
        pass


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the user's frames on: the bootstrap's own frames say nothing."""
    tb = exc.__traceback__
    here = os.path.abspath(__file__)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == here:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _error(task: RankTask, exc: BaseException, phase: str) -> RankOutcome:
    return RankOutcome(
        rank=task.rank,
        ok=False,
        exc_type=f"{type(exc).__module__}.{type(exc).__qualname__}".replace("builtins.", ""),
        exc_message=str(exc),
        traceback=_user_traceback(exc),
        phase=phase,
    )


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
            devices=task.devices,
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


def run_call(task: RankTask) -> RankOutcome:
    """Import the user's function, unpickle its arguments, run it; never raises."""
    t0 = time.perf_counter()
    try:
        fn = task.fn.resolve()
        args, kwargs = pickle.loads(task.payload)
    except BaseException as exc:
        return _error(task, exc, "import")
    try:
        value = _to_cpu(fn(*args, **kwargs))
    except BaseException as exc:
        out = _error(task, exc, "run")
        out.run_s = time.perf_counter() - t0
        return out
    return RankOutcome(rank=task.rank, ok=True, value=value, run_s=time.perf_counter() - t0)


def send_outcome(conn, outcome: RankOutcome) -> None:
    try:
        data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        data = pickle.dumps(
            RankOutcome(
                rank=outcome.rank,
                ok=False,
                exc_type="TypeError",
                exc_message=(
                    f"the value returned by rank {outcome.rank} cannot be pickled ({exc}); "
                    "return tensors, numbers, strings or containers of them"
                ),
                phase="return",
            )
        )
    conn.send_bytes(data)


def rank_main(task: RankTask, conn) -> None:
    """Entry point of a fresh rank process (target of the forkserver Process)."""
    _detach(task.log_path, task.launcher_pid)
    t0 = time.perf_counter()
    try:
        init_rank(task)
    except BaseException as exc:
        send_outcome(conn, _error(task, exc, "init"))
        sys.stdout.flush()
        os._exit(3)
    init_s = time.perf_counter() - t0
    send_outcome(conn, RankOutcome(rank=task.rank, ok=True, ready=True, init_s=init_s))
    outcome = run_call(task)
    outcome.init_s = init_s
    send_outcome(conn, outcome)
    sys.stdout.flush()
    sys.stderr.flush()
    if outcome.ok:
        import torch.distributed as dist

        try:
            dist.destroy_process_group()
        except Exception:
            pass
    # Skip interpreter teardown: atexit handlers of torch and user code can block on dead peers.
    os._exit(0 if outcome.ok else 1)
