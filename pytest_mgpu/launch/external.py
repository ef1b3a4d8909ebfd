"""Ranks started by torchrun or srun: pytest itself runs in every rank, joins the launched group once,
and ``dist.run`` runs the function in this rank and gathers every rank's value.

Every rank runs the same tests in the same order, so the ranks only need to agree at a few points: that
they collected the same tests, that each ``dist.run`` is entered by all of them, and on each test phase's
outcome (a failure or skip on one rank becomes the outcome on all). Agreement goes through the job's
store with timeouts (``control.py``), never through the default group, which a rank may be stuck in.
Plain Python, no pytest.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import re
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .._context import RankContext, set_rank_context
from ..devices import DevicePlan
from .attribution import attribute, returned_early
from .base import LaunchResult, LaunchSpec
from .collect import raised_problem
from .control import ControlPlane, Post, WorldBroken
from .errors import RankFailure, RankProblem
from .protocol import FnRef, RankOutcome, RankTask, safe_str, type_name
from .rank import run_call, seed_everything

ENV_MODE = "PYTEST_MGPU_EXTERNAL"  # auto | on | off
ENV_JOINED = "PYTEST_MGPU_JOINED"  # pid of the process that joined: its child processes do not join
MODES = ("auto", "on", "off")
FAILURE_GRACE_S = 10.0  # after a rank failed in dist.run, how long the others get to return
START = "the start of "
TEXT_LIMIT = 20000


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
    torch_vars = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if all(env.get(v) for v in torch_vars):
        world = LaunchedWorld(
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
    elif env.get("RANK") and env.get("WORLD_SIZE") and _int(env, "WORLD_SIZE") > 1:
        missing = [v for v in torch_vars if not env.get(v)]
        raise ExternalError(
            f"RANK and WORLD_SIZE are set but {', '.join(missing)} not: start pytest with torchrun, set "
            f"{' and '.join(missing)}, or pass --mgpu-external=off to ignore these variables"
        )
    elif env.get("SLURM_PROCID") and env.get("SLURM_NTASKS") and (
            env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")):
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
        world = LaunchedWorld(
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


# -- devices and plans ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RankDevice:
    device_type: str  # "cuda" | "cpu"
    device_index: Optional[int]
    backend: str  # "nccl" | "gloo"


def choose_device(world: LaunchedWorld, cuda_count: int) -> RankDevice:
    """GPU ``LOCAL_RANK`` with NCCL; a rank that sees exactly one GPU (srun --gpus-per-task=1) uses it;
    gloo on CPU when there is no GPU."""
    if cuda_count <= 0:
        return RankDevice("cpu", None, "gloo")
    if world.local_rank < cuda_count:
        return RankDevice("cuda", world.local_rank, "nccl")
    if cuda_count == 1:
        return RankDevice("cuda", 0, "nccl")
    raise ExternalError(
        f"local rank {world.local_rank} but this node shows only {cuda_count} GPU(s): start at most "
        f"{cuda_count} rank(s) per node (torchrun --nproc_per_node={cuda_count}, srun --ntasks-per-node="
        f"{cuda_count}), or give each task its own GPU (srun --gpus-per-task=1)"
    )


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
    return DevicePlan(world_size, skip_reason=(
        f"needs {world_size} GPU(s), the ranks of this {world.launcher} job have none; run it on their "
        "CPUs with gloo with --mgpu-fallback=cpu (or PYTEST_MGPU_FALLBACK=cpu)"
    ))


# -- outcome agreement ----------------------------------------------------------------------------
@dataclass
class PhaseRecord:
    """One rank's outcome of one test phase (setup, call, teardown), as plain data."""

    outcome: str  # passed | failed | skipped
    text: str = ""  # the failure as pytest prints it
    crash: str = ""  # one line: the exception
    skip: Optional[Tuple[str, Optional[int], str]] = None  # pytest's (path, lineno, "Skipped: why")
    wasxfail: Optional[str] = None
    output: str = ""  # what the failing phase captured (stdout, stderr, log)


@dataclass
class Verdict:
    """What this rank's report becomes so that every rank reports the same outcome."""

    outcome: str
    message: str = ""  # the failure text, for a rank whose own phase passed or skipped
    skip: Optional[Tuple[str, Optional[int], str]] = None
    wasxfail: Optional[str] = None
    sections: List[Tuple[str, str]] = field(default_factory=list)  # other ranks' failures
    broken: bool = False  # the job ends after this test


def merge(rank: int, records: Mapping[int, PhaseRecord], when: str) -> Verdict:
    """Failed anywhere beats skipped anywhere beats passed; a failure names its ranks and keeps their text."""
    mine = records[rank]
    world = len(records)
    failed = sorted(r for r, x in records.items() if x.outcome == "failed")
    skipped = sorted(r for r, x in records.items() if x.outcome == "skipped")
    if failed:
        seen = {mine.text} if mine.outcome == "failed" else set()
        sections = []
        message = ""
        if mine.outcome != "failed":
            first = records[failed[0]]
            seen.add(first.text)
            message = (f"{when} failed on rank(s) {_names(failed)} of {world} ({mine.outcome} here, on rank {rank}): "
                       f"{first.crash}\n\n--- rank {failed[0]} ---\n{first.text}{first.output}")
        for r in failed:
            x = records[r]
            if r == rank or (message and r == failed[0]):
                continue
            if x.text not in seen:
                seen.add(x.text)
                sections.append((f"mgpu: {when} failed on rank {r}", x.text + x.output))
            elif x.output:
                sections.append((f"mgpu: what rank {r} captured ({when})", x.output))
        return Verdict("failed", message=message, sections=sections)
    if skipped and len(skipped) < world:
        src = records[skipped[0]]
        path, line, why = src.skip or ("", None, "Skipped: ")
        why = why[len("Skipped: "):] if why.startswith("Skipped: ") else why
        return Verdict("skipped", skip=(path, line, f"Skipped: on rank(s) {_names(skipped)} of {world}: {why}"),
                       wasxfail=src.wasxfail)
    return Verdict(mine.outcome, skip=mine.skip, wasxfail=mine.wasxfail)


def broken_verdict(wb: WorldBroken, where: str) -> Verdict:
    head = (f"the job was aborted by another rank during {where}: {wb.reason}" if wb.by_peer
            else f"the job ends at {where}: {wb.reason}")
    parts = [head]
    for r in sorted(wb.stacks):
        parts.append(f"\n--- rank {r}: Python stack ---\n{wb.stacks[r]}")
    return Verdict("failed", message="\n".join(parts), sections=[("mgpu: job aborted", head)], broken=True)


def _names(ranks) -> str:
    return ", ".join(map(str, ranks))


# -- this process in the job ----------------------------------------------------------------------
class ExternalSession:
    """This rank's membership in the launched job: its device, the joined default group, the control
    plane, and the agreements the plugin asks for."""

    current: Optional["ExternalSession"] = None

    def __init__(self, world: LaunchedWorld, device: RankDevice, control: ControlPlane, timeout_s: float):
        self.world = world
        self.device = device
        self.control = control
        self.timeout_s = timeout_s
        self.closed = False

    @property
    def rank(self) -> int:
        return self.world.rank

    @classmethod
    def join(cls, world: LaunchedWorld, timeout_s: float) -> "ExternalSession":
        """Join the job once per process: default group (NCCL on GPU LOCAL_RANK, gloo on CPU) and store."""
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            raise ExternalError(
                "a default process group exists before pytest-mgpu joined the job (conftest or a plugin "
                "called init_process_group): let pytest-mgpu initialize it, or pass --mgpu-external=off"
            )
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        device = choose_device(world, count)
        os.environ.update(RANK=str(world.rank), WORLD_SIZE=str(world.world_size),
                          LOCAL_RANK=str(world.local_rank), LOCAL_WORLD_SIZE=str(world.local_world_size),
                          MASTER_ADDR=world.master_addr, MASTER_PORT=str(world.master_port))
        timeout = timedelta(seconds=timeout_s)
        try:
            store, rank, size = next(dist.rendezvous("env://", timeout=timeout))
        except Exception as exc:
            raise ExternalError(
                f"{world.describe()} could not reach the job's store at {world.master_addr}:"
                f"{world.master_port} within {timeout_s:g}s ({exc}); check MASTER_ADDR/MASTER_PORT"
            ) from None
        kwargs = {}
        if device.device_type == "cuda":
            torch.cuda.set_device(device.device_index)
            kwargs["device_id"] = torch.device("cuda", device.device_index)
        try:
            dist.init_process_group(
                device.backend,
                store=dist.PrefixStore(f"mgpu/{world.job_id}/pg/", store),
                rank=rank,
                world_size=size,
                # the control plane gives up first, with names; this is the last line of defence
                timeout=timeout + timedelta(seconds=60),
                **kwargs,
            )
        except Exception as exc:
            raise ExternalError(
                f"{world.describe()} could not join the process group within {timeout_s:g}s: {exc}. "
                "Did every rank start pytest (same command, same --mgpu-* options)?"
            ) from None
        control = ControlPlane(dist.PrefixStore(f"mgpu/{world.job_id}/ctl/", store), rank, size)
        control.start_monitor()
        os.environ[ENV_JOINED] = str(os.getpid())
        cls.current = session = cls(world, device, control, timeout_s)
        return session

    def plan(self, world_size: int, fallback: str) -> DevicePlan:
        return external_plan(world_size, self.world, self.device, fallback)

    @property
    def broken(self) -> Optional[str]:
        return self.control.broken

    def check_collection(self, nodeids: Sequence[str], errors: int) -> Optional[str]:
        """None if every rank collected the same tests in the same order; else what differs."""
        digest = hashlib.sha256("\n".join(nodeids).encode()).hexdigest()[:16]
        try:
            posts = self.control.exchange("the end of collection", (len(nodeids), digest, errors),
                                          timeout_s=self.timeout_s)
            if len({p.data for p in posts.values()}) == 1:
                return None
            lists = self.control.exchange("the comparison of collected tests", list(nodeids),
                                          timeout_s=self.timeout_s)
        except WorldBroken as wb:
            return f"the ranks could not compare what they collected: {wb.reason}"
        return _collection_difference(posts, lists)

    def agree(self, nodeid: str, when: str, record: PhaseRecord) -> Verdict:
        """The outcome every rank reports for this test phase."""
        if self.control.broken:
            return Verdict(record.outcome, skip=record.skip, wasxfail=record.wasxfail, broken=True)
        tag = f"the end of {nodeid} ({when})"
        try:
            posts = self.control.exchange(tag, record, timeout_s=self.timeout_s)
            # ranks that were entering a dist.run we had left abandon it and meet us at the next exchange
            while any(p.tag.startswith(START) for p in posts.values()):
                posts = self.control.exchange(tag, record, timeout_s=self.timeout_s)
        except WorldBroken as wb:
            return broken_verdict(wb, f"{nodeid} ({when})")
        odd = {r: p.tag for r, p in posts.items() if p.tag != tag}
        if odd:
            where = "; ".join(f"rank {r} at {t!r}" for r, t in sorted(odd.items()))
            reason = f"ranks are out of step: rank {self.rank} at {tag!r}; {where}"
            self.control.abort(reason)
            return broken_verdict(WorldBroken(reason), f"{nodeid} ({when})")
        return merge(self.rank, {r: p.data for r, p in posts.items()}, when)

    def close(self, interrupted: bool = False) -> None:
        """Leave the job: together with every rank on a normal end; else let the reporter finish."""
        if self.closed:
            return
        self.closed = True
        ctl = self.control
        if not ctl.broken and not interrupted:
            try:
                ctl.finish(self.timeout_s)
            except WorldBroken:
                pass
        if ctl.broken or interrupted:
            if ctl.reporter() == self.rank:
                ctl.final()
            else:
                ctl.wait_final()
            return  # a peer may be stuck in a collective: tearing the group down could block
        import torch.distributed as dist

        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _collection_difference(counts: Dict[int, Post], lists: Dict[int, Post]) -> str:
    groups: Dict[tuple, List[int]] = {}
    for r, p in sorted(counts.items()):
        groups.setdefault(p.data, []).append(r)
    lines = ["the ranks collected different tests; every rank must collect the same tests in the same order:"]
    for (n, digest, errors), ranks in groups.items():
        lines.append(f"  rank(s) {_names(ranks)}: {n} test(s), {errors} collection error(s) (digest {digest})")
    ref = lists[0].data
    for r in sorted(lists):
        other = lists[r].data
        if other == ref:
            continue
        i = next((k for k, (a, b) in enumerate(zip(ref, other)) if a != b), min(len(ref), len(other)))
        a = ref[i] if i < len(ref) else "(end)"
        b = other[i] if i < len(other) else "(end)"
        lines.append(f"  first difference, position {i}: rank 0 has {a}, rank {r} has {b}")
    lines.append("Run the same command with the same files on every node; drop rank-dependent collection "
                 "(a conftest that reads RANK, random test order without a fixed seed, --lf/--ff with "
                 "per-node caches).")
    return "\n".join(lines)


# -- dist.run inside a launched job ---------------------------------------------------------------
class ExternalLauncher:
    """``launcher.run(spec, fn, payload)`` for a launched job: run ``fn`` in this rank, gather all ranks'
    values (or failures) on every rank. ``dist.run_single`` runs ``fn`` on rank 0 only."""

    def __init__(self, session: ExternalSession):
        self.session = session

    def run(self, spec: LaunchSpec, fn: FnRef, payload: bytes) -> LaunchResult:
        t0 = time.perf_counter()
        s = self.session
        ctl, world = s.control, s.world
        single = spec.nprocs == 1 and world.world_size != 1
        if not single and spec.nprocs != world.world_size:
            raise ExternalError(f"{spec.describe()} needs {spec.nprocs} ranks; this job has {world.world_size}")
        call = "dist.run_single" if single else "dist.run"
        tag = f"{call}({fn.qualname}) in {spec.label}"
        try:
            posts = ctl.exchange(START + tag, timeout_s=s.timeout_s)
        except WorldBroken as wb:
            raise self._failure(spec, wb, started=False) from None
        absent = {r: p.tag for r, p in posts.items() if p.tag != START + tag}
        if absent:
            raise RankFailure(spec.describe(), [
                RankProblem(r, "absent", f"did not enter this dist.run; it was at {t!r}")
                for r, t in sorted(absent.items())
            ], hint=("No rank ran the function. Every rank must make the same dist.run calls in the same "
                     "order: a rank that skipped or failed before this call (rank-dependent code in the "
                     "test body) leaves the others alone in it."))
        started = time.monotonic()
        deadline = started + spec.timeout_s
        outcome: Optional[RankOutcome] = None
        if not single or world.rank == 0:
            outcome = self._run_here(spec, fn, payload, single, deadline)
        try:
            posts = ctl.exchange("the end of " + tag, outcome, ok=outcome is None or outcome.ok,
                                 deadline=deadline, grace_s=min(FAILURE_GRACE_S, spec.timeout_s))
        except WorldBroken as wb:
            wb.posts.setdefault(world.rank, Post(world.rank, "", outcome is None or outcome.ok, outcome))
            raise self._failure(spec, wb, started=True) from None
        problems = [raised_problem(p.data) for _, p in sorted(posts.items()) if not p.ok]
        if problems:
            returned = [r for r, p in posts.items() if p.ok]
            raise RankFailure(spec.describe(), attribute(problems, returned, returned_early))
        outcomes = [posts[0].data] if single else [posts[r].data for r in range(world.world_size)]
        wall = time.perf_counter() - t0
        work = max((o.run_s for o in outcomes), default=0.0)
        return LaunchResult([o.value for o in outcomes], [], max(0.0, wall - work), wall)

    def _run_here(self, spec, fn, payload, single: bool, deadline: float) -> RankOutcome:
        s, w = self.session, self.session.world
        dev = s.device
        if single:
            devices = tuple(range(min(_cuda_count(), spec.nprocs if spec.nprocs > 1 else w.world_size))) \
                if dev.device_type == "cuda" else ()
            rank, size, local = 0, 1, 0
        else:
            devices = (dev.device_index,) if dev.device_type == "cuda" else ()
            rank, size, local = w.rank, w.world_size, w.local_rank
        task = RankTask(
            rank=rank, world_size=size, local_rank=local, backend=dev.backend, device_type=dev.device_type,
            device_index=dev.device_index, devices=devices, emulated=spec.emulated, store_host=w.master_addr,
            store_port=w.master_port, store_prefix="", seed=spec.seed, per_rank_seed=spec.per_rank_seed,
            threads=0, fn=fn, payload=payload, log_path="", pg_timeout_s=spec.timeout_s,
        )
        seed_everything(spec.seed + (rank if spec.per_rank_seed else 0))
        set_rank_context(RankContext(rank=rank, world_size=size, local_rank=local, device_type=dev.device_type,
                                     device_index=dev.device_index, backend=dev.backend, emulated=spec.emulated,
                                     seed=spec.seed, devices=devices))
        s.control.watch_deadline(deadline, f"dist.run of {fn.qualname} in {spec.label}")
        try:
            outcome = run_call(task)
        finally:
            s.control.watch_deadline(None)
            set_rank_context(None)
        outcome.rank = w.rank
        if outcome.exc_type == "KeyboardInterrupt":
            raise KeyboardInterrupt
        if outcome.ok:
            try:  # every rank unpickles it: rebuild it here first, where the failure can be named
                pickle.loads(pickle.dumps(outcome.value, protocol=pickle.HIGHEST_PROTOCOL))
            except Exception as exc:
                return RankOutcome(rank=w.rank, ok=False, exc_type=type_name(exc), phase="return", exc_message=(
                    f"the value returned by rank {w.rank} ({type_name(outcome.value)}) cannot be sent to the "
                    f"other ranks ({safe_str(exc)}); return tensors, numbers, strings or containers of them"))
        return outcome

    def _failure(self, spec: LaunchSpec, wb: WorldBroken, started: bool) -> RankFailure:
        problems = [raised_problem(p.data) for _, p in sorted(wb.posts.items())
                    if not p.ok and isinstance(p.data, RankOutcome)]
        failed_first = bool(problems)
        for r in wb.lost:
            stack = wb.stacks.get(r, "(it did not send its stack)")
            if r not in wb.stacks and started:  # its monitor thread did not answer: the process is gone
                problems.append(RankProblem(r, "died", "was lost: it stopped answering and sent no stack "
                                            "(its process died or froze)"))
            elif failed_first:
                problems.append(RankProblem(r, "stopped", "was still running after another rank failed "
                                            "(probably waiting in a collective for it); its stack:", stack,
                                            secondary=True))
            elif started:
                problems.append(RankProblem(r, "hung", f"did not finish within {spec.timeout_s:g}s (hung); "
                                            "its Python stack:", stack))
            else:
                problems.append(RankProblem(r, "hung", "did not reach this dist.run; its Python stack:", stack))
        if not problems:
            problems.append(RankProblem(self.session.rank, "stopped", f"could not go on: {wb.reason}"))
        returned = [r for r, p in wb.posts.items() if p.ok] if started else []
        return RankFailure(spec.describe(), attribute(problems, returned, returned_early), hint=(
            f"{wb.reason}.\nThe job ends here on every rank: a rank left inside a collective (or hung) cannot "
            "rejoin the process group. Raise the limit with dist.run(..., timeout=S) or --mgpu-timeout if the "
            "work is just slow."))

    def prewarm(self, spec: LaunchSpec) -> None:
        """Nothing to start: the job's processes are the ranks."""

    @property
    def fresh(self) -> "ExternalLauncher":
        """Itself: the job's processes are the only ranks there are, so none can be fresh."""
        return self

    def close(self) -> None:
        pass


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
