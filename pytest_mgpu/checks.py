"""The checks of training a ``dist`` offers (``Dist`` inherits them): ``assert_parity``,
``assert_same_training`` and ``assert_resumes``. Each imports its engine when called, so that a
plain ``dist.run`` test pays for none of them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Union

if TYPE_CHECKING:
    from .parity.report import ParityReport


class Checks:
    """The parity checks, as methods of the ``dist`` fixture."""

    def assert_parity(self, strategy: Union[str, Callable[..., Any]], model_fn: Callable[..., Any],
                      batch_fn: Callable[..., Any], *, loss_fn: Optional[Callable[..., Any]] = None,
                      optimizer_fn: Optional[Callable[..., Any]] = None, steps: int = 3,
                      rtol: Optional[float] = None, atol: Optional[float] = None, deterministic: bool = False,
                      timeout: Optional[float] = None, param_map: Optional[Dict[str, str]] = None,
                      shards: Optional[Mapping[str, Any]] = None, **options: Any) -> ParityReport:
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
            shards: Accepted for one signature across the checks, and refused here with what to
                use: every side of ``assert_parity`` holds whole tensors.
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
        if shards is not None:
            from .parity.layout.shards import not_for_parity

            not_for_parity()
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
                             shards: Optional[Mapping[str, Any]] = None, **kwargs: Any) -> ParityReport:
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
            shards: Tensors sharded by hand that shapes alone cannot put together: fnmatch patterns of
                the reference's names to a dim (pieces concatenated in rank order) or to
                ``fn(pieces) -> tensor`` (a fused or interleaved layout).
            **kwargs: Passed to both.

        Returns:
            The report of every step (``report.format()``, ``report.notes``, ``report.per_step()``).

        Raises:
            ParityError: The loops train differently (or nothing moved: "nothing was compared").
            StepCountError: A side took another number of steps than ``steps``.
            RankFailure: A rank raised, hung or died.
        """
        __tracebackhide__ = True
        from .parity.training import assert_same_training

        return assert_same_training(self, fn, reference_fn, *args, steps=steps, record=record,  # type: ignore[arg-type]
                                    spawn=spawn, rtol=rtol, atol=atol, timeout=timeout, fn_kwargs=fn_kwargs,
                                    reference_kwargs=reference_kwargs, shards=shards, **kwargs)

    def assert_resumes(self, fn: Callable[..., Any], *args: Any, steps: int, stop_after: int,
                       world_size_after: Optional[int] = None, spawn: bool = False,
                       rtol: Optional[float] = None, atol: Optional[float] = None,
                       timeout: Optional[float] = None, shards: Optional[Mapping[str, Any]] = None,
                       **kwargs: Any) -> ParityReport:
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
            shards: Tensors sharded by hand, as for ``assert_same_training``: each phase's pieces are
                put together before they are compared (needed where the world size changes).
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
                              spawn=spawn, rtol=rtol, atol=atol, timeout=timeout, shards=shards, **kwargs)
