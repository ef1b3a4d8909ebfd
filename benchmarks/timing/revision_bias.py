"""Does a set of warm ranks carry a speed of its own? A/A duets of the revision lane.

The revision lane (``--mgpu-against``) times the head on one set of warm ranks and the base on
another, in interleaved pairs. Pairs cancel the machine's drift, but not anything that stays with a
set of processes for as long as it lives (where its memory landed, how the scheduler placed it): the
bootstrap interval over pairs cannot see such a bias, since every pair carries it alike.

Each trial here is one ``run_duet`` of the SAME function on both sides (nothing changed: the true
ratio is 1), judged by ``pairing.judge_pairs``. Two ways of choosing the ranks:

    reused:  the same two sets of warm ranks for every trial (as one pytest session's lane did: one
             pool per world size for the whole session)
    fresh:   new sets of ranks for every trial

If sets of ranks carry a bias, "reused" trials agree with each other around a ratio other than 1,
and "fresh" trials scatter between trials far more than each trial's own interval says. Printed: per
trial the ratio and interval, and per mode the spread of the trials' log ratios against the
intervals' implied standard error.

    python benchmarks/timing/revision_bias.py --trials 8 --budget-s 3 [--step resnet18-ddp]

Prints; asserts nothing.
"""
from __future__ import annotations

import argparse
import math
import os
import pickle
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

STEPS = {  # name: (module, function, args, world size)
    "resnet18-ddp": ("suites.timing_models", "ddp_step", ("resnet18", 8, 32), 2),
    "mobilenet-ddp": ("suites.timing_models", "ddp_step", ("mobilenet_v2", 8, 32), 2),
    "resnet18-single": ("suites.timing_models", "single_step", ("resnet18", 8, 32), 1),
    "resnet18-ddp-pinned": ("revision_bias", "pinned", ("ddp_step", "resnet18", 8, 32), 2),
}


def pinned(name, *args):
    """The suites' step, with rank r pinned to core r (mod the cores this process may use)."""
    import torch.distributed as tdist

    from suites import timing_models

    cores = sorted(os.sched_getaffinity(0))
    for tid in os.listdir("/proc/self/task"):  # every thread: gloo's were started with the group
        os.sched_setaffinity(int(tid), {cores[tdist.get_rank() % len(cores)]})
    return getattr(timing_models, name)(*args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=3.0)
    ap.add_argument("--step", default="resnet18-ddp", choices=sorted(STEPS))
    ap.add_argument("--modes", nargs="+", default=["reused", "fresh"])
    args = ap.parse_args(argv)

    from pytest_mgpu.devices import detect_hardware, plan_for
    from pytest_mgpu.launch.base import LaunchSpec
    from pytest_mgpu.launch.pool import PoolLauncher
    from pytest_mgpu.launch.protocol import FnRef
    from pytest_mgpu.launch.rendezvous import StoreServer
    from pytest_mgpu.timing.inrank import LoopConfig
    from pytest_mgpu.timing.pairing import judge_pairs
    from pytest_mgpu.timing.revision import Version, run_duet

    module, qualname, fargs, world = STEPS[args.step]
    plan = plan_for(world, detect_hardware(), "cpu")
    spec = LaunchSpec(nprocs=world, backend=plan.backend, device_type=plan.device_type, emulated=plan.emulated,
                      label="revision_bias")
    here = os.path.abspath(__file__) if module == "revision_bias" else None
    ref = FnRef(module, qualname, here or os.path.join(ROOT, *module.split(".")) + ".py")
    payload = pickle.dumps((fargs, {}))
    store = StoreServer()
    rng = random.Random(0)
    print(f"step {args.step} on {world} rank(s), {args.budget_s} s of turns per trial; load {os.getloadavg()[0]:.1f}")
    for mode in args.modes:
        launchers = [PoolLauncher(), PoolLauncher()]
        logs, ses = [], []
        for trial in range(args.trials):
            if mode == "fresh" and trial:
                for la in launchers:
                    la.close()
                launchers = [PoolLauncher(), PoolLauncher()]
            t0 = time.perf_counter()
            d = run_duet(Version("head", ref), Version("base", ref), launchers, spec, payload, LoopConfig(None, None, 0.4),
                         args.budget_s, store, rng, 0.10)
            v = judge_pairs(d.head, d.base, 0.10, d.blocks)
            lo, hi = math.log(v.low or 1), math.log(v.high or 1)
            logs.append(math.log(v.ratio))
            ses.append((hi - lo) / (2 * 2.576))
            print(f"  {mode:6s} trial {trial + 1:2d}: x{v.ratio:.3f} [{v.low or 0:.3f}, {v.high or 0:.3f}] {v.status.value:8s} "
                  f"{v.pairs:3d} pairs, step {statistics.median(d.head):.4f}/{statistics.median(d.base):.4f} s, "
                  f"{time.perf_counter() - t0:.1f} s, load {os.getloadavg()[0]:.1f}", flush=True)
        for la in launchers:
            la.close()
        spread = statistics.stdev(logs) if len(logs) > 1 else float("nan")
        print(f"{mode}: mean log ratio {statistics.fmean(logs):+.4f}, sd between trials {spread:.4f}, "
              f"median within-trial se {statistics.median(ses):.4f}, ratio {spread / statistics.median(ses):.2f}")
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
