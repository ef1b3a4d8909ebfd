"""The simulated rank: the call a fresh rank process runs in place of the user's function.

The launcher (``launch.spawn``) starts it as a one-rank call: the process detaches, is seeded and
joins a one-rank gloo group exactly as a real rank does (``launch.rank``), and reports, hangs and
dies through the same pipes. Here that group is replaced by the fake process group of the size asked
for, the rank's identity (``rank_context()``, ``RANK``/``WORLD_SIZE``, the seed) is set to the
simulated rank's as ``prepare_rank`` sets a real rank's, and the user's function runs under
``Instruments``.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass

from ..launch.protocol import FnRef, RankTask, safe_str, type_name
from ..launch import flight
from ..launch.rank import hide_frames_of, prepare_rank, starts_itself
from .result import SimRecord

hide_frames_of(__file__)  # a failure's traceback starts at the user's own frame


@dataclass(frozen=True)
class SimCall:
    """The function to simulate, and which rank of which world it plays."""

    fn: FnRef
    payload: bytes  # the pickled (args, kwargs)
    world_size: int
    rank: int
    seed: int = 0
    per_rank_seed: bool = False


def simulated_task(call: SimCall, threads: int) -> RankTask:
    """The ``RankTask`` a real rank ``call.rank`` of ``call.world_size`` would get, on cpu."""
    return RankTask(
        rank=call.rank, world_size=call.world_size, local_rank=call.rank, backend="fake", device_type="cpu",
        device_index=None, devices=(), emulated=True, store_host=os.environ.get("MASTER_ADDR", ""),
        store_port=int(os.environ.get("MASTER_PORT", "0") or 0), store_prefix="", seed=call.seed,
        per_rank_seed=call.per_rank_seed, threads=threads, fn=call.fn, payload=call.payload, log_path="",
        pg_timeout_s=0.0,
    )


@starts_itself
def run_simulated(call: SimCall) -> SimRecord:
    """Runs in the fresh rank process: become rank ``call.rank`` of a fake group, run, measure."""
    import time
    import warnings

    import torch
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from .instruments import Instruments

    if tdist.is_initialized():
        tdist.destroy_process_group()  # the launcher's one-rank gloo group
    prepare_rank(simulated_task(call, torch.get_num_threads()))
    tdist.init_process_group("fake", store=FakeStore(), rank=call.rank, world_size=call.world_size)
    # every mesh of the simulated tier is a CPU mesh: torch's warning about random ops there says
    # nothing about the user's code (the simulated figures do not depend on the random values)
    warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support")
    fn = call.fn.resolve()
    args, kwargs = pickle.loads(call.payload)
    flight.running()  # the call's limit counts from here, not from the fake group nor the imports
    with Instruments() as ins:
        t0 = time.perf_counter()
        value = fn(*args, **kwargs)
        wall = time.perf_counter() - t0
        end = ins.memory()
    _check_picklable(call, value)
    steps = ins.steps()
    record = SimRecord(value=value, collectives=dict(ins.whole.collectives), comm_bytes=ins.whole.sent,
                       peak_bytes=ins.whole.peak, memory=steps[-1].memory if steps else end, steps=steps,
                       wall_s=wall, comm_bytes_by_op=dict(ins.whole.sent_by_op))
    if tdist.is_initialized():
        tdist.destroy_process_group()
    return record


def _check_picklable(call: SimCall, value) -> None:
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"{call.fn.qualname} returned a {type_name(value)} that cannot be sent back from the simulated "
            f"rank ({safe_str(exc)}): return plain data (numbers, strings, CPU tensors, containers of them); "
            "a model's figures are already in the Simulation") from None


# The imports a simulated rank needs beyond a real one's: preloaded by the forkserver when the session
# has simulate-marked tests (``plugin``), 1.7 s per fresh process otherwise (measured, 2-core machine).
# torchvision (1.6 s; skipped where it is not installed) for the vision models simulations build.
PRELOAD = [
    "torchvision",
    "torch.testing._internal.distributed.fake_pg",
    "torch.distributed.fsdp",
    "torch.distributed.tensor.parallel",
    "torch.distributed.tensor.debug",
    "torch.distributed.device_mesh",
    "pytest_mgpu.simulate.inrank",
    "pytest_mgpu.simulate.instruments",
]
