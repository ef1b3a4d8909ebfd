"""``Dist``: the object a test receives as the ``dist`` fixture. It knows the test's device plan and
hands calls to a launcher; parity and timing live in their own packages and are reached through thin
methods (the parity checks through ``checks.Checks``) so that one fixture serves them all."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

from .checks import Checks
from .cuda_only import add_cuda_hint
from .devices import DevicePlan
from .launch.errors import RankFailure
from .launch.protocol import pack_call
from .launch.base import Launcher, LaunchSpec
from .launch.rank_coverage import ranks_env
from .settings import SettingsError, validate_timeout

if TYPE_CHECKING:
    from .timing.measure import Measurement


@dataclass
class CallRecord:
    """Cost of one ``dist.run``: how long ranks took to start, and the whole call."""

    world_size: int
    startup_s: float
    wall_s: float
    ok: bool
    lane: bool = False  # timed by the revision lane's own ranks: a call, whose start-up is not the test's


@dataclass
class Dist(Checks):
    """The ``dist`` fixture: a test's ranks. Mark the test ``gpuN`` (or ``world_sizes(...)``) for N ranks."""

    plan: DevicePlan
    launcher: Launcher  # fresh ranks, warm ranks, or the ranks of a torchrun/srun job
    label: str = "dist.run"
    timeout_s: float = 300.0
    seed: int = 0
    per_rank_seed: bool = False
    device_ids: Sequence[str] = ()
    calls: List[CallRecord] = field(default_factory=list)
    echo_output: bool = True
    deadline: Optional[float] = None  # time.monotonic() by which an outer limit (pytest-timeout) fires
    timeout_source: str = "--mgpu-timeout"  # where timeout_s came from: a marker, the option, the ini
    deadline_source: str = ""  # what sets ``deadline``, e.g. "pytest-timeout's limit of 4s"
    measurements: List[Any] = field(default_factory=list)  # timing.measure.Measurement, in call order
    # timing.structure CallStructure: parity, same_training; None where no golden judges or records them
    structures: Optional[List[Any]] = field(default_factory=list)
    invocation_dir: str = ""  # where pytest started: anchors a relative coverage data file for ranks

    def __repr__(self) -> str:
        return f"<dist {self.plan.describe()}>"

    # -- what the test sees -----------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Ranks a call starts: the test's ``gpuN``."""
        return self.plan.world_size

    @property
    def backend(self) -> str:
        """"nccl" on GPUs, "gloo" on CPU ranks or ranks sharing a GPU."""
        return self.plan.backend

    @property
    def device_type(self) -> str:
        """"cuda" or "cpu"."""
        return self.plan.device_type

    @property
    def emulated(self) -> bool:
        """True where gloo CPU ranks stand in for GPUs (``--mgpu-fallback=cpu``)."""
        return self.plan.emulated

    def run(self, fn: Callable[..., Any], *args: Any, timeout: Optional[float] = None, **kwargs: Any) -> List[Any]:
        """Run ``fn(*args, **kwargs)`` once in each of the test's ``world_size`` ranks, with the default
        process group up (NCCL on GPUs, gloo on CPU ranks).

        Args:
            fn: Module-level (travels by name), or nested, a lambda, a ``functools.partial`` (travels
                by value with what it captures: cloudpickle). Arguments and value are pickled.
            *args: Positional arguments of ``fn``.
            timeout: Seconds this call may take before its ranks are reported hung and killed. None:
                the test's ``mgpu_timeout`` marker, else ``--mgpu-timeout`` (default 300).
            **kwargs: Keyword arguments of ``fn``.

        Returns:
            The ranks' return values in rank order, tensors moved to the CPU.

        Raises:
            RankFailure: A rank raised, hung or died: named, with its traceback and the first
                collective the ranks disagree on.
        """
        __tracebackhide__ = True
        return self._launch(fn, args, kwargs, nprocs=self.world_size, timeout=timeout)

    def run_on(self, nprocs: int, fn: Callable[..., Any], *args: Any, timeout: Optional[float] = None,
               **kwargs: Any) -> List[Any]:
        """``run`` on ``nprocs`` ranks instead of the test's ``world_size`` (a checkpoint loaded at
        another world size). On GPUs, more ranks than the test's devices skip the test with the marker
        to use; emulated CPU ranks take any number.

        Args:
            nprocs: How many ranks to start (a positive integer).
            fn: A function, as for ``run``.
            *args: Positional arguments of ``fn``.
            timeout: Seconds this call may take, as for ``run``.
            **kwargs: Keyword arguments of ``fn``.

        Returns:
            The ranks' return values in rank order.
        """
        __tracebackhide__ = True
        if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
            raise ValueError(f"dist.run_on(nprocs=...) must be a positive integer, got {nprocs!r}")
        if not self.emulated and self.device_type != "cpu" and nprocs > self.world_size:
            import pytest

            pytest.skip(f"{nprocs} ranks need {nprocs} devices; this test holds {self.world_size}: mark it "
                        f"gpu{nprocs} (or run it with --mgpu-fallback=cpu)")
        return self._launch(fn, args, kwargs, nprocs=nprocs, timeout=timeout)

    def run_single(self, fn: Callable[..., Any], *args: Any, timeout: Optional[float] = None, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` in one process that sees all of the test's devices (DataParallel,
        model parallel within a process); ``rank_context().devices`` lists them.

        Args:
            fn: A function, as for ``run``.
            *args: Positional arguments of ``fn``.
            timeout: Seconds this call may take, as for ``run``.
            **kwargs: Keyword arguments of ``fn``.

        Returns:
            ``fn``'s return value.
        """
        __tracebackhide__ = True
        return self._launch(fn, args, kwargs, nprocs=1, timeout=timeout)[0]

    def run_with_single(self, fn: Callable[..., Any], args: Sequence[Any], single: Callable[..., Any],
                        single_args: Sequence[Any], timeout: Optional[float] = None) -> Tuple[List[Any], Any]:
        """``(run(fn, *args), run_single(single, *single_args))``, the two calls at once where the
        ranks are warm CPU processes (the one process uses a core the ranks leave idle), one after the
        other elsewhere (GPUs, where the one process would share a device with rank 0; one rank, which is
        that one process; fresh ranks; a torchrun or srun job). The ranks' failure is raised first; it ends the single call unwaited for.

        Args:
            fn: A function, as for ``run``.
            args: Its positional arguments.
            single: A function, as for ``run_single``.
            single_args: Its positional arguments.
            timeout: Seconds each call may take, as for ``run``.

        Returns:
            The ranks' values in rank order, and the one process's value.
        """
        __tracebackhide__ = True
        start = getattr(self.launcher, "start", None)
        if start is None or self.device_type != "cpu" or self.world_size == 1:  # one rank: the same process
            return self.run(fn, *args, timeout=timeout), self.run_single(single, *single_args, timeout=timeout)
        spec, ref, payload = self._call(single, tuple(single_args), {}, 1, timeout)
        t0 = time.perf_counter()
        try:
            other = start(spec, ref, payload)
        except RankFailure as failure:  # its warm process could not start
            self._failed(failure, 1, t0)
        try:
            ranks = self.run(fn, *args, timeout=timeout)
        except BaseException:
            other.abandon()
            raise
        try:
            result = other.result()
        except RankFailure as failure:
            self._failed(failure, 1, t0)
        return ranks, self._returned(result, 1)[0]

    def spawn(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[Any]:
        """Drop-in for ``torch.multiprocessing.spawn(fn, args=args, nprocs=dist.world_size)``: runs
        ``fn(rank, *args, **kwargs)`` in every rank with no process group up. The code's own
        ``init_process_group`` joins this test's rendezvous whatever address or port it names; a
        backend the devices cannot run ("nccl" on CPU ranks) runs as gloo, with a RuntimeWarning.

        Args:
            fn: A function taking the rank first, as ``mp.spawn`` calls it.
            *args: Its arguments after the rank.
            **kwargs: Its keyword arguments.

        Returns:
            The ranks' return values in rank order.
        """
        __tracebackhide__ = True
        from .spawn_mode import spawn

        return spawn(self, fn, args, kwargs)

    def benchmark(self, fn: Callable[..., Any], *args: Any, warmup: Optional[int] = None,
                  repeat: Optional[int] = None, name: Optional[str] = None, batch_size: Optional[int] = None,
                  strategy: Optional[str] = None, group: Optional[str] = None,
                  params: Optional[Dict[str, Any]] = None, single_process: bool = False,
                  min_run_time: Optional[float] = None, timeout: Optional[float] = None,
                  global_batch: Optional[int] = None, **kwargs: Any) -> Measurement:
        """Time a training step in every rank and return its ``Measurement`` (the session's timing
        report and gate judge it). ``fn(*args, **kwargs)`` runs once per rank; if it returns a
        callable, that is the step timed and ``fn`` was its setup, else ``fn`` itself is the step.

        Args:
            fn: A function, as for ``run``.
            *args: Positional arguments of ``fn``.
            warmup: Untimed iterations first. None: until two iterations agree within 10%.
            repeat: Timed iterations. None: enough for ``min_run_time`` seconds, at least 5.
            name: The measurement's name within the test. None: ``strategy``, else ``fn``'s name.
            batch_size: The older name of ``global_batch``, with the same meaning.
            strategy: The report row's label ("ddp", "fsdp", ...). None: ``name`` or ``fn``'s name.
            group: Rows compared with each other (speed-up over the group's one-device row). None: the
                test's name, so the ``world_sizes(1, 2, 4)`` variants of a test form one group.
            params: What else varies within a strategy, shown in the row (``{"split_size": 8}``).
            single_process: One process that sees all the test's devices instead of one per device.
            min_run_time: Seconds of timed iterations when ``repeat`` is None. None: 1.0.
            timeout: Seconds for the whole call, as for ``run``.
            global_batch: Samples one step processes over all ranks together (per-rank batch x
                ranks), which gives throughput and makes rows at several world sizes comparable.
                None: no throughput.
            **kwargs: Keyword arguments of ``fn``.

        Returns:
            The medians, spread, per-rank figures and peak memory of the step.
        """
        __tracebackhide__ = True
        from .timing.measure import benchmark

        m = benchmark(self, fn, *args, warmup=warmup, repeat=repeat, name=name, batch_size=batch_size,
                      strategy=strategy, group=group, params=params, single_process=single_process,
                      min_run_time=min_run_time, timeout=timeout, global_batch=global_batch, **kwargs)
        if m.lane_only:  # the lane's head turns are the measurement: the test made this call through it
            self.calls.append(CallRecord(self.world_size, 0.0, m.revision.wall_s if m.revision else 0.0, True, True))
        return m

    # -- internals ----------------------------------------------------------------------------
    def spec(self, nprocs: int, timeout: Optional[float] = None) -> LaunchSpec:
        seconds, source = self._effective_timeout(timeout)
        return LaunchSpec(
            nprocs=nprocs,
            backend=self.backend,
            device_type=self.device_type,
            device_ids=tuple(self.device_ids),
            test_devices=self.world_size,
            emulated=self.emulated,
            seed=self.seed,
            per_rank_seed=self.per_rank_seed,
            timeout_s=seconds,
            timeout_source=source,
            outer_deadline=self.deadline,
            outer_source=self.deadline_source,
            label=self.label,
            env=ranks_env(self.invocation_dir),  # {} unless pytest --cov measures now: then ranks do too
        )

    def _effective_timeout(self, timeout: Optional[float]) -> Tuple[float, str]:
        """The call's limit and where it came from: ``dist.run(timeout=)`` beats the test's
        ``mgpu_timeout`` marker beats ``--mgpu-timeout`` / ini. An outer limit (pytest-timeout) is not
        folded in here: the launcher cuts the call before it, start-up included (``CallLimit``)."""
        if timeout is None:
            return float(self.timeout_s), self.timeout_source
        seconds = validate_timeout(timeout, "dist.run(timeout=...)", text_ok=False)
        return seconds, f"dist.run(timeout={timeout!r})"

    def _launch(self, fn, args, kwargs, nprocs: int, timeout: Optional[float]):
        __tracebackhide__ = True
        spec, ref, payload = self._call(fn, args, kwargs, nprocs, timeout)
        t0 = time.perf_counter()
        try:
            result = self.launcher.run(spec, ref, payload)
        except RankFailure as failure:
            self._failed(failure, nprocs, t0)
        return self._returned(result, nprocs)

    def _call(self, fn, args, kwargs, nprocs: int, timeout: Optional[float]):
        """The call's spec and what travels to its ranks; a skip or a bad timeout is refused here."""
        __tracebackhide__ = True
        if self.plan.skip_reason:
            raise RuntimeError(f"this test's plan is a skip: {self.plan.skip_reason}")
        try:
            spec = self.spec(nprocs, timeout)  # a bad timeout is refused before anything starts
        except SettingsError as exc:
            raise SettingsError(str(exc)) from None  # the test's line, not our frames
        ref, payload = pack_call(fn, args, kwargs)
        return spec, ref, payload

    def _failed(self, failure: RankFailure, nprocs: int, t0: float) -> NoReturn:
        __tracebackhide__ = True
        self.calls.append(CallRecord(nprocs, 0.0, time.perf_counter() - t0, False))
        self._echo(failure.logs)
        # code written for GPUs on emulated CPU ranks: name the CUDA-only line and the portable one
        add_cuda_hint(failure, self.emulated and self.device_type == "cpu", self.plan.shared_gpus)
        raise failure.with_traceback(None) from None

    def _returned(self, result, nprocs: int) -> List[Any]:
        self.calls.append(CallRecord(nprocs, result.startup_s, result.wall_s, True))
        self._echo(result.logs)
        self._leftovers(getattr(result, "notes", ()))
        return result.values

    def _leftovers(self, notes: Sequence[str]) -> None:
        """What ranks left running (ended children, threads): in the test's output and as a warning."""
        import warnings

        from .launch.errors import RankLeftoverWarning

        for note in notes:
            sys.stdout.write(f"[pytest-mgpu] {note}\n")
            warnings.warn(RankLeftoverWarning(f"{self.label}: {note}"), stacklevel=4)

    def _echo(self, logs: Sequence[str]) -> None:
        """Rank output goes to the test's stdout, so pytest captures and shows it per test."""
        for rank, text in enumerate(logs if self.echo_output else ()):
            sys.stdout.writelines(f"[rank {rank}] {line}\n" for line in text.splitlines())
