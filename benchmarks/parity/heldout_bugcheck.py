"""Check that every bug of a held-out family (``benchmarks/heldout/set2``, ``set3``) changes the training: run the correct loop,
its variants and every bug at 2 ranks (plain ``torch.multiprocessing`` + gloo, no pytest-mgpu), record
the parameters after each ``optimizer.step()`` and every scalar backpropagated, and print per bug the
largest relative parameter difference from the correct run (final step and any step) and the largest
relative loss difference. Also prints rank 0's final parameters against the one-device reference where
both list the same shapes.

    OMP_NUM_THREADS=1 python benchmarks/parity/heldout_bugcheck.py heldout.set2.moe_top2 [world_size]
"""
import importlib, os, sys, traceback, tempfile  # noqa: E401
import torch, torch.distributed as dist, torch.multiprocessing as mp
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
OUT = ""  # the folder of the rows, made in the parent

def capture(store):
    def hook(opt, args, kwargs):
        ps = []
        for g in opt.param_groups:
            for p in g["params"]:
                t = p.detach()
                if hasattr(t, "full_tensor"):
                    t = t.full_tensor()
                ps.append(t.clone())
        store.append(ps)
    return __import__("torch.optim.optimizer", fromlist=["x"]).register_optimizer_step_post_hook(hook)

def body(r, w, fam, cases, initfile, out_dir):
    global OUT
    OUT = out_dir
    os.environ["OMP_NUM_THREADS"] = "1"; torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + initfile, rank=r, world_size=w)
    mod = importlib.import_module("benchmarks." + fam)
    losses = []
    orig = torch.Tensor.backward
    def bw(self, *a, **k):
        if self.numel() == 1:
            v = self.detach()
            if hasattr(v, "full_tensor"): v = v.full_tensor()
            losses.append(float(v))
        return orig(self, *a, **k)
    torch.Tensor.backward = bw
    for bug, variant in cases:
        torch.manual_seed(0)
        losses.clear()
        store = []
        h = capture(store)
        err = None
        try:
            mod.train(w, bug=bug, variant=variant)
        except Exception as e:
            err = traceback.format_exc()[-1500:]
        h.remove()
        torch.save({"steps": store, "err": err, "losses": list(losses)}, f"{OUT}/{fam}.{bug}.{variant}.w{w}.r{r}.pt")
        dist.barrier()
    dist.destroy_process_group()

def ref(fam, w):
    mod = importlib.import_module("benchmarks." + fam)
    torch.manual_seed(0); store = []; h = capture(store)
    mod.reference(w); h.remove(); return store

def diff(a, b):
    if len(a) == len(b) and all(x.shape == y.shape for x, y in zip(a, b)):
        return max(((x - y).norm() / (y.norm() + 1e-12)).item() for x, y in zip(a, b))
    # another order: each of b matched to the nearest of a with its shape (a lower bound)
    out = 0.0
    for y in b:
        cands = [((x - y).norm() / (y.norm() + 1e-12)).item() for x in a if x.shape == y.shape]
        out = max(out, min(cands) if cands else 0.0)
    return out

if __name__ == "__main__":
    OUT = tempfile.mkdtemp(prefix="heldout_bugcheck_")
    fam = sys.argv[1]; w = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    mod = importlib.import_module("benchmarks." + fam)
    cases = [(None, None)] + [(None, v) for v in mod.CORRECT if v != "default"] if w == 2 else [(None, None)]
    if w == 2:
        cases += [(b, None) for b in mod.BUGS]
    initfile = tempfile.mktemp()
    mp.spawn(body, args=(w, fam, cases, initfile, OUT), nprocs=w)
    base = [torch.load(f"{OUT}/{fam}.None.None.w{w}.r{r}.pt") for r in range(w)]
    print(f"{fam}: correct steps {len(base[0]['steps'])}, err {base[0]['err']}")
    # correct vs reference (rank 0, same param order if not flat)
    try:
        rs = ref(fam, w)
        a, b = base[0]["steps"][-1], rs[-1]
        if len(a) == len(b) and all(x.shape == y.shape for x, y in zip(a, b)):
            d = max(((x - y).norm() / (y.norm() + 1e-12)).item() for x, y in zip(a, b))
            print(f"  correct-vs-reference (rank0, final): {d:.2e}; ref steps {len(rs)}")
        else:
            print("  correct-vs-reference: param lists differ in shape; skipped")
    except Exception:
        traceback.print_exc()
    for bug, variant in cases[1:]:
        for r in range(w):
            out = torch.load(f"{OUT}/{fam}.{bug}.{variant}.w{w}.r{r}.pt")
            if out["err"]:
                print(f"  {bug or variant} r{r}: ERROR {out['err'][-400:]}")
                continue
            st, bs = out["steps"], base[r]["steps"]
            if len(st) != len(bs):
                print(f"  {bug or variant} r{r}: steps {len(st)} vs {len(bs)}")
            n = min(len(st), len(bs))
            if n == 0: print(f"  {bug or variant} r{r}: no steps"); continue
            fin = diff(st[n-1], bs[n-1])
            anys = max(diff(st[i], bs[i]) for i in range(n))
            la, lb = out["losses"], base[r]["losses"]
            m = min(len(la), len(lb))
            ld = max([abs(x - y) / (abs(y) + 1e-12) for x, y in zip(la[:m], lb[:m])] + [0.0])
            print(f"  {bug or variant:24s} r{r}: final {fin:.2e}  any-step {anys:.2e}  loss {ld:.2e} ({len(la)} vs {len(lb)} backward)")
