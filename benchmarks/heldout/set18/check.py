"""Check every heldout18 case by hand, without pytest-mgpu: the distributed loop on plain
``torch.multiprocessing`` + gloo ranks, the one-device reference in this process, both from
``torch.manual_seed(0)``; after every ``optimizer.step()`` each side's parameters are kept by name and
compared (heldout6's checker: ``benchmarks/heldout/set6/check.py``, run by heldout15's ``main``, with
heldout17's recorder that keeps only the outermost ``optimizer.step()``; no family of this set nests
optimizer steps, so it records every step). Sharded parameters (``partial_fc_margin``'s class centres)
are put together along their first differing dimension. Printed per case: the largest relative
parameter difference from the reference at the last step and at any step, and between replicas. A correct case should sit at float32 roundoff
(~1e-6), a bug far above it.

    OMP_NUM_THREADS=1 python -m benchmarks.heldout.set18.check [family ...] [--world 4]

The correct variants run at ``--world`` (default 2); without ``--world`` (or with 2) the bugs run too,
at the family's ``BUG_WORLD`` (2 where absent), as ``parity_diagnosis.py`` runs them.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

PKG = "benchmarks.heldout.set18"


def recorder():
    """heldout6's recorder, except that only the outermost ``optimizer.step()`` is kept: a step run inside
    another (``ZeroRedundancyOptimizer.step`` runs its local shard's ``Adam.step``) is not a step of its own."""
    import torch
    from benchmarks.heldout.set6.check import clean
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    roots, steps, init, depth = [], [], {}, [0]

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

    def opt_pre(opt, args, kwargs):
        depth[0] += 1

    def opt_post(opt, args, kwargs):
        depth[0] -= 1
        if depth[0] == 0:
            steps.append({name_of(p): p.detach().clone() for g in opt.param_groups for p in g["params"]})

    hooks = (torch.nn.modules.module.register_module_forward_pre_hook(pre),
             register_optimizer_step_pre_hook(opt_pre), register_optimizer_step_post_hook(opt_post))
    return steps, init, hooks


def rank_body(r, w, module, cases, initfile, out):
    """heldout6's rank body with this recorder."""
    import os
    import traceback

    import torch
    import torch.distributed as tdist
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


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from benchmarks.heldout.set15.check import main  # heldout15's checker, with this set's recorder

    main(sys.argv[1:], PKG, body=rank_body, record=recorder)
