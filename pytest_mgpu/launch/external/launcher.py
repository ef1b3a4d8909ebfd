"""``dist.run`` inside a launched job: every rank runs the function itself, and every rank gets all
ranks' values (or their failures, with cause and consequence told apart).

The ranks meet on the job's store before and after the call (``control.py``); a rank that fails,
hangs or dies ends the job, since a rank left inside a collective cannot rejoin the group. Plain
Python, no pytest.
"""
from __future__ import annotations

import pickle
import time
from typing import Optional

from ..._context import RankContext, set_rank_context, torch_devices
from .. import flight
from ..attribution import attribute, returned_early
from ..base import LaunchResult, LaunchSpec
from ..collect import raised_problem
from ..control import Post, WorldBroken
from ..desync import Trace, first_disagreement
from ..errors import ProblemKind, RankFailure, RankProblem, timeout_hint, unfinished_summary
from ..protocol import FnRef, RankOutcome, RankTask, safe_str, type_name
from ..rank import run_call, seed_everything
from ..unfinished import Verdict, classify, collective_name, cpu_words
from .agree import START
from .detect import ExternalError
from .session import ExternalSession

FAILURE_GRACE_S = 10.0  # after a rank failed in dist.run, how long the others get to return


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
                if dev.device_type == "cuda" else tuple(range(spec.test_devices or w.world_size))
            rank, size, local = 0, 1, 0
        else:
            if dev.device_type == "cuda":
                assert dev.device_index is not None  # choose_device gives every cuda rank its index
                devices = (dev.device_index,)
            else:
                devices = (0,)
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
                                     seed=spec.seed, devices=torch_devices(dev.device_type, devices)))
        s.control.watch_deadline(deadline, f"dist.run of {fn.qualname} in {spec.label}")
        flight.begin("", dev.backend)
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
        failed_first, timed_out = bool(problems), False
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
                timed_out = True
                problems.append(self._unfinished(spec, r, stack, wb.evidence.get(r)))
            else:
                problems.append(RankProblem(r, "hung", "did not reach this dist.run; its Python stack:", stack))
        if not problems:
            problems.append(RankProblem(self.session.rank, "stopped", f"could not go on: {wb.reason}"))
        returned = [r for r, p in wb.posts.items() if p.ok] if started else []
        problems = attribute(problems, returned, returned_early)
        hint = (timeout_hint(problems, spec.timeout_s, spec.timeout_source) if timed_out else
                "Raise the limit with dist.run(..., timeout=S) or --mgpu-timeout if the work is just slow.")
        return RankFailure(spec.describe(), problems, hint=(
            f"{wb.reason}.\nThe job ends here on every rank: a rank left inside a collective (or hung) cannot "
            f"rejoin the process group. {hint}"), collectives=first_disagreement(*_traces(wb, problems)))

    def _unfinished(self, spec: LaunchSpec, r: int, stack: str, said) -> RankProblem:
        """A rank still in the call at the limit: blocked (hung), still computing or still starting, from
        what it said of itself (``lost.py``) and its stack, in the words spawned ranks get."""
        ev, cpu, window = said if said is not None else (None, None, 0.0)
        v: Verdict = classify(True, cpu, window, stack, ev)
        where = (f"blocked in {collective_name(v.waiting_in)}" if v.waiting_in is not None else
                 "blocked in a collective" if v.in_collective else "blocked outside any collective")
        summary = unfinished_summary(v.kind, f"{spec.timeout_s:g}s", f"the limit set by {spec.timeout_source}",
                                     cpu_words(v), where)
        kind: ProblemKind = "hung" if v.kind == "blocked" else v.kind
        return RankProblem(r, kind, summary, stack, waiting=v.in_collective)

    def prewarm(self, spec: LaunchSpec) -> None:
        """Nothing to start: the job's processes are the ranks."""

    @property
    def fresh(self) -> "ExternalLauncher":
        """Itself: the job's processes are the only ranks there are, so none can be fresh."""
        return self

    def close(self) -> None:
        pass


def _traces(wb: WorldBroken, problems):
    """Each rank's collectives: from its result or error (posted), or from what a lost rank said."""
    traces = {r: Trace(p.data.collectives, p.data.last_collectives) for r, p in wb.posts.items()
              if isinstance(p.data, RankOutcome)}
    for r, said in wb.evidence.items():
        traces[r] = Trace(said[0].collectives, said[0].last)
    behind = {p.rank for p in problems if p.kind in ("computing", "starting", "raised", "died")}
    return traces, behind


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
