"""``Dist``: the object a test receives as the ``dist`` fixture. It knows the test's device plan and
hands calls to a launcher; parity and timing live in their own packages and are reached through thin
methods here so that one fixture serves them all."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .cuda_only import add_cuda_hint
from .devices import DevicePlan
from .launch.errors import RankFailure
from .launch.protocol import pack_call
from .launch.base import Launcher, LaunchSpec
from .launch.rank_coverage import ranks_env
from .settings import SettingsError, validate_timeout

if TYPE_CHECKING:
    from .parity.report import ParityReport
    from .timing.measure import Measurement


@dataclass
class CallRecord:
    """Cost of one ``dist.run``: how long ranks took to start, and the whole call."""

    world_size: int
    startup_s: float
    wall_s: float
    ok: bool


@dataclass
class Dist:
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
    structures: List[Any] = field(default_factory=list)  # timing.structure CallStructure: parity, same_training
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
            fn: A module-level function: the ranks import it by name; arguments and value are pickled.
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
            fn: A module-level function, as for ``run``.
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
            fn: A module-level function, as for ``run``.
            *args: Positional arguments of ``fn``.
            timeout: Seconds this call may take, as for ``run``.
            **kwargs: Keyword arguments of ``fn``.

        Returns:
            ``fn``'s return value.
        """
        __tracebackhide__ = True
        return self._launch(fn, args, kwargs, nprocs=1, timeout=timeout)[0]

    def spawn(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[Any]:
        """Drop-in for ``torch.multiprocessing.spawn(fn, args=args, nprocs=dist.world_size)``: runs
        ``fn(rank, *args, **kwargs)`` in every rank with no process group up. The code's own
        ``init_process_group`` joins this test's rendezvous whatever address or port it names; a
        backend the devices cannot run ("nccl" on CPU ranks) runs as gloo, with a RuntimeWarning.

        Args:
            fn: A module-level function taking the rank first, as ``mp.spawn`` calls it.
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
            fn: A module-level function, as for ``run``.
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

        return benchmark(self, fn, *args, warmup=warmup, repeat=repeat, name=name, batch_size=batch_size,
                         strategy=strategy, group=group, params=params, single_process=single_process,
                         min_run_time=min_run_time, timeout=timeout, global_batch=global_batch, **kwargs)

    def assert_parity(self, strategy: Union[str, Callable[..., Any]], model_fn: Callable[..., Any],
                      batch_fn: Callable[..., Any], *, loss_fn: Optional[Callable[..., Any]] = None,
                      optimizer_fn: Optional[Callable[..., Any]] = None, steps: int = 3,
                      rtol: Optional[float] = None, atol: Optional[float] = None, deterministic: bool = False,
                      timeout: Optional[float] = None, param_map: Optional[Dict[str, str]] = None,
                      **options: Any) -> ParityReport:
        """Train ``model_fn()`` under ``strategy`` on the test's devices and on one device, on the same
        global batches, and compare loss, gradients, parameters and buffers after every step; skips
        where the hardware cannot run the strategy (the reason says why).

        Args:
            strategy: "ddp", "fsdp", "dp", "model_parallel" or "pipeline"; or your own parallel
                module's constructor, built in one process that sees all the test's devices.
            model_fn: Module-level; builds the model (same seed on every side).
            batch_fn: Module-level; ``batch_fn(step) -> (inputs, targets)``, the step's global batch.
            loss_fn: ``loss_fn(outputs, targets)``. None: mean cross entropy.
            optimizer_fn: ``optimizer_fn(params)``. None: SGD, lr 0.05, momentum 0.9 (Adam hides
                gradient-scale errors).
            steps: Optimizer steps compared.
            rtol: Relative tolerance instead of the line measured from the model's own roundoff.
            atol: Absolute tolerance, likewise.
            deterministic: Demand bitwise equality where the strategy computes in one device's order.
            timeout: Seconds per launch, as for ``run``.
            param_map: Your module only: ``{"your name": "reference name"}`` for parameters whose
                ``state_dict`` names differ.
            **options: The strategy's own. Every strategy: ``check_buffers=True`` (compare buffers).
                "ddp": ``sync_bn=False`` (SyncBatchNorm), ``accumulate=1`` (micro-steps under
                ``no_sync`` per step), ``find_unused_parameters=False``,
                ``gradient_as_bucket_view=False``, ``static_graph=False``, ``bucket_cap_mb=None``,
                ``ddp_kwargs=None`` (any other DDP keywords). "fsdp": ``fsdp_version=2`` (1:
                FullyShardedDataParallel), ``shard_modules="children"`` ("root", or a list of module
                names), ``reshard_after_forward=True``, ``sharding_strategy="FULL_SHARD"`` (FSDP1).
                "model_parallel": ``split_points=None`` (module names a stage starts at). "pipeline":
                ``split_points=None``, ``split_size=None`` (rows per micro-batch),
                ``schedule=None`` ("gpipe" or "1f1b": one stage per rank), ``n_microbatches=None``.

        Returns:
            The report of every step (``report.format()`` is the table).

        Raises:
            ParityError: The strategy trained differently; the first diverging step, the worst tensors
                and the likely causes.
        """
        __tracebackhide__ = True
        shared: Dict[str, Any] = dict(loss_fn=loss_fn, optimizer_fn=optimizer_fn, steps=steps, rtol=rtol,
                                      atol=atol, deterministic=deterministic, timeout=timeout)
        if callable(strategy):
            from .parity.user import assert_user_parity

            return assert_user_parity(self, strategy, model_fn, batch_fn, param_map=param_map, **shared, **options)
        from .parity.engine import assert_parity

        if param_map is not None:
            options["param_map"] = param_map  # a built-in strategy takes none: refused with its options
        return assert_parity(self, strategy, model_fn, batch_fn, **shared, **options)

    def assert_same_training(self, fn: Callable[..., Any], reference_fn: Callable[..., Any], *args: Any,
                             steps: int = 3, record: Optional[str] = None, spawn: bool = False,
                             rtol: Optional[float] = None, atol: Optional[float] = None,
                             timeout: Optional[float] = None, fn_kwargs: Optional[Dict[str, Any]] = None,
                             reference_kwargs: Optional[Dict[str, Any]] = None,
                             optimizer_options: Union[str, Sequence[str]] = "same", **kwargs: Any) -> ParityReport:
        """Your distributed training loop ``fn`` in every rank (process group up) against your
        one-device loop ``reference_fn`` in one process, both from the test's seed, compared step by
        step: the ranks' mean loss and rank 0 against the reference, every rank against rank 0.

        Args:
            fn: Module-level; your loop for the ranks (DDP, FSDP, hand-written all_reduce ...).
            reference_fn: Module-level; the same training on one device, on the ranks' rows together.
            *args: Passed to both.
            steps: Steps compared; each side must take exactly this many (else StepCountError).
            record: What a step is. "log": both loops are called ``f(log, *args, steps=steps,
                **kwargs)`` and call ``log(model, loss)`` once per step, after ``backward()``.
                "optimizer": loops run unchanged, ``f(*args, **kwargs)``; a step is one
                ``optimizer.step()``. None: "log", or "optimizer" under ``spawn=True``.
            spawn: ``fn`` is an ``mp.spawn`` entry point: called ``fn(rank, *args, **kwargs)`` with no
                process group up, its own ``init_process_group`` joining the test's.
            rtol: Relative tolerance instead of the line measured over the whole run.
            atol: Absolute tolerance, likewise.
            timeout: Seconds per side's launch, as for ``run``.
            fn_kwargs: Keywords for ``fn`` only, over ``**kwargs`` (a bug flag in ``**kwargs`` trains both).
            reference_kwargs: Keywords for ``reference_fn`` only, over ``**kwargs``.
            optimizer_options: "same": the param-group options (lr at every step, weight decay,
                momentum, betas, eps) must equal the reference's beyond float rounding, or the check
                fails on that alone; "ignore", or the names to leave out (``["lr"]``): not judged.
            **kwargs: Passed to both.

        Returns:
            The report of every step (``report.format()``, ``report.notes``, ``report.per_step()``).

        Raises:
            ParityError: The loops train differently (or nothing moved: "nothing was compared").
            StepCountError: A side took another number of steps than ``steps``.
            RankFailure: A rank raised, hung or died.
        """
        __tracebackhide__ = True
        from .parity.judged_options import same_training

        return same_training(self, fn, reference_fn, *args, optimizer_options=optimizer_options, steps=steps,
                             record=record, spawn=spawn, rtol=rtol, atol=atol, timeout=timeout, fn_kwargs=fn_kwargs,
                             reference_kwargs=reference_kwargs, **kwargs)

    def assert_resumes(self, fn: Callable[..., Any], *args: Any, steps: int, stop_after: int,
                       world_size_after: Optional[int] = None, spawn: bool = False,
                       rtol: Optional[float] = None, atol: Optional[float] = None,
                       timeout: Optional[float] = None, **kwargs: Any) -> ParityReport:
        """Your trainer run three times: through, stopped after ``stop_after`` optimizer steps, and
        again to resume from its own checkpoint (each phase in a folder of its own, the last two
        sharing one: ``checkpoint_dir()``). The resumed steps must train like the uninterrupted ones.

        Args:
            fn: Module-level; your trainer, ``fn(*args, **kwargs)`` with the process group up.
            *args: Passed to ``fn``.
            steps: Optimizer steps of the whole run (N).
            stop_after: The interrupted run stops as its step ``stop_after + 1`` begins (K < N).
            world_size_after: Ranks of the resumed run. None: the test's world size.
            spawn: ``fn`` is an ``mp.spawn`` entry point, called ``fn(rank, *args, **kwargs)``.
            rtol: Relative tolerance instead of the measured line (used where not bitwise equal).
            atol: Absolute tolerance, likewise.
            timeout: Seconds per phase's launch, as for ``run``.
            **kwargs: Passed to ``fn``.

        Returns:
            The report of the resumed steps; its first note says where the resume started.

        Raises:
            ParityError: The resumed steps train otherwise, or nothing was resumed; the likely cause.
            RankFailure: A phase's rank raised (a checkpoint that cannot load at another world size).
        """
        __tracebackhide__ = True
        from .parity.resume import assert_resumes

        return assert_resumes(self, fn, *args, steps=steps, stop_after=stop_after, world_size_after=world_size_after,
                              spawn=spawn, rtol=rtol, atol=atol, timeout=timeout, **kwargs)

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
        if self.plan.skip_reason:
            raise RuntimeError(f"this test's plan is a skip: {self.plan.skip_reason}")
        try:
            spec = self.spec(nprocs, timeout)  # a bad timeout is refused before anything starts
        except SettingsError as exc:
            raise SettingsError(str(exc)) from None  # the test's line, not our frames
        ref, payload = pack_call(fn, args, kwargs)
        t0 = time.perf_counter()
        try:
            result = self.launcher.run(spec, ref, payload)
        except RankFailure as failure:
            self.calls.append(CallRecord(nprocs, 0.0, time.perf_counter() - t0, False))
            self._echo(failure.logs)
            # code written for GPUs on emulated CPU ranks: name the CUDA-only line and the portable one
            add_cuda_hint(failure, self.emulated and self.device_type == "cpu", self.plan.shared_gpus)
            raise failure.with_traceback(None) from None
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
        if not self.echo_output:
            return
        for rank, text in enumerate(logs):
            for line in text.splitlines():
                sys.stdout.write(f"[rank {rank}] {line}\n")
