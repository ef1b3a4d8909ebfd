"""Check every heldout15 case by hand, without pytest-mgpu: the distributed loop on plain
``torch.multiprocessing`` + gloo ranks, the one-device reference in this process, both from
``torch.manual_seed(0)``; after every ``optimizer.step()`` each side's parameters are kept by name and
compared (heldout6's checker: ``benchmarks/heldout/set6/check.py``). Printed per case: the largest
relative parameter difference from the reference at the last step and at any step, and between
replicas. A correct case should sit at float32 roundoff (~1e-6), a bug far above it.

    OMP_NUM_THREADS=1 python -m benchmarks.heldout.set15.check [family ...] [--world 4]

The correct variants run at ``--world`` (default 2); without ``--world`` (or with 2) the bugs run too,
at the family's ``BUG_WORLD`` (2 where absent), as ``parity_diagnosis.py`` runs them.
"""
from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path

PKG = "benchmarks.heldout.set15"


def run_cases(fam: str, w: int, bugs: bool, pkg: str = PKG, body=None, record=None) -> None:
    """heldout6's ``run_family``, with the bugs included at ``w`` when ``bugs``; ``pkg`` the set's package
    (later sets call this with theirs), ``body`` / ``record`` a rank body and recorder other than heldout6's."""
    import torch
    import torch.multiprocessing as mp
    from benchmarks.heldout.set6.check import compare, rank_body, recorder

    body, record = body or rank_body, record or recorder
    mod = importlib.import_module(f"{pkg}.{fam}")
    cases = [] if bugs else [(None, v if v != "default" else None) for v, ws in mod.CORRECT.items() if w in ws]
    cases += [(b, None) for b in mod.BUGS] if bugs else []
    if not cases:
        return
    out = tempfile.mkdtemp(prefix=f"{pkg.rsplit('.', 1)[-1]}_{fam}_")
    mp.spawn(body, args=(w, f"{pkg}.{fam}", cases, tempfile.mktemp(), out), nprocs=w)
    torch.manual_seed(0)
    ref_steps, _, hooks = record()
    mod.reference(w)
    for h in hooks:
        h.remove()
    print(f"{fam} (w={w}, reference steps {len(ref_steps)})", flush=True)
    for bug, variant in cases:
        rows = [torch.load(f"{out}/{bug}.{variant}.r{r}.pt") for r in range(w)]
        label = f"ok-{variant or 'default'}" if bug is None else bug
        errs = [x["err"] for x in rows if x["err"]]
        if errs:
            print(f"  {label:24s} ERROR {errs[0][-600:]}", flush=True)
            continue
        last, worst, spread, note = compare(rows, ref_steps, getattr(mod, "SHARDS", {}))
        print(f"  {label:24s} last {last:.2e}  any-step {worst:.2e}  replicas {spread:.2e}  {note}", flush=True)


def main(args: list[str], pkg: str = PKG, **how) -> None:
    """Run the families of ``pkg`` (all, or those named): correct variants at ``--world W``, bugs at
    BUG_WORLD; ``how``: ``body`` / ``record`` for ``run_cases``."""
    w = 2
    if "--world" in args:
        i = args.index("--world")
        w = int(args[i + 1])
        args = args[:i] + args[i + 2:]
    for fam in args or importlib.import_module(pkg).FAMILIES:
        mod = importlib.import_module(f"{pkg}.{fam}")
        run_cases(fam, w, False, pkg, **how)
        if w == 2:
            run_cases(fam, getattr(mod, "BUG_WORLD", 2), True, pkg, **how)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    main(sys.argv[1:])
