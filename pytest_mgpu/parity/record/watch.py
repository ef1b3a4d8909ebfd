"""What one side's training loop did, observed through torch's global hooks while it runs (inside
ranks): the models it ran forward, the rows of their inputs, the scalar it last backpropagated,
whether it called ``DistributedSampler.set_epoch``, and whether autocast was on.

Why global hooks: the loop is the user's, unchanged (an ``mp.spawn`` entry, an epoch-based
``Trainer``); nothing in it names its model, loss or sampler to us. Torch offers a module-wide
forward pre-hook (``register_module_forward_pre_hook``; a module called outermost then gets a forward
hook of its own, which marks where its call ends), and every ``loss.backward()`` goes through
``torch.autograd.backward``; those, ``DistributedSampler.set_epoch``, ``torch.nn.utils.clip_grad_norm_``
/ ``clip_grads_with_norm_`` (the norm each side clipped with), the schedulers' and a GradScaler's calls
(``patches``, ``scaler``) are all we patch, and only while the loop runs. A companion's run
(``light``) needs only the models and the losses: the pre-hook and ``backward``.

The input rows are fingerprinted (one float64 per row: the row's dot product with a fixed vector),
so the test process can tell, from the numbers alone, whether the ranks' rows together are the
reference's batch, whether every rank saw the same rows (no DistributedSampler; the right thing for
tensor parallel), and whether a later step saw the first step's rows again (an epoch that repeats
the first one's order: no ``set_epoch``). Measured on the DDP tutorial's Trainer: the sampler's own
passes cannot tell this, since it reads the batch size with ``next(iter(loader))`` before calling
``set_epoch``, a second pass in the old epoch that repeats nothing.
"""
from __future__ import annotations

import contextlib
import math
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...timing.structure.counter import quiet
from ..gather import full_tensor
from .census import Census
from .context import in_function, pipeline_inference
from .fsdp1_flat import is_flat
from .calls import fsdp1_clip, scheduler_steps
from .inputs import Inputs
from .loss_ops import Recorder
from .prints import chunk_prints, fingerprint
from .probe import Probe, attach, loss_backward
from .trail import Trail, holder_of
from .scaler import scaler_calls, scaler_steps
from .sync import UNSYNCED_LAST, ddp_sync_off, fsdp2_sync
from .where import EVAL_FORWARD, PLATEAU, TRAIN_NO_GRAD, add, call_kwargs, user_line


def total_norm(grads: List[Any]) -> float:
    """``float(torch.nn.utils.get_total_norm(grads))``: where the gradients are plain tensors of one
    dtype on one CPU or CUDA device, its own ops alone (``_foreach_norm``, ``stack``, ``vector_norm``),
    so the same bits without its grouping and checks (which cost more than the norms on a small model)."""
    import torch

    first = grads[0]
    if first.device.type in ("cpu", "cuda") and all(
            type(g) is torch.Tensor and g.device == first.device and g.dtype == first.dtype for g in grads):
        with torch.no_grad():
            return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0))
    return float(torch.nn.utils.get_total_norm(grads))


def _first_tensor(args, kwargs):
    import torch

    for value in list(args) + list(kwargs.values()):
        value = value[0] if isinstance(value, (list, tuple)) and value else value  # a batch (x, y): its inputs
        if isinstance(value, torch.Tensor) and not value.is_complex():
            return value
    return None


LATER_STEPS = 4  # the steps after the probed one whose losses' calls are read too (a loss otherwise later)


class Watch:
    """Global hooks for the duration of one loop (``installed()``); what they saw is read by the
    recorders at each step (``take_inputs``, ``loss``) and once after (``roots``, ``set_epoch_calls``).
    ``light``: the models and the losses alone (a companion's run; no rows, lines, norms or patches)."""

    def __init__(self, light: bool = False, follow: Sequence[bool] = ()):
        self.light = light
        self.follow = tuple(follow)  # per GradScaler.step call: the reference skipped it (a companion skips it too)
        self.scaler_found: List[bool] = []  # per GradScaler.step call: it skipped the optimizer step
        self.roots: Dict[int, Any] = {}  # id -> outermost module with parameters, first-call order
        self.stateful: Dict[int, Any] = {}  # id -> module called at the top with buffers and no parameters
        self.on_new_root: Optional[Callable[[Any], None]] = None  # called with a model before its first forward
        self.loss = None  # the scalar last passed to torch.autograd.backward (detached)
        self.autocast = ""  # the autocast dtype an outermost forward ran under ("" if none)
        self.set_epoch_calls = 0  # DistributedSampler.set_epoch calls (the rows show a repeated order)
        self.scalers_made = 0  # enabled GradScalers constructed inside the loop
        self.scaled_clips = 0  # clips between scaler.scale(loss) and scaler.unscale_: scaled gradients clipped
        self.recomputed = False  # a module ran forward inside backward (activation checkpointing)
        self.sampler_passes = 0  # passes over a DistributedSampler (0: the loop uses none)
        self._inputs = Inputs()
        self._depth = 0  # calls of the outermost module under way (0: the next module called is outermost)
        self._top: Any = None  # the outermost module called last
        self._ends: Optional[Dict[int, Any]] = {}  # id -> its own forward hook (None: a global one instead)
        self._handles: List[Any] = []
        self._left_gradients = False  # the last backward pass left some gradient nonzero
        self.fsdp_sync = True  # FSDP2's set_requires_gradient_sync, as the loop last set it
        self.ddp_unsynced = False  # the last outermost forward was a DDP's inside no_sync()
        self._unsynced = ""  # the line of the step's last backward where it ran with gradient sync off
        self.census = Census()  # the roots' module trees, walked once per window (cleared by the recorders)
        self._probing = True  # outputs probed until a step has some
        self._later = 0  # steps taken since the probed one
        self._pending: Optional[List[float]] = None  # the outermost call's rows, until its output is probed
        self._trail: Optional[Trail] = None  # the probed call's submodule calls (trail.py)
        self._by_keyword = False  # the outermost call under way passed its tensors as keywords only
        self._loss_ops = Recorder(lambda: self._depth > 0)  # the calls from a probed output to its backward

    # -- hooks ------------------------------------------------------------------------------
    def _pre(self, module, args, kwargs=None):
        import torch

        if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
            if not torch.compiler.is_compiling() and next(module.parameters(), None) is not None:
                self.roots.setdefault(id(module), module)  # run inside torch.func (per-sample grads): named only
            return None  # inside a graph torch.compile traces, or a torch.func transform
        if torch._C._current_autograd_node() is not None:
            self.recomputed = True  # a forward inside backward: activation checkpointing recomputes
            return None
        if self._depth:
            self._depth += module is self._top  # the outermost module called inside itself
            if self._trail is not None and module is not self._top:
                self._trail.enter(module, _first_tensor(args, kwargs or {}))
            return None  # a submodule
        self._depth, self._top = 1, module
        self._ending(module)
        if pipeline_inference():
            return None  # a pipeline stage inferring its shapes on a made-up batch: not a step's rows
        if next(module.parameters(), None) is None:
            if any(b.is_floating_point() for b in module.buffers()):
                self.stateful.setdefault(id(module), module)  # a loss module with state (DINO's center)
            return None  # a loss module, a parameter-free wrapper call
        new = id(module) not in self.roots
        self.roots.setdefault(id(module), module)
        if new and self.on_new_root is not None:
            self.on_new_root(module)  # before this model's first forward: the state it starts from
        for dev in ("cpu", "cuda"):
            if not self.autocast and torch.is_autocast_enabled(dev):
                self.autocast = str(torch.get_autocast_dtype(dev)).replace("torch.", "")
        if self.light:
            return None
        self.ddp_unsynced = ddp_sync_off(module)
        kwargs = kwargs or call_kwargs()  # model(**batch): its keywords, so that its trail starts with it
        x = _first_tensor(args, kwargs)
        self._by_keyword = x is None and self._ends is not None  # only keywords (model(**batch)): read at its end
        if not self._by_keyword:
            self._rows(module, x, (args, kwargs or {}))
        return None

    def _rows(self, module, x, given=((), {})) -> None:
        """The rows of an outermost forward: a training input where it runs with gradients (a forward
        under ``no_grad`` validates or feeds a teacher); one in eval mode is kept apart, and counts only
        where the step ran no forward in training mode (a model trained in eval mode)."""
        import torch

        line, self._pending = user_line(2), None
        if not torch.is_grad_enabled() and not in_function():
            add(self._inputs.where, "forward under no_grad", line)
            if module.training and any(m.training for m in self.census.modules(module)[1:] or [module]):
                add(self._inputs.where, TRAIN_NO_GRAD, line)  # validation without eval() (not a wrapper's flag)
            return
        add(self._inputs.where, "forward", line)
        if not all(m.training for m in self.census.modules(module)):
            add(self._inputs.where, EVAL_FORWARD, line)  # eval() left on after a validation pass
        plain = x is not None and not hasattr(x, "full_tensor")
        rows = fingerprint(x) if plain else []
        if module.training:
            self._pending = rows if self._probing and rows else None
            self._trail = Trail(module, len(rows), holder_of(module), given) if self._pending else None
            self._inputs.rows += rows
            self._inputs.calls += 1
            for k, prints in (chunk_prints(x) if plain else {}).items():
                self._inputs.chunks.setdefault(k, []).extend(prints)
        else:
            self._inputs.eval_rows += rows

    def _ending(self, module) -> None:
        """A forward hook on a module called outermost: its end makes the next call outermost again.
        Only those modules end through Python: a global forward hook made every module's call take
        torch's slow path (8% of the minGPT-like trainer's step). A ScriptModule takes no hook of its
        own: then a global one watches every module's end instead."""
        from torch.nn.modules import module as M

        if self._ends is None or id(module) in self._ends:
            return
        try:
            self._ends[id(module)] = module.register_forward_hook(self._end, with_kwargs=True)
        except RuntimeError:
            for handle in self._ends.values():
                handle.remove()
            self._ends = None
            self._handles.append(M.register_module_forward_hook(self._end))

    def _end(self, module, args, *rest):
        """The end of a call (``rest``: its keyword arguments, where the module's own hook gives them, and its
        output). The outermost call's: its keyword arguments read (a global pre-hook is given the positional
        ones only; a module's own pre-hook registered in its first call would miss that call): the rows of a
        call made with keywords alone (``model(**batch)``), else more of the probed call's trail; then its
        output probed."""
        import torch

        if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
            return None
        kwargs, output = (rest[0] or {}, rest[1]) if len(rest) == 2 else ({}, rest[0])
        if module is self._top and self._depth:
            self._depth -= 1
            if self._depth == 0 and self._by_keyword:
                self._by_keyword = False
                self._rows(module, _first_tensor(args, kwargs), (args, kwargs))
            elif self._depth == 0 and self._trail is not None and kwargs:
                self._trail.given(kwargs)
            if self._depth == 0 and self._pending is not None:  # the outermost call's output
                rows, self._pending = self._pending, None
                probe = attach(output, rows)
                marks, self._trail = self._trail.close() if self._trail is not None else [], None
                if probe is None and marks:
                    probe = Probe(list(rows), [], open=False)  # outputs not probed (a loss returned): its trail alone
                if probe is not None:
                    probe.trail = marks
                    self._inputs.probes.append(probe)
                    if probe.open and probe.out:
                        self._loss_ops.start(probe.ops)
            elif self._depth == 0 and 0 < self._later < LATER_STEPS and not self.light and module.training \
                    and torch.is_grad_enabled():
                later = Probe([], [], open=False)  # a later step's loss: its calls alone, its outputs not probed
                self._inputs.probes.append(later)
                self._loss_ops.start(later.ops)
        return None

    def take_inputs(self) -> Inputs:
        """The rows seen since the last step; starts the next step's."""
        self._loss_ops.stop()
        got, self._inputs, self._depth = self._inputs, Inputs(), 0
        trail, self._trail = self._trail, None
        if trail is not None:
            trail.close()  # a call that never ended (it raised): its hooks go
        self._probing = self._probing and not got.probes
        self._later += not self._probing  # steps since the probed one (their losses' calls read up to LATER_STEPS)
        for probe in got.probes:
            probe.open = False  # a later backward through these outputs (a GAN's generator) is not this step's
        if self._unsynced:
            add(got.where, UNSYNCED_LAST, self._unsynced)
            self._unsynced = ""
        if got.eval_rows and not got.rows:  # every forward of the step in eval mode: those are its inputs
            got.rows, got.eval_rows = got.eval_rows, []
        return got

    @contextlib.contextmanager
    def installed(self):
        import torch
        from torch.nn.modules import module as M
        from torch.utils.data.distributed import DistributedSampler

        self._handles = [M.register_module_forward_pre_hook(self._pre), self._loss_ops]  # removed alike
        backward, set_epoch, passes = torch.autograd.backward, DistributedSampler.set_epoch, DistributedSampler.__iter__
        watch = self

        def observed_backward(tensors, *args, **kwargs):
            t = tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else tensors
            watch._loss_ops.stop()
            top = isinstance(t, torch.Tensor) and t.numel() == 1 and torch._C._current_autograd_node() is None \
                and not pipeline_inference()
            if top and not watch.light:
                line = user_line()
                add(watch._inputs.where, "backward", line)
                watch._unsynced = line if not watch.fsdp_sync or watch.ddp_unsynced else ""
                watch.before_backward()
            if top:
                watch.saw_loss(t.detach(), sys._getframe(1).f_globals.get("__name__", ""))
            with loss_backward():
                out = backward(tensors, *args, **kwargs)
            if top and not watch.light:
                watch.after_backward()
            return out

        def observed_clip(parameters, max_norm, *args, **kwargs):
            total = clip(parameters, max_norm, *args, **kwargs)
            watch.saw_clip(total, max_norm)
            return total

        def observed_clip_with_norm(parameters, max_norm, total_norm, *args, **kwargs):
            watch.saw_clip(total_norm, max_norm)
            return clip_with_norm(parameters, max_norm, total_norm, *args, **kwargs)

        def observed_pass(sampler):
            watch.sampler_passes += 1
            return passes(sampler)

        def observed_set_epoch(sampler, epoch):
            watch.set_epoch_calls += 1
            return set_epoch(sampler, epoch)

        clip = torch.nn.utils.clip_grad_norm_
        clip_with_norm: Any = getattr(torch.nn.utils, "clip_grads_with_norm_", None)
        patches: List[Tuple[Any, str, Any]] = [(torch.autograd, "backward", observed_backward)]
        if not self.light:  # a companion's run (light) needs its losses and models alone
            patches += [(DistributedSampler, "set_epoch", observed_set_epoch), (DistributedSampler, "__iter__", observed_pass),
                        (torch.nn.utils, "clip_grad_norm_", observed_clip),
                        (torch.nn.utils.clip_grad, "clip_grad_norm_", observed_clip)]
            if clip_with_norm is not None:  # the public two-part API (get_total_norm, then this)
                patches.append((torch.nn.utils, "clip_grads_with_norm_", observed_clip_with_norm))
        patches += self._calls()
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
        for owner, name, patched in patches:
            setattr(owner, name, patched)
        try:
            yield self
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)
            for h in self._handles + list((self._ends or {}).values()):
                h.remove()
            self._ends, self._handles = {}, []

    def _calls(self) -> List[Tuple[Any, str, Any]]:
        """The patches of calls into torch beside the hooks: FSDP1's clip, the schedulers, the GradScaler
        and FSDP2's sync flag; a companion's run (light) only the GradScaler's step, where it follows the
        reference's skips."""
        if self.light:
            return scaler_steps(self) if any(self.follow) else []
        return fsdp1_clip(self) + scheduler_steps(self) + scaler_calls(self) + scaler_steps(self) + \
            fsdp2_sync(self.saw_sync)

    def put_back(self, seen: Inputs) -> None:
        """A step that was not counted: what it saw belongs to the next one."""
        self._inputs = seen.then(self._inputs)

    def saw_loss(self, loss, caller: str) -> None:
        self.loss = loss
        with quiet():  # reading a DTensor loss may gather it: ours, not the loop's
            self._inputs.losses.append(float(loss.reshape(()).double().item()))
        self._inputs.order.append("backward")
        self._inputs.pipeline = self._inputs.pipeline or caller.startswith("torch.distributed.pipelining")

    def before_backward(self) -> None:
        """A later backward pass of a step, after one that left gradients: were they all zeroed since?"""
        if self._inputs.losses and self._left_gradients:
            with quiet():
                grads = [g for g in self._grads() if g is not None and not hasattr(g, "to_local")]
                if not any(bool(g.any()) for g in grads):
                    self._inputs.zeroed.append(len(self._inputs.losses) + 1)

    def after_backward(self) -> None:
        """The total norm of the gradients a backward pass left, before any clipping or scaling (NaN
        where they are sharded: DTensors, FSDP1 flat parameters)."""
        import torch

        with quiet():
            params = [p for root in self.model_roots() for p in self.census.parameters(root) if p.requires_grad]
            grads = [p.grad for p in params if p.grad is not None]
            self._left_gradients = any(bool(g.any()) for g in grads if not hasattr(g, "to_local"))
            sharded = any(hasattr(g, "to_local") for g in grads) or any(is_flat(p) for p in params)
            total = math.nan if sharded or not grads else total_norm(grads)
        self._inputs.raw_norms.append(total)

    def _grads(self) -> List[Any]:
        return [p.grad for root in self.model_roots() for p in self.census.parameters(root) if p.requires_grad]

    def clips_seen(self) -> List[Tuple[float, float, bool]]:
        """The clippings seen in the step under way."""
        return self._inputs.clips

    def saw_scaler(self, call: str, scale: float = math.nan) -> None:
        self._inputs.order.append(call)
        if call == "scale":
            self._inputs.scale = scale
        else:
            add(self._inputs.where, "scaler.unscale_", user_line())

    def saw_sync(self, requires: bool) -> None:
        self.fsdp_sync = requires

    def saw_schedule(self, metric: Any = None, settings: str = "") -> None:
        add(self._inputs.where, "scheduler.step", user_line())
        add(self._inputs.where, PLATEAU, settings)
        if metric is not None:
            with quiet():  # a tensor metric read here: ours, not the loop's
                try:
                    self._inputs.metrics.append(float(metric))
                except (TypeError, ValueError, RuntimeError):  # not one number: nothing to read, nothing failed
                    pass

    def saw_clip(self, total, max_norm) -> None:
        add(self._inputs.where, "clip_grad_norm_", user_line())
        order = self._inputs.order
        if "scale" in order and "unscale_" not in order[len(order) - order[::-1].index("scale"):]:
            self.scaled_clips += 1
        order.append("clip")
        with quiet():
            norm = full_tensor(total)
        self._inputs.clips.append((float(norm), float(max_norm), hasattr(total, "to_local")))

    def model_roots(self) -> List[Any]:
        """The outermost modules run forward, minus those inside another (a checkpointed block)."""
        key = ("model_roots", len(self.roots))  # a root first run forward since: read again
        roots = self.census.derived.get(key)
        if roots is None:
            inner = {id(m) for root in self.roots.values() for m in self.census.modules(root) if m is not root}
            roots = self.census.derived[key] = [m for k, m in self.roots.items() if k not in inner]
        return list(roots)
