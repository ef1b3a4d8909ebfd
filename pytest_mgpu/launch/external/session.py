"""This process in the launched job: join the job once (the default process group, NCCL on GPU
``LOCAL_RANK`` or gloo on CPU, and the control plane on the job's store), agree with the other ranks
through that store, and leave it at the end.

Agreement goes through the job's store with timeouts (``control.py``), never through the default
group, which a rank may be stuck in. Plain Python, no pytest.
"""
from __future__ import annotations

import hashlib
import os
from datetime import timedelta
from typing import Any, Dict, Optional, Sequence

from ...devices import DevicePlan
from ..control import ControlPlane, WorldBroken
from .agree import START, PhaseRecord, Verdict, broken_verdict, collection_difference, merge
from .detect import ENV_JOINED, ExternalError, LaunchedWorld, RankDevice, choose_device, external_plan


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

        from ...compat import available, reason

        if not available("external_launch"):  # before the rendezvous: every rank stops with the same words
            raise ExternalError(f"{world.describe()}: {reason('external_launch')}. Run pytest without "
                                "torchrun/srun (pytest-mgpu then starts the ranks), or use a newer torch")
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
        kwargs: Dict[str, Any] = {}
        if device.device_type == "cuda":
            assert device.device_index is not None  # choose_device gives every cuda rank its index
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
        return collection_difference(posts, lists)

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

