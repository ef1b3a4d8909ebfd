"""``record="optimizer"``: a step is one ``optimizer.step()``, recorded through torch's global
optimizer step hooks, so the user's loop runs as written: no ``log`` to call, no subclass of their
``Trainer`` to write, no data set sized to the number of steps.

At each step (``register_optimizer_step_pre_hook``) it records, before the update, the parameters
the optimizer steps and their gradients, named by the model that owns them (the outermost module
run forward, wrappers removed as ``log`` does: DDP, torch.compile, FSDP1, checkpoint wrappers;
DTensors gathered), and the loss: the scalar last backpropagated (``watch.Watch``). After the N-th
step (``register_optimizer_step_post_hook``) it records the parameters once more and stops the
loop with ``StopTraining``, a ``BaseException`` so that a loop's own ``except Exception`` does not
swallow it; every rank takes the same steps, so every rank stops at the same point, after the
step's collectives have completed.

An optimizer step inside another (ZeroRedundancyOptimizer steps its local optimizer) is one step.
A step that cannot train is not counted (``SideLog.uncounted``): every gradient zero (or none) and
no parameter changed, as when DCP's ``set_optimizer_state_dict`` creates the optimizer's state with
one ``step()`` at lr 0. A step at lr 0 with gradients (a warm-up that starts at 0) is a step: the
optimizer's state moves, and the loop counts it. The loss of a step is every scalar
backpropagated since the previous step (``watch.Inputs.loss``): gradient accumulation included.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...timing.structure.counter import quiet
from .census import Census
from .mesh import tp_peers
from .recorder import (SideLog, StepLog, clean_name, describe, dtype_name, fsdp1_full_params, full_copies, grad_of,
                       unwrap)
from .fsdp1_flat import expand, is_flat, units
from .prints import weights
from .inputs import Inputs
from .watch import Watch
from .where import STEP_DEFINED, add, frozen, step_defined, user_line


class StopTraining(BaseException):
    """Raised from the N-th ``optimizer.step()``: ends the user's loop; caught by the runner."""


def prefixed(roots: List[Any], merge: bool = True) -> List[Tuple[str, Any]]:
    """(name prefix, model): no prefix for one model, nor for several whose parameter names do not
    collide (the stages one rank holds in an interleaved pipeline); the class name (and a count where
    two models share one) where a loop trains several, the same on both sides; with ``merge=False``
    the class names wherever there are several (the state no optimizer steps, named by its model)."""
    if len(roots) == 1:
        return [("", roots[0])]
    names = [[clean_name(n) for n, _ in unwrap(root).named_parameters()] for root in roots] if merge else []
    if merge and sum(map(len, names)) == len(set().union(*map(set, names))):
        return [("", root) for root in roots]  # parts of one model (pipeline stages of one rank): their own names
    out: List[Tuple[str, Any]] = []
    seen: Dict[str, int] = {}
    for root in roots:
        cls = type(unwrap(root)).__name__
        seen[cls] = seen.get(cls, 0) + 1
        out.append((f"{cls}{seen[cls] - 1 if seen[cls] > 1 else ''}.", root))
    return out


class StepRecorder:
    """The global step hooks for one loop (``installed()``); ``side`` is what they recorded."""

    def __init__(self, steps: int, watch: Watch, on_first: Optional[Callable[[SideLog], None]] = None):
        self.steps, self.watch, self.on_first = steps, watch, on_first
        self.side = SideLog()
        self._depth = 0
        self._names: Dict[int, Tuple[tuple, Dict[int, str]]] = {}  # id(optimizer) -> (param ids, names)
        self._idle = False  # the step under way has every lr 0 and no gradient: it cannot train
        self._before: Optional[Dict[str, Any]] = None  # local params where every gradient was zero
        self._seen: Optional[Inputs] = None  # what the step under way saw
        self._aside: List[StepLog] = []  # steps that changed nothing: not counted
        self._taken = False  # the step under way was recorded (a closure it was given may not have run)
        if not watch.light:
            watch.on_new_root = self._start_state

    @contextlib.contextmanager
    def installed(self):
        with step_hooks(self._pre, self._post):
            yield self

    # -- the hooks ------------------------------------------------------------------------------
    def _pre(self, optimizer, args, kwargs):
        self._depth += 1
        if self._depth > 1:
            return None
        self._taken = False
        closure = kwargs.get("closure", args[0] if args else None)
        if not callable(closure):
            self._take(optimizer)
            return None
        return self._after_closure(optimizer, closure, args, kwargs)

    def _after_closure(self, optimizer, closure, args, kwargs):
        """``optimizer.step(closure)`` (Lightning's Trainer, LBFGS): the closure runs the forward and
        backward inside the step, so the step is recorded once its first call has returned, before the
        update (the pre-hook hands the step a closure that records)."""
        taken: List[bool] = []

        def recorded(*a, **k):
            loss = closure(*a, **k)
            if not taken:
                taken.append(True)
                with quiet():
                    self._take(optimizer)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": recorded}
        return (recorded,) + tuple(args[1:]), kwargs

    def _take(self, optimizer) -> None:
        """Record the step under way: its parameters, gradients, loss and state, before the update."""
        self._taken = True
        census = self.watch.census
        census.clear()  # the trees as they are now: read once for the step's recording
        named = self._named(optimizer)
        lrs = [float(g["lr"]) for g in optimizer.param_groups if "lr" in g]
        models = self._owners(named)
        params, grads = read_full(named, models, census)
        self._idle = bool(lrs) and not any(lrs) and all(g is None or not bool(g.any()) for g in grads.values())
        if any(g is not None for g in grads.values()) and all(g is None or not bool(g.any()) for g in grads.values()):
            self._before = {n: _local(p).detach().clone() for n, p in named}
        if not self.side.steps:
            describe(self.side, models, params)
            self.side.tp_peers = tp_peers([unwrap(root) for _, root in models])
            self.side.autocast = self.watch.autocast
            self.side.loss_dtype = dtype_name(self.watch.loss.dtype) if self.watch.loss is not None else ""
        seen = self._seen = self.watch.take_inputs()
        if self.watch.light:  # a companion's run: its distances read the loss, gradients and parameters
            self.side.steps.append(StepLog(seen.loss(), grads, params, backwards=len(seen.losses), lrs=lrs))
        else:
            add(seen.where, "optimizer.step", user_line())
            add(seen.where, STEP_DEFINED, step_defined(optimizer))
            self.side.steps.append(StepLog(
                seen.loss(), grads, params, seen.rows, len(seen.losses), lrs, seen.clips, optimizer_state(optimizer),
                hyperparameters(optimizer), untrained_state(prefixed(self.watch.model_roots(), merge=False), named,
                                                            list(self.watch.stateful.values()), census,
                                                            {i for ids, _ in self._names.values() for i in ids}),
                seen.raw_norms[-1] if seen.raw_norms else float("nan"), seen.zeroed, eval_modes(models, census),
                frozen(seen.where), (seen.scale, tuple(seen.order)), seen.chunks, seen.probes, seen.metrics))
        census.clear()  # the next step's forward passes walk them again
        if self.on_first and len(self.side.steps) == 1:
            self.on_first(self.side)

    def _post(self, optimizer, args, kwargs) -> None:
        self._depth -= 1
        if self._depth > 0 or not self._taken:
            return
        self.watch.census.clear()
        if self._changed_nothing(optimizer):
            self._aside.append(self.side.steps.pop())
            self.side.uncounted += 1
            if self._seen is not None:
                self.watch.put_back(self._seen)  # its loss and rows belong to the next step
            if self.side.steps or len(self._aside) < self.steps:
                return
            # every step so far changed nothing: they are the run (and nothing_compared says so)
            self.side.steps, self.side.uncounted = self._aside[:self.steps], 0
        elif len(self.side.steps) < self.steps:
            return
        named = self._named(optimizer)
        self.side.final = read_full(named, self._owners(named), self.watch.census)[0]
        self.watch.census.clear()
        raise StopTraining(f"stopped after optimizer step {self.steps}")

    def _changed_nothing(self, optimizer) -> bool:
        """Every lr 0 with no gradient, or every gradient zero and every parameter as it was before."""
        import torch

        before, self._before = self._before, None
        if self._idle:
            return True
        return before is not None and all(torch.equal(_local(p), before[n]) for n, p in self._named(optimizer))

    def _start_state(self, module: Any) -> None:
        """Before the first forward of ``module``, a model first run (first step only): the state it
        starts from (fingerprints of its buffers and parameters), read against step 0's to tell state
        loaded otherwise from state a forward updates (a queue, a memory bank). A model's first value is
        kept; one named otherwise once a second model runs is left out (and the readings say nothing)."""
        if self.side.steps:
            return
        with quiet():
            roots = [(p, r) for p, r in prefixed(self.watch.model_roots(), merge=False) if r is module]
            for name, value in untrained_state(roots, []).items():
                self.side.start.setdefault(name, value)

    # -- names ----------------------------------------------------------------------------------
    def _owners(self, named: List[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
        """The models whose parameters this optimizer steps (as named by ``_named``)."""
        return self._models_of([p for _, p in named])

    def _models_of(self, params: List[Any]) -> List[Tuple[str, Any]]:
        """(name prefix, model) of the models run forward that own some of ``params`` (all of them
        where none does). A model rebuilt in the same process (reloaded from a checkpoint) leaves the
        first one among the roots: only the models an optimizer steps name its parameters, so the
        rebuilt one takes no class prefix."""
        key = ("owners", tuple(id(p) for p in params))  # asked twice a step: once per census window
        got = self.watch.census.derived.get(key)
        if got is None:
            ids = {id(p) for p in params}
            roots = self.watch.model_roots()
            owners = [r for r in roots if any(id(p) in ids for p in self.watch.census.parameters(unwrap(r)))]
            got = self.watch.census.derived[key] = prefixed(owners or roots)
        return list(got)

    def _named(self, optimizer) -> List[Tuple[str, Any]]:
        """The optimizer's parameters under their model names (computed once per optimizer)."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        key = tuple(id(p) for p in params)
        cached = self._names.get(id(optimizer))
        if cached is None or cached[0] != key:
            cached = (key, self._name_map(params))
            if not self.side.foreign:  # a model not run forward yet (DCP's state initialisation): ask again
                self._names[id(optimizer)] = cached
        names = cached[1]
        return [(names[id(p)], p) for p in params]

    def _name_map(self, params: List[Any]) -> Dict[int, str]:
        owned: Dict[int, str] = {}
        trained: List[Tuple[str, Any]] = []
        for prefix, root in self._models_of(params):
            for n, p in unwrap(root).named_parameters():
                if id(p) not in owned:
                    owned[id(p)] = prefix + clean_name(n)
                    trained.append((owned[id(p)], p))
        names = {id(p): owned[id(p)] for p in params if id(p) in owned}
        foreign = [p for p in params if id(p) not in owned]
        if foreign and trained:
            names.update(self._foreign(foreign, trained, params))
        for i, p in enumerate(foreign):
            names.setdefault(id(p), f"optimizer.param{i}")
        self.side.foreign = [names[id(p)] for p in foreign]
        return names

    def _foreign(self, foreign, trained, params) -> Dict[int, str]:
        """Parameters the optimizer steps that no model run forward owns. If they are, in order and
        shape, the trained model's (a copy made after the optimizer: ``copy.deepcopy``, a model
        rebuilt or reloaded), they take its names, so the comparison lines them up; the side keeps
        the trained model's parameters that no optimizer steps, the evidence for the hint."""
        stepped = {id(p) for p in params}
        unstepped = [(n, p) for n, p in trained if p.requires_grad and id(p) not in stepped]
        self.side.unstepped = [n for n, _ in unstepped]
        if [tuple(p.shape) for p in foreign] == [tuple(p.shape) for _, p in unstepped]:
            return {id(p): n for p, (n, _) in zip(foreign, unstepped)}
        return {}


def read_full(named: List[Tuple[str, Any]], models: List[Tuple[str, Any]],
              census: Optional[Census] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(params, grads): CPU copies of whole tensors, under the models' names. DTensors are gathered,
    FSDP1 units unsharded (with ``use_orig_params=False``, each flat parameter is read as torch lays
    it out: ``fsdp1_flat``). ``census``: the models' trees as the step's recording walked them."""
    flats = units([unwrap(root) for _, root in models]) if any(is_flat(p) for _, p in named) else {}
    params: Dict[str, Any] = {}
    grads: Dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        if not flats:
            for _, root in models:
                stack.enter_context(fsdp1_full_params(root, census.modules(root) if census else None))
        plain: List[Tuple[str, Any]] = []
        for n, p in named:
            if id(p) in flats:
                path, unit = flats[id(p)]
                more, more_grads = expand(p, path, unit, clean_name)
                params.update(more)
                grads.update(more_grads)
            else:
                plain.append((n, p))
                grads[n] = params[n] = None  # its place in the order, filled below
        copies = full_copies([grad_of(p) for _, p in plain] + [p for _, p in plain])  # DTensors gathered together
        for i, (n, _) in enumerate(plain):
            grads[n], params[n] = copies[i], copies[len(plain) + i]
    return params, grads


@contextlib.contextmanager
def step_hooks(pre: Callable, post: Callable):
    """torch's global optimizer step pre and post hooks, ``quietly``, for the ``with`` block."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    handles = [register_optimizer_step_pre_hook(quietly(pre)), register_optimizer_step_post_hook(quietly(post))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def quietly(hook: Callable) -> Callable:
    """``hook`` with every collective counter paused (``assert_same_training``'s structure): what
    the recorder gathers is ours, not the loop's."""

    def run(*args):
        with quiet():
            return hook(*args)

    return run


def _local(p):
    """This rank's part of a parameter (a DTensor's local shard): compared without a collective."""
    return p.to_local() if hasattr(p, "to_local") else p


def optimizer_state(optimizer) -> Tuple[int, float]:
    """(how many parameters have optimizer state, the largest step count in it; -1 where none
    counts): what a restored optimizer must have, and a fresh one does not."""
    held, step = 0, -1.0
    inner = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer keeps its state in its local optimizer
    source = inner if inner is not None and hasattr(inner, "state") and not optimizer.state else optimizer
    for state in source.state.values():
        if state:
            held += 1
            count = state.get("step")
            if count is not None:
                step = max(step, float(count))
    return held, step


def hyperparameters(optimizer) -> List[Dict[str, float]]:
    """Each param group's numeric options other than its parameters and lr (weight_decay, momentum,
    betas as beta0/beta1, eps): what an optimizer built otherwise on one side differs in."""
    out = []
    for group in optimizer.param_groups:
        got: Dict[str, float] = {}
        if not any(is_flat(p) for p in group["params"]):  # an FSDP1 flat parameter is a shard's size
            got["parameters"] = float(sum(p.numel() for p in group["params"]))  # a DTensor counts its global size
        for key, value in group.items():
            if key in ("params", "lr", "initial_lr") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                got[key] = float(value)
            elif isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value):
                got.update({f"{key}{i}": float(v) for i, v in enumerate(value)})
        out.append(got)
    return out


def untrained_state(roots: List[Tuple[str, Any]], stepped: List[Tuple[str, Any]],
                    stateful: Sequence[Any] = (), census: Optional[Census] = None,
                    others: Optional[set] = None) -> Dict[str, float]:
    """A fingerprint of each floating tensor of the models run forward that no optimizer steps: the
    parameters of a model trained otherwise (an EMA teacher) and buffers other than the running
    statistics of a BatchNorm in training mode (which follow each rank's shard by design; a frozen one,
    in eval mode, normalises with them: they are compared). Local tensors only (no collective);
    DTensors are left out. ``census``: the trees as the step's recording walked them; ``others``: ids of
    parameters another optimizer of the loop steps (a second optimizer's are trained, not state)."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    census = census or Census()
    ids = {id(p) for _, p in stepped} | (others or set())
    out: Dict[str, float] = {}
    tensors: List[Tuple[str, Any]] = []
    for prefix, root in roots:
        model = unwrap(root)
        norms = {id(b) for m in census.modules(model) if isinstance(m, _BatchNorm) and m.training
                 for b in m.buffers(recurse=False)}  # a BatchNorm in eval() normalises with them: compared
        tensors += [(prefix + n, t) for n, t in census.named_parameters(model) if id(t) not in ids]
        tensors += [(prefix + n, t) for n, t in census.named_buffers(model) if id(t) not in norms]
    for module in stateful:
        tensors += [(f"{type(module).__name__}.{n}", t) for n, t in module.named_buffers()]
    for name, t in tensors:
        if t.is_floating_point() and not hasattr(t, "to_local") and t.numel():
            out[clean_name(name)] = float(t.detach().reshape(-1).to("cpu", torch.float64) @ weights(t.numel()))
    return out


def eval_modes(roots: List[Tuple[str, Any]], census: Optional[Census] = None) -> Tuple[int, int]:
    """(in eval mode, in all) among the BatchNorm and dropout modules of the trained models: the
    modules whose mode changes what a step computes (left in eval() after a validation pass)."""
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd

    census = census or Census()
    mods = [m for _, root in roots for m in census.modules(unwrap(root)) if isinstance(m, (_BatchNorm, _DropoutNd))]
    return sum(not m.training for m in mods), len(mods)
