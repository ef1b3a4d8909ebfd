"""Who launched this process: the job that torchrun or srun started, read from the environment
variables they set, and the device this rank uses in it.

Kept apart from joining the job (``session.py``) so that the plugin can decide, from the environment
alone and without torch, whether this pytest is a rank of a job at all. Plain Python, no pytest.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from ...devices import DevicePlan
from ...settings import ENV_EXTERNAL, EXTERNAL_MODES

ENV_MODE = ENV_EXTERNAL  # auto | on | off
ENV_JOINED = "PYTEST_MGPU_JOINED"  # pid of the process that joined: its child processes do not join
MODES = EXTERNAL_MODES
TORCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets


class ExternalError(RuntimeError):
    """The launcher's environment cannot be used as it is; the message says what to change."""


# -- who launched us ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchedWorld:
    """This process's place in the job that torchrun or srun started."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun" | "srun" | "environment"
    job_id: str

    def describe(self) -> str:
        return (f"rank {self.rank} of {self.world_size} (node {self.node_rank}, local rank "
                f"{self.local_rank}), started by {self.launcher}")


def _int(env: Mapping[str, str], name: str, default: Optional[int] = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise ExternalError(f"{name} is not set")
        return default
    m = re.match(r"\s*(\d+)", raw)  # SLURM_TASKS_PER_NODE looks like "4(x2)"
    if not m:
        raise ExternalError(f"{name}={raw!r} is not a number")
    return int(m.group(1))


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[07-09,12],cpu1`` gives ``gpu07``."""
    first = re.split(r",(?![^\[]*\])", nodelist.strip())[0]
    m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", first)
    if not m:
        return first
    lo = re.split(r"[-,]", m.group(2))[0]
    return m.group(1) + lo + m.group(3)


def detect(environ: Mapping[str, str], mode: str = "auto") -> Optional[LaunchedWorld]:
    """The job this process is a rank of, from the variables torchrun or srun set; None if none.

    torchrun (and any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) wins over Slurm's
    variables, so ``srun torchrun ...`` (one agent per node) works. Under Slurm only a job step counts
    (``srun``): the batch script itself also has SLURM_PROCID=0.
    """
    mode = (mode or "auto").strip().lower()
    if mode not in MODES:
        raise ExternalError(f"--mgpu-external (or {ENV_MODE}) must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return None
    env = environ
    joined = env.get(ENV_JOINED)
    if mode == "auto" and joined and joined != str(os.getpid()):
        return None  # a process started by a test in a rank (pytester, subprocess): not a rank itself
    world: Optional[LaunchedWorld]
    if all(env.get(v) for v in TORCH_VARS):
        world = _torchrun_world(env)
    elif env.get("RANK") and env.get("WORLD_SIZE") and _int(env, "WORLD_SIZE") > 1:
        missing = [v for v in TORCH_VARS if not env.get(v)]
        raise ExternalError(
            f"RANK and WORLD_SIZE are set but {', '.join(missing)} not: start pytest with torchrun, set "
            f"{' and '.join(missing)}, or pass --mgpu-external=off to ignore these variables"
        )
    elif env.get("SLURM_PROCID") and env.get("SLURM_NTASKS") and (
            env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")):
        world = _srun_world(env, mode)
        if world is None:
            return None
    elif mode == "on":
        raise ExternalError(
            "--mgpu-external=on but this process was not started by torchrun or srun: none of RANK, "
            "WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun) or SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_ID "
            "(srun) is set"
        )
    else:
        return None
    if not 0 <= world.rank < world.world_size:
        raise ExternalError(f"rank {world.rank} is outside a world of {world.world_size} rank(s)")
    return world


def _torchrun_world(env: Mapping[str, str]) -> LaunchedWorld:
    """torchrun's variables (or any launcher's that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    return LaunchedWorld(
        rank=_int(env, "RANK"),
        world_size=_int(env, "WORLD_SIZE"),
        local_rank=_int(env, "LOCAL_RANK", 0),
        local_world_size=_int(env, "LOCAL_WORLD_SIZE", 1),
        node_rank=_int(env, "GROUP_RANK", _int(env, "SLURM_NODEID", 0)),
        master_addr=env["MASTER_ADDR"],
        master_port=_int(env, "MASTER_PORT"),
        launcher="torchrun" if env.get("TORCHELASTIC_RUN_ID") else "environment",
        job_id=(f"{env['TORCHELASTIC_RUN_ID']}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
                if env.get("TORCHELASTIC_RUN_ID") else f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"),
    )


def _srun_world(env: Mapping[str, str], mode: str) -> Optional[LaunchedWorld]:
    """An srun job step's variables; None for a step of one task unless asked for (``on``)."""
    ntasks = _int(env, "SLURM_NTASKS")
    if ntasks < 2 and mode == "auto":
        return None
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "0"
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "0"
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    addr = env.get("MASTER_ADDR") or (first_host(nodelist) if nodelist else "")
    if not addr:
        raise ExternalError("under srun, set MASTER_ADDR (the first node of the job) in the job script")
    port = _int(env, "MASTER_PORT", 20000 + (int(job) * 16 + int(step)) % 40000)
    return LaunchedWorld(
        rank=_int(env, "SLURM_PROCID"),
        world_size=ntasks,
        local_rank=_int(env, "SLURM_LOCALID", 0),
        local_world_size=_int(env, "SLURM_STEP_TASKS_PER_NODE", _int(env, "SLURM_TASKS_PER_NODE", 1)),
        node_rank=_int(env, "SLURM_NODEID", 0),
        master_addr=addr,
        master_port=port,
        launcher="srun",
        job_id=f"slurm{job}.{step}",
    )


# -- the device of this rank ----------------------------------------------------------------------
@dataclass(frozen=True)
class RankDevice:
    """The device and backend this rank uses in the job (chosen once, when it joins)."""

    device_type: str  # "cuda" | "cpu"
    device_index: Optional[int]
    backend: str  # "nccl" | "gloo"
    short_of_gpus: str = ""  # on cpu: why the node's GPU(s) could not be used ("" where it has none)


def choose_device(world: LaunchedWorld, cuda_count: int, visible: Optional[str] = None) -> RankDevice:
    """GPU ``LOCAL_RANK`` with NCCL; a rank that was given exactly one GPU of its own
    (``srun --gpus-per-task=1``: CUDA_VISIBLE_DEVICES names one) uses it; gloo on CPU when there is
    no GPU, or when the node starts more ranks than it has GPUs (NCCL refuses two ranks on one GPU:
    "Duplicate GPU detected"). Every rank of a node decides alike, from the node's counts."""
    if cuda_count <= 0:
        return RankDevice("cpu", None, "gloo")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    own_one = cuda_count == 1 and visible is not None and len([v for v in visible.split(",") if v.strip()]) == 1
    if world.local_world_size <= cuda_count:
        return RankDevice("cuda", world.local_rank, "nccl")
    if own_one:
        return RankDevice("cuda", 0, "nccl")
    return RankDevice("cpu", None, "gloo", short_of_gpus=(
        f"this node starts {world.local_world_size} rank(s) and shows {cuda_count} GPU(s), and NCCL takes one "
        f"GPU per rank: start at most {cuda_count} rank(s) per node (torchrun --nproc_per_node={cuda_count}, "
        f"srun --ntasks-per-node={cuda_count}), or give each task its own GPU (srun --gpus-per-task=1)"))


def external_plan(world_size: int, world: LaunchedWorld, device: RankDevice, fallback: str) -> DevicePlan:
    """A test's plan inside a launched job: the job's world size is the only one there is."""
    if world_size != world.world_size:
        return DevicePlan(world_size, skip_reason=(
            f"needs {world_size} rank(s), this {world.launcher} job has {world.world_size}: run it in a "
            f"job of {world_size} rank(s), or select tests of this size with -m gpu{world.world_size}"
        ))
    if device.device_type == "cuda":
        return DevicePlan(world_size, "cuda", device.backend, emulated=False)
    if fallback == "cpu":
        return DevicePlan(world_size, "cpu", "gloo", emulated=True)
    why = device.short_of_gpus or f"the ranks of this {world.launcher} job have none"
    return DevicePlan(world_size, skip_reason=(
        f"needs {world_size} GPU(s): {why}; or run it on their CPUs with gloo with --mgpu-fallback=cpu "
        "(or PYTEST_MGPU_FALLBACK=cpu)"
    ))

