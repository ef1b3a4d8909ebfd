"""``dist.assert_parity(parallel_fn, model_fn, batch_fn)``: the user's own parallel module (a
hand-written model-parallel or pipelined network) against the plain model, step by step.

Both are built in one process that sees every device of the test (stages find theirs in
``rank_context().devices``; cpu on emulated ranks). The reference's initial weights are loaded into
the user's module by name through ``state_dict`` (a tensor registered under two names, like seed
004's ``seq1.0`` and ``conv1``, matches if either name does); both train on the same global
batches with the same loss and optimizer, and a float64 copy of the reference gives each tensor's
roundoff ``floor``. The micro-batches the user's module takes are counted (forward calls of its
layers per step) and enter the tolerance as partial sums, as for the built-in pipeline.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .engine import ParityError, ParityReport, cross_entropy, judge, sgd_momentum
from .evidence.facts import UserFacts
from .batches import call_model, to_float64, tree_to
from .judge.distance import compare, gap
from .precision import ieee_float32
from .records import Portable, RankResult, RunFacts, StepRecord
from .worker import build_model, copy_by_name, model_facts


class ParamNameError(ValueError):
    """Names of the user's module and of the reference that match nothing on the other side."""


@dataclass(frozen=True)
class UserParityJob:
    parallel_fn: Portable
    model_fn: Portable
    batch_fn: Portable
    loss_fn: Portable
    optimizer_fn: Portable
    steps: int
    world_size: int
    param_map: Dict[str, str] = field(default_factory=dict)  # user name -> reference name
    strategy: str = "user"  # read by model_facts
    options: Dict[str, object] = field(default_factory=dict)


def assert_user_parity(dist, parallel_fn, model_fn, batch_fn, *, loss_fn=None, optimizer_fn=None,
                       steps: int = 3, rtol: Optional[float] = None, atol: Optional[float] = None,
                       param_map: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                       deterministic: bool = False) -> ParityReport:
    """Train ``parallel_fn()`` and ``model_fn()`` side by side in one process; raise ParityError
    with the divergence table and likely causes, or return the ParityReport."""
    __tracebackhide__ = True
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    job = UserParityJob(Portable.of(parallel_fn, "parallel_fn"), Portable.of(model_fn, "model_fn"),
                        Portable.of(batch_fn, "batch_fn"), Portable.of(loss_fn or cross_entropy, "loss_fn"),
                        Portable.of(optimizer_fn or sgd_momentum, "optimizer_fn"), steps, dist.world_size,
                        dict(param_map or {}))
    result = dist.run_single(run_user_parity, job, timeout=timeout)
    plan = getattr(dist, "plan", None)
    where = plan.describe() if plan is not None else f"{dist.world_size} x {dist.device_type}"
    report = judge(result, result.facts.strategy, dist.world_size, where, rtol, atol, deterministic)
    if not report.passed:
        raise ParityError(report.failure_message(), report)
    return report


def load_by_name(user, ref, param_map: Dict[str, str]) -> Dict[str, object]:
    """Copy the reference's state into the user's module by name; return reference name -> the
    user's tensor. Raises ParamNameError listing the names that match nothing, on either side."""
    import torch

    ref_state = dict(ref.named_parameters())
    ref_state.update(ref.named_buffers())
    groups: Dict[int, List[str]] = {}  # one tensor, all its names in the user's module
    tensors: Dict[int, object] = {}
    for name, t in list(user.named_parameters(remove_duplicate=False)) + list(user.named_buffers(remove_duplicate=False)):
        groups.setdefault(id(t), []).append(name)
        tensors[id(t)] = t
    unknown = [k for k in param_map if not any(k in names for names in groups.values())]
    user_by_ref: Dict[str, object] = {}
    unmatched_user = []
    for key, names in groups.items():
        targets = [param_map.get(n, n) for n in names if param_map.get(n, n) in ref_state]
        if not targets:
            unmatched_user.append(" = ".join(names))
        for target in targets:
            user_by_ref[target] = tensors[key]
    unmatched_ref = [n for n in ref_state if n not in user_by_ref]
    shapes = [f"{n} {tuple(t.shape)} vs {tuple(ref_state[n].shape)}" for n, t in user_by_ref.items()
              if t.shape != ref_state[n].shape]
    if unmatched_user or unmatched_ref or unknown or shapes:
        raise ParamNameError(_name_message(unmatched_user, unmatched_ref, unknown, shapes))
    with torch.no_grad():
        for name, t in user_by_ref.items():
            t.copy_(ref_state[name].to(device=t.device, dtype=t.dtype))
    return user_by_ref


def _name_message(user: List[str], ref: List[str], unknown: List[str], shapes: List[str]) -> str:
    lines = ["the user's module and the reference do not have the same tensors by name:"]
    if shapes:
        lines.append(f"  same name, another shape (user vs reference): {', '.join(shapes[:12])}")
    if user:
        lines.append(f"  in the user's module only ({len(user)}): {', '.join(user[:12])}")
    if ref:
        lines.append(f"  in the reference only ({len(ref)}): {', '.join(ref[:12])}")
    if unknown:
        lines.append(f"  param_map names the user's module does not have: {', '.join(unknown[:12])}")
    lines.append("Map them with param_map={'<user name>': '<reference name>', ...} (names as in "
                 "state_dict()), or build both from the same layers.")
    return "\n".join(lines)


def stages_of(user, user_by_ref: Dict[str, object]) -> Dict[str, str]:
    """Reference parameter name -> the user's top-level submodule holding it (the largest one, when
    a layer is registered twice, e.g. ``conv1`` and ``seq1``: the stage, not the alias)."""
    children = [(n, {id(p) for p in c.parameters()}) for n, c in user.named_children()]
    out = {}
    for name, t in user_by_ref.items():
        holders = [(len(ids), n) for n, ids in children if id(t) in ids]
        if holders:
            out[name] = max(holders)[1]
    return out


class CallCounter:
    """Forward calls of each parameterized leaf module: the most calls in a step is the number of
    micro-batches the user's module split the batch into."""

    def __init__(self, model):
        self.counts: Dict[str, int] = {}
        self.most = 1
        self.handles = [m.register_forward_hook(self._hook(n)) for n, m in model.named_modules()
                        if not list(m.children()) and list(m.parameters(recurse=False))]

    def _hook(self, name: str):
        def hook(module, args, output):
            self.counts[name] = self.counts.get(name, 0) + 1
        return hook

    def end_step(self) -> None:
        self.most = max([self.most] + list(self.counts.values()))
        self.counts.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def output_order(got, ref) -> Optional[List[int]]:
    """If ``got``'s rows are ``ref``'s rows in another order, the order (row i of got is row
    order[i] of ref); else None."""
    import torch

    if got.shape != ref.shape or got.dim() != 2 or got.shape[0] < 2:
        return None
    g, r = got.detach().double().cpu(), ref.detach().double().cpu()
    dist, order = torch.cdist(g, r).min(dim=1)
    close = dist <= 1e-4 * (1 + r.norm(dim=1).max())
    order = order.tolist()
    if bool(close.all()) and sorted(order) == list(range(len(order))) and order != sorted(order):
        return order
    return None


def _facts(ref, loss_fn, job: UserParityJob, device, stage_of) -> UserFacts:
    base: RunFacts = model_facts(ref, loss_fn, job, job.world_size, device)
    facts = UserFacts(**{f.name: getattr(base, f.name) for f in dataclasses.fields(RunFacts)})
    facts.strategy = f"{job.parallel_fn.ref.qualname} (your parallel module)"
    facts.stage_of = stage_of
    facts.exact_note = "your module computes in its own order"
    facts.params_before_update = False  # each step's parameters are compared after its update
    return facts


def run_user_parity(job: UserParityJob) -> RankResult:
    """Runs in the one process that sees all the test's devices (float32 as IEEE float32 there)."""
    with ieee_float32():
        return _run_user_parity(job)


def _run_user_parity(job: UserParityJob) -> RankResult:
    import torch

    from .._context import rank_context

    ctx = rank_context()
    device = ctx.devices[0] if ctx.device_type == "cuda" and ctx.devices else torch.device("cpu")
    batch_fn, loss_fn, optimizer_fn = job.batch_fn.load(), job.loss_fn.load(), job.optimizer_fn.load()
    ref = build_model(job.model_fn.load(), ctx.seed).to(device)
    user = build_model(job.parallel_fn.load(), ctx.seed)
    user_by_ref = load_by_name(user, ref, job.param_map)
    shadow = copy.deepcopy(ref).double()
    facts = _facts(ref, loss_fn, job, device, stages_of(user, user_by_ref))
    sides = [(ref, optimizer_fn(ref.parameters())), (shadow, optimizer_fn(shadow.parameters())),
             (user, optimizer_fn(user.parameters()))]
    counter = CallCounter(user)
    records = []
    for step in range(job.steps):
        records.append(_step(step, batch_fn(step), sides, loss_fn, device, user_by_ref, facts, counter))
        # the next step starts the reference and its shadow from the user's own state (worker's
        # _Reference.resync says why, measured); optimizer state stays each one's own
        copy_by_name([ref, shadow], user_by_ref)
    counter.remove()
    facts.microbatches = counter.most
    return RankResult(records, facts)


def _step(step, batch, sides, loss_fn, device, user_by_ref, facts: UserFacts, counter) -> StepRecord:
    """One training step of the reference, its float64 shadow and the user's module; the errors."""
    import torch

    inputs, targets = batch
    outs, losses = [], []
    for i, (model, opt) in enumerate(sides):
        opt.zero_grad(set_to_none=True)
        with torch.random.fork_rng(devices=[device.index] if device.type == "cuda" else []):
            x, y = (inputs, targets) if i != 1 else to_float64((inputs, targets))
            out = call_model(model, tree_to(x, device))
            loss = loss_fn(out, tree_to(y, out.device))
            loss.backward()
        outs.append(out.detach())
        losses.append(loss.detach().reshape(()))
    counter.end_step()
    (ref, _), (shadow, _), (user, _) = sides
    if step == 0:
        facts.output_order = output_order(outs[2], outs[0])
        facts.unused = [n for n, p in ref.named_parameters() if p.requires_grad and p.grad is None]
    facts.batch_sizes.append(int(outs[0].shape[0]) if outs[0].dim() else 0)
    rec = StepRecord(step)
    rec.errors += _with_floor("loss", {"loss": losses[2]}, {"loss": losses[0]}, {"loss": losses[1]})
    rec.errors += _with_floor("output", {"output": outs[2]}, {"output": outs[0]}, {"output": outs[1]})
    grad = {n: p.grad for n, p in ref.named_parameters()}
    rec.errors += _with_floor("grad", {n: user_by_ref[n].grad for n in grad}, grad,
                              {n: p.grad for n, p in shadow.named_parameters()})
    for _, opt in sides:
        opt.step()
    for kind, named in (("param", "named_parameters"), ("buffer", "named_buffers")):
        want = dict(getattr(ref, named)())
        rec.errors += _with_floor(kind, {n: user_by_ref[n] for n in want}, want, dict(getattr(shadow, named)()))
    return rec


def _with_floor(kind: str, got: Dict, ref: Dict, wide: Dict):
    """``compare``'s errors, each with its floor ||reference - float64 shadow||."""
    errors = compare(kind, got, ref)
    for e in errors:
        e.floor = gap(ref.get(e.name), wide.get(e.name))
    return errors
