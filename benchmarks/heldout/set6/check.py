"""Check every heldout6 case by hand, without pytest-mgpu: the distributed loop on plain
``torch.multiprocessing`` + gloo ranks, the one-device reference in this process, both from
``torch.manual_seed(0)``. After every ``optimizer.step()`` each side's parameters are kept by name
(the name in the outermost module run forward that holds them, DDP's ``module.`` removed); the
ranks' tensors are put together in rank order (a tensor of the reference's shape: rank 0's, the
ranks' spread printed; a tensor one rank holds: that rank's; a sliced tensor: the family's ``SHARDS``
entry, else concatenated along the dimension whose size differs). Printed per case: the largest
relative parameter difference from the reference, ``||ranks - ref|| / ||ref||``, at the last step
and at any step, and the largest relative difference between replicas. A correct case should sit at
float32 roundoff (~1e-6), a bug far above it.

    OMP_NUM_THREADS=1 python -m benchmarks.heldout.set6.check [family ...] [--world 4]
"""
from __future__ import annotations

import importlib
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from torch.optim.optimizer import register_optimizer_step_post_hook

PKG = "benchmarks.heldout.set6"


def clean(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (DDP's ``module.``, Fabric's ``_forward_module.``)."""
    for prefix in ("_forward_module.", "module."):
        name = name.removeprefix(prefix)
    return name


def recorder():
    """Hooks that keep, after each optimizer step, {name: parameter copy}."""
    roots: list[torch.nn.Module] = []
    steps: list[dict[str, torch.Tensor]] = []
    init: dict[str, torch.Tensor] = {}

    def pre(mod, args):
        if not roots:
            init.update({clean(n): p.detach().clone() for n, p in mod.named_parameters()})
        if not any(mod is r for r in roots):
            roots.append(mod)

    def name_of(p):
        for root in roots:
            for n, q in root.named_parameters():
                if q is p:
                    return clean(n)
        return f"?{id(p)}"

    def post(opt, args, kwargs):
        steps.append({name_of(p): p.detach().clone() for g in opt.param_groups for p in g["params"]})

    h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    h2 = register_optimizer_step_post_hook(post)
    return steps, init, (h1, h2)


def rank_body(r, w, module, cases, initfile, out):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method="file://" + initfile, rank=r, world_size=w)
    mod = importlib.import_module(module)
    for bug, variant in cases:
        torch.manual_seed(0)
        steps, init, hooks = recorder()
        err = None
        try:
            mod.train(w, bug=bug, variant=variant)
        except Exception:
            err = traceback.format_exc()[-1500:]
        for h in hooks:
            h.remove()
        torch.save({"steps": steps, "init": init, "err": err}, f"{out}/{bug}.{variant}.r{r}.pt")
        tdist.barrier()
    tdist.destroy_process_group()


def assemble(name, pieces, ref, shards):
    """The ranks' tensors of ``name`` as one tensor of the reference's shape; and the replicas' spread."""
    same = [p for p in pieces if p is not None and p.shape == ref.shape]
    if len(same) == len([p for p in pieces if p is not None]) and same:
        spread = max(((p - same[0]).norm() / (same[0].norm() + 1e-12)).item() for p in same)
        return same[0], spread
    how = next((v for k, v in shards.items() if name.endswith(k)), None)
    pieces = [p for p in pieces if p is not None]
    if callable(how):
        return how(pieces), 0.0
    if how is None:
        how = next(i for i, (a, b) in enumerate(zip(pieces[0].shape, ref.shape)) if a != b)
    return torch.cat(pieces, how), 0.0


def states(row, n):
    """The rank's parameters after each of ``n`` reference steps: its own step's where it took one,
    else its last known state (its initial parameters where it took none: a rank that never steps)."""
    cur, out = dict(row["init"]), []
    for i in range(n):
        if i < len(row["steps"]):
            cur = {**cur, **row["steps"][i]}
        out.append(cur)
    return out


def compare(rows, ref_steps, shards):
    n = min(len(r["steps"]) for r in rows)
    per_rank = [states(r, len(ref_steps)) for r in rows]
    worst, spread_max, last, where = 0.0, 0.0, 0.0, ""
    for i in range(len(ref_steps)):
        step_worst = 0.0
        for name, ref in ref_steps[i].items():
            pieces = [s[i].get(name) for s in per_rank]
            if all(p is None for p in pieces):
                return float("nan"), float("nan"), float("nan"), f"{name} missing on the ranks"
            full, spread = assemble(name, pieces, ref, shards)
            d = ((full - ref).norm() / (ref.norm() + 1e-12)).item()
            if d > worst and d > step_worst:
                where = f"worst {name} at step {i}"
            step_worst = max(step_worst, d)
            spread_max = max(spread_max, spread)
        worst, last = max(worst, step_worst), step_worst
    note = where if n == len(ref_steps) else f"steps {[len(r['steps']) for r in rows]} vs reference {len(ref_steps)}"
    return last, worst, spread_max, note


def run_family(fam: str, w: int, pkg: str = PKG) -> None:
    mod = importlib.import_module(f"{pkg}.{fam}")
    cases = [(None, v if v != "default" else None) for v, ws in mod.CORRECT.items() if w in ws]
    if w == 2:
        cases += [(b, None) for b in mod.BUGS]
    out = tempfile.mkdtemp(prefix=f"{pkg.rsplit('.', 1)[-1]}_{fam}_")
    mp.spawn(rank_body, args=(w, f"{pkg}.{fam}", cases, tempfile.mktemp(), out), nprocs=w)
    torch.manual_seed(0)
    ref_steps, _, hooks = recorder()
    mod.reference(w)
    for h in hooks:
        h.remove()
    shards = getattr(mod, "SHARDS", {})
    print(f"{fam} (w={w}, reference steps {len(ref_steps)})")
    for bug, variant in cases:
        rows = [torch.load(f"{out}/{bug}.{variant}.r{r}.pt") for r in range(w)]
        label = f"ok-{variant or 'default'}" if bug is None else bug
        errs = [x["err"] for x in rows if x["err"]]
        if errs:
            print(f"  {label:24s} ERROR {errs[0][-600:]}")
            continue
        last, worst, spread, note = compare(rows, ref_steps, shards)
        print(f"  {label:24s} last {last:.2e}  any-step {worst:.2e}  replicas {spread:.2e}  {note}")


def main(pkg: str, args: list[str]) -> None:
    """Run ``pkg``'s families (all, or those named), at ``--world W`` (default 2)."""
    w = 2
    if "--world" in args:
        i = args.index("--world")
        w = int(args[i + 1])
        args = args[:i] + args[i + 2:]
    for fam in args or importlib.import_module(pkg).FAMILIES:
        run_family(fam, w, pkg)


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
    main(PKG, sys.argv[1:])
