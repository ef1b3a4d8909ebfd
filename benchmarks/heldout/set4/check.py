"""Check every case of a heldout4 family WITHOUT the plugin: the distributed loop on W gloo CPU ranks
(plain ``torch.multiprocessing``), the one-device reference in this process, both from seed 0, the
parameters recorded after every ``optimizer.step()`` (torch's global step hook). Prints, per case and
rank, the step counts and the largest relative parameter difference from the reference (final step
and any step): a correct variant should agree to float32 roundoff, a bug should differ measurably.

    OMP_NUM_THREADS=1 python benchmarks/heldout/set4/check.py fabric_vit [world_size] [case,case]
"""
import importlib, os, sys, tempfile, traceback  # noqa: E401
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def capture(store):
    def hook(opt, args, kwargs):
        store.append([p.detach().clone().float() for g in opt.param_groups for p in g["params"]])
    return register_optimizer_step_post_hook(hook)


def body(r, w, fam, cases, initfile, out):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + initfile, rank=r, world_size=w)
    mod = importlib.import_module("benchmarks.heldout.set4." + fam)
    for bug, variant in cases:
        torch.manual_seed(0)
        store, err = [], None
        h = capture(store)
        try:
            mod.train(w, bug=bug, variant=variant)
        except Exception:
            err = traceback.format_exc()[-2500:]
        h.remove()
        torch.save({"steps": store, "err": err}, f"{out}/{bug}.{variant}.r{r}.pt")
        dist.barrier()
    dist.destroy_process_group()


def diff(a, b):
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return float("nan")
    return max(((x - y).norm() / (y.norm() + 1e-12)).item() for x, y in zip(a, b))


def main():
    fam = sys.argv[1]
    w = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    mod = importlib.import_module("benchmarks.heldout.set4." + fam)
    cases = [(None, None if v == "default" else v) for v, ws in mod.CORRECT.items() if w in ws]
    if w == 2:
        cases += [(b, None) for b in mod.BUGS]
    if only:
        cases = [c for c in cases if (c[0] or c[1] or "default") in only]
    out = tempfile.mkdtemp(prefix="ho4check_")
    mp.spawn(body, args=(w, fam, cases, tempfile.mktemp(), out), nprocs=w)
    torch.manual_seed(0)
    ref = []
    h = capture(ref)
    mod.reference(w)
    h.remove()
    print(f"{fam} w{w}: reference steps {len(ref)} (STEPS={mod.STEPS})")
    for bug, variant in cases:
        name = f"bug {bug}" if bug else f"ok  {variant or 'default'}"
        cells = []
        for r in range(w):
            got = torch.load(f"{out}/{bug}.{variant}.r{r}.pt")
            if got["err"]:
                print(f"  {name} r{r}: ERROR\n{got['err']}")
                continue
            st = got["steps"]
            n = min(len(st), len(ref), mod.STEPS)
            if n == 0:
                cells.append(f"r{r}: no steps")
                continue
            fin = diff(st[n - 1], ref[n - 1])
            anys = max(diff(st[i], ref[i]) for i in range(n))
            first = next((i for i in range(n) if diff(st[i], ref[i]) > 1e-4), None)
            cells.append(f"r{r}: {len(st)} steps final {fin:.1e} any {anys:.1e} first>1e-4 {first}")
        print(f"  {name:28s} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
