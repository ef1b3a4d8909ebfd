"""The rank side of a parity run: train the strategy and, on rank 0, the one-device reference, step
by step, and measure how far every loss, output, gradient, parameter and buffer is from it.

Why the reference lives in rank 0 of the same launch rather than in its own ``run_single``:
- one launch instead of two (no second fork and process-group start);
- rank 0 compares in memory, so only per-tensor error summaries cross the process boundary, never
  the model's gradients and parameters (100 MB per step for a ResNet50 in fp32);
- reference and strategy advance together, so no step's tensors need to be kept.
It costs nothing in wall time: a separate reference run would be sequential with the strategy run
anyway, and while rank 0 trains the reference the other ranks wait in their first collective.
On a GPU it costs the reference model's memory on rank 0's device.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Dict, List, Optional

from .batches import batch_len, call_model, tree_to
from .judge.distance import compare, tensor_error
from .precision import ieee_float32
from .records import ParityJob, RankOutput, RankResult, RunFacts, StepRecord
from ..timing.structure.counter import CollectiveCounter
from ..timing.structure.figures import StepStructure
from .registry import STRATEGIES, exactness
from .runners import make_runner
from .shadow import Shadow, Twin, attach_floors
from .judge.tolerance import twin_loss_agrees


@contextlib.contextmanager
def _deterministic(on: bool, kernels: bool = False):
    """Bitwise mode (``on``): torch's deterministic algorithms, without warn-only (warn-only lets the
    flash and memory-efficient attention backward take their non-deterministic branch; an op with
    no deterministic implementation raises, and the engine repeats the run with ``kernels`` alone).
    ``kernels``: deterministic cuDNN and no autotuning, but no error for ops torch has no
    deterministic version of. cuBLAS reads its workspace config before its first use: CUDA ranks
    start with it set (``launch/spawn.py``). The flags are put back afterwards: a warm rank runs
    other calls after this one."""
    import torch

    if not (on or kernels):
        yield
        return
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if on:
        torch.use_deterministic_algorithms(True, warn_only=False)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2], saved[3]


def copy_by_name(models, source: Dict[str, object]) -> None:
    """Copy ``source``'s tensors into every model's parameters and buffers of the same name and
    shape (cast to the model's dtype: the float64 shadow takes float32 weights exactly)."""
    import torch

    with torch.no_grad():
        for model in models:
            for name, t in list(model.named_parameters()) + list(model.named_buffers()):
                s = source.get(name)
                if s is not None and s.shape == t.shape:
                    t.copy_(s.detach().to(device=t.device, dtype=t.dtype))


def build_model(model_fn, seed: int):
    """``model_fn()`` right after seeding, so every replica and the reference start identical."""
    import torch

    torch.manual_seed(seed)
    model = model_fn()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model_fn must return an nn.Module, returned {type(model).__name__}")
    return model


def _effective_dtype(model, device) -> str:
    import torch

    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    name = str(dtype).replace("torch.", "")
    if device.type == "cuda" and dtype == torch.float32:
        has_conv = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
        if torch.get_float32_matmul_precision() != "highest" or (has_conv and torch.backends.cudnn.allow_tf32):
            return "tf32"
    return name


def _loss_reduction(loss_fn) -> Optional[str]:
    red = getattr(loss_fn, "reduction", None)
    if red is None and hasattr(loss_fn, "keywords"):
        red = loss_fn.keywords.get("reduction")
    return str(red) if red is not None else None


def model_facts(model, loss_fn, job: ParityJob, world_size: int, device) -> RunFacts:
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd

    facts = RunFacts(
        strategy=job.strategy + (f"/{job.options['schedule']}" if job.options.get("schedule") else ""),
        world_size=world_size,
        dtype=_effective_dtype(model, device),
        device=str(device),
        dropout=[n for n, m in model.named_modules() if isinstance(m, _DropoutNd) and m.p > 0 and m.training],
        loss_reduction=_loss_reduction(loss_fn),
    )
    if not job.options.get("sync_bn"):  # sync_bn=True converts every BatchNorm to SyncBatchNorm
        facts.batchnorm = [
            n for n, m in model.named_modules()
            if isinstance(m, _BatchNorm) and (m.training or not m.track_running_stats)
            and not isinstance(m, torch.nn.SyncBatchNorm)
        ]
    return facts


def run_parity(job: ParityJob) -> RankOutput:
    """Runs in every rank (or in the one process of a single-process strategy)."""
    with _deterministic(job.deterministic, job.deterministic_kernels), ieee_float32():
        return _run(job)


class _Reference:
    """Rank 0's one-device reference, its float64 shadow, and what they learn about the model.

    The reference must not consume the strategy's random numbers, and the shadow must draw the
    reference's (same dropout masks, as far as the dtype allows): both run under ``fork_rng``,
    which restores the state on the way out, so each starts from the state the strategy sees."""

    def __init__(self, job: ParityJob, model_fn, optimizer_fn, loss_fn, ctx, device, world: int):
        import torch

        self.device, self.loss_fn = device, loss_fn
        self.model = build_model(model_fn, ctx.seed).to(device)
        self.optimizer = optimizer_fn(self.model.parameters())
        self.facts = model_facts(self.model, loss_fn, job, world, device)
        self.rng_devices = [device.index] if device.type == "cuda" else []
        self.shadow = self.twin = None
        self.optimizer_fn = optimizer_fn
        self.loss = self.out = None
        self._torch = torch

    def attach_companions(self, runner, example, job: ParityJob) -> None:
        """Before the first step: only a strategy that adds partial sums in another order than the
        reference can differ from it by roundoff, so only then is there a line to measure (a twin
        in its order, and a float64 shadow); one that adds in the reference's order is judged by
        the derived rule (and can be held to bitwise equality with deterministic=True)."""
        order = runner.sum_order(batch_len(example[0]))
        if not job.shadow:
            self.facts.shadow_note = self.facts.twin_note = "not asked for (rtol/atol given)"
            return
        if order is None:
            self.facts.shadow_note = self.facts.twin_note = (
                "the strategy adds in the reference's order, so there is no roundoff to measure "
                "(deterministic=True demands bitwise equality)")
            return
        self.twin, self.facts.twin_note = Twin.build(self.model, self.optimizer_fn, order)
        if self.facts.dtype == "float64":
            self.facts.shadow_note = "the model is float64 already: nothing more precise to shadow it with"
        else:
            self.shadow, self.facts.shadow_note = Shadow.build(self.model, self.optimizer_fn)

    def _companions(self):
        return [c for c in (self.shadow, self.twin) if c is not None]

    def forward_backward(self, inputs, targets, step: int) -> None:
        with self._torch.random.fork_rng(devices=self.rng_devices):
            self.optimizer.zero_grad(set_to_none=True)
            self.out = call_model(self.model, tree_to(inputs, self.device))
            self.loss = self.loss_fn(self.out, tree_to(targets, self.out.device))
            self.loss.backward()
        for companion in self._companions():
            with self._torch.random.fork_rng(devices=self.rng_devices):
                companion.forward_backward(self.loss_fn, inputs, targets, self.device)
        self.facts.batch_sizes.append(int(self.out.shape[0]) if self.out.dim() else 0)
        if step == 0:
            self.facts.unused = [n for n, p in self.model.named_parameters() if p.requires_grad and p.grad is None]

    def measure_before_step(self, rec: StepRecord, runner, loss, out, grads) -> None:
        loss_t = self._torch.as_tensor(loss).reshape(()).to(self.device, self.loss.dtype)
        rec.errors.append(tensor_error("loss", "loss", loss_t, self.loss.detach().reshape(())))
        if out is not None and runner.outputs_comparable:
            rec.errors.append(tensor_error("output", "output", out, self.out.detach()))
        rec.errors += compare("grad", grads, {n: p.grad for n, p in self.model.named_parameters()})
        self.gaps = [c.gaps_before_step(self.loss, self.out, self.model) if c else {}
                     for c in (self.shadow, self.twin)]

    def step(self) -> None:
        self.optimizer.step()
        for companion in self._companions():
            companion.step()

    def retire_shadow_if_twin_agrees(self, rec: StepRecord, runner) -> None:
        """After step 0: where the twin's loss agrees with the reference (no model-level trap), the
        twin tracks the strategy from here on and the shadow adds only cost (a float64 step is 2-4x
        a float32 one on CPU), so it stops; its step-0 gaps stay in the floor. Where the twin
        disagrees, the shadow goes on: it alone draws a measured line for such a run."""
        if rec.step != 0 or self.shadow is None or self.twin is None or self.twin.failed or self.shadow.failed:
            return
        twin_gap, shadow_gap = self.gaps[1].get(("loss", "loss")), self.gaps[0].get(("loss", "loss"))
        loss = float(self.loss.detach().double().abs().item())
        if twin_gap is None or shadow_gap is None or loss == 0:
            return
        self.facts.microbatches = runner.microbatches
        if twin_loss_agrees(twin_gap, loss, shadow_gap / loss, self.facts):
            self.shadow = None
            self.facts.shadow_note = "retired after step 0: the twin's loss agreed, and the twin tracks the strategy"

    def measure_after_step(self, rec: StepRecord, params, buffers) -> None:
        rec.errors += compare("param", params, dict(self.model.named_parameters()))
        if buffers is not None:
            rec.errors += compare("buffer", buffers, dict(self.model.named_buffers()))
        after = [c.gaps_after_step(self.model) if c else {} for c in (self.shadow, self.twin)]
        attach_floors(rec, {**self.gaps[0], **after[0]}, {**self.gaps[1], **after[1]})

    def resync(self, params: Dict, buffers: Optional[Dict]) -> None:
        """Before the next step, the reference and its companions take the strategy's own weights
        and buffers (each keeps its own optimizer state), so every step is judged from the same
        state, as step 0 is.

        Why: roundoff does not stay put. Left to train apart, two valid float32 runs drift by what
        the model amplifies, and a ReLU kink that flips in one run and not in the other jumps the
        drift by orders of magnitude at random: measured on MobileNetV2-GN, DDP x4, the strategy
        was 2.8e-3 from the reference at step 2 while its twin, in the same summation order, was
        5e-6 (3 of 12 runs over seeds and thread counts failed the line). From a shared state one
        step's roundoff is all there is, as at step 0, where every correct configuration of the
        calibration sits below the line and every bug far above it. What a strategy does with its
        own optimizer state (momentum over its gradients) still shows in the parameters."""
        models = [self.model] + [c.model for c in self._companions() if not c.failed]
        copy_by_name(models, {**(buffers or {}), **params})

    def finish(self, records: List[StepRecord]) -> None:
        """A companion that failed at any step judges no step (the report says why)."""
        for companion, note in ((self.shadow, "shadow_note"), (self.twin, "twin_note")):
            if companion is not None and companion.failed:
                setattr(self.facts, note, companion.failed)
                for rec in records:
                    for e in rec.errors:
                        setattr(e, "floor" if note == "shadow_note" else "twin", math.nan)


def _run(job: ParityJob) -> RankOutput:
    import torch

    from .._context import rank_context

    ctx = rank_context()
    model_fn, batch_fn = job.model_fn.load(), job.batch_fn.load()
    loss_fn, optimizer_fn = job.loss_fn.load(), job.optimizer_fn.load()
    spec = STRATEGIES[job.strategy]
    single = spec.process == "single" and not job.options.get("schedule")
    if single and ctx.device_type == "cuda" and ctx.devices:
        ref_device = ctx.devices[0]
    else:
        ref_device = ctx.device()
    world = (len(ctx.devices) if ctx.device_type == "cuda" else job.world_size) if single else ctx.world_size
    example = batch_fn(0)
    ref = _Reference(job, model_fn, optimizer_fn, loss_fn, ctx, ref_device, world) if ctx.rank == 0 else None
    runner = make_runner(job.strategy, job.options, build_model(model_fn, ctx.seed), ctx, loss_fn,
                         optimizer_fn, example, world)
    if ref:
        ref.attach_companions(runner, example, job)
    records: List[StepRecord] = []
    structure: List[StepStructure] = []
    for step in range(job.steps):
        inputs, targets = example if step == 0 else batch_fn(step)
        rec = StepRecord(step)
        if ref:
            ref.forward_backward(inputs, targets, step)
        with CollectiveCounter() as backward:  # the strategy's collectives, not the record's gathers
            loss, out = runner.forward_backward(inputs, targets)
        grads = runner.grads()
        if ref:
            ref.measure_before_step(rec, runner, loss, out, grads)
            ref.step()
        with CollectiveCounter() as update:
            runner.optimizer_step()
        structure.append(StepStructure(f"step {step}", dict(backward.counts + update.counts),
                                       dict(backward.sent + update.sent)))
        params = runner.params()
        buffers = runner.buffers() if job.options.get("check_buffers", True) else None
        if ref:
            ref.measure_after_step(rec, params, buffers)
            ref.retire_shadow_if_twin_agrees(rec, runner)
            records.append(rec)
            if step + 1 < job.steps:
                ref.resync(params, buffers)
    if not ref:
        return RankOutput(None, structure)
    ref.finish(records)
    facts = ref.facts
    facts.microbatches = runner.microbatches
    facts.shard_sizes = list(runner.shard_sizes)
    facts.stages = [list(s) for s in runner.stages]
    facts.exact, facts.exact_note = exactness(spec, job.options, world, runner.microbatches)
    return RankOutput(RankResult(records, facts), structure)
