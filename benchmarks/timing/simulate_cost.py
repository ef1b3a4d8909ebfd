"""What one pytest_mgpu.simulate() call costs, and where it goes.

    python benchmarks/timing/simulate_cost.py                # ~2-4 minutes on 2 cores
    python benchmarks/timing/simulate_cost.py --budget 60    # seconds per measured configuration

Rows (medians over the calls that fit in the budget, at least --min-calls):
- fresh interpreter: `python -c` that imports torch, FSDP2, tensor parallel and the fake process group,
  joins a fake group and returns: what a plain subprocess per simulation would cost;
- simulate(noop), forkserver without the simulated tier's preload: each call imports FSDP2 & co.;
- simulate(noop), forkserver with the preload (a session with simulate-marked tests): a fork;
- the first call of each (it starts the forkserver);
- instrument overhead: the suite's FSDP2 step at 1,024 ranks and its 8 x 128 step, in one process under
  the fake group, with and without the counting mode (the cost of counting every op);
- the suite's steps through simulate(): FSDP2 per block at 1,024 ranks, 8 x 128, ResNet50 at 64.
Prints; asserts nothing. Each configuration runs in its own interpreter (the forkserver's preload is
fixed at its start). Other load on the machine shows in every figure: read the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRESH = ("import torch, torch.distributed as d; import torch.distributed.fsdp, torch.distributed.tensor.parallel, "
         "torch.distributed.tensor.debug; from torch.testing._internal.distributed.fake_pg import FakeStore; "
         "d.init_process_group('fake', store=FakeStore(), rank=0, world_size=1024)")


LAYERS = 2  # as suites/test_simulate.py


def noop():
    return None


def _calls(fn, budget: float, min_calls: int):
    times = []
    end = time.monotonic() + budget
    while len(times) < min_calls or time.monotonic() < end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def child(mode: str, budget: float, min_calls: int) -> dict:
    """Runs in its own interpreter; prints one JSON line."""
    sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]
    import simulate_cost as me
    from pytest_mgpu import simulate

    if mode == "preload":
        from pytest_mgpu.launch.spawn import preload_also
        from pytest_mgpu.simulate.inrank import PRELOAD

        preload_also(PRELOAD)
    elif mode == "plain":
        from pytest_mgpu.launch import spawn

        spawn.preload_also = lambda modules: None  # as if the forkserver had started without it
    if mode in ("preload", "plain"):
        t0 = time.perf_counter()
        simulate(me.noop, world_size=1024)
        first = time.perf_counter() - t0
        return {"first": first, "calls": _calls(lambda: simulate(me.noop, world_size=1024), budget, min_calls)}
    if mode == "suite":
        from suites import sim_models as S

        out = {}
        for name, fn, args, kwargs in (("fsdp2 1024", S.fsdp_step, (), {"layers": LAYERS}),
                                       ("tp8 x fsdp128", S.tp_fsdp_step, (8,), {"layers": LAYERS}),
                                       ("resnet50 fsdp2 64", S.resnet50_fsdp_step, (), {})):
            world = 64 if "resnet" in name else 1024
            out[name] = _calls(lambda: simulate(fn, *args, world_size=world, **kwargs), budget / 3, 1)
        return out
    return instrument_overhead(budget, min_calls)


def instrument_overhead(budget: float, min_calls: int) -> dict:
    """The suite's steps in this process under the fake group, with and without the counting mode."""
    import contextlib

    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from pytest_mgpu._context import RankContext, set_rank_context
    from pytest_mgpu.simulate.instruments import Instruments
    from suites import sim_models as S

    set_rank_context(RankContext(0, 1024, 0, "cpu", None, "fake", True, 0))
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1024)
    out = {}
    for name, fn, args in (("fsdp2 1024", S.fsdp_step, ()), ("tp8 x fsdp128", S.tp_fsdp_step, (8,))):
        fn(*args, layers=LAYERS)  # warm: first-use costs (imports, sharding caches) are not the mode's
        for label, mode in (("plain", contextlib.nullcontext), ("counted", Instruments)):
            def once():
                with mode():
                    fn(*args, layers=LAYERS)
            out[f"{name} {label}"] = _calls(once, budget / 4, min_calls)
    return out


def run_child(mode: str, budget: float, min_calls: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--budget", str(budget),
                          "--min-calls", str(min_calls)], capture_output=True, text=True, env=env, cwd=str(ROOT))
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{mode} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(lines[-1])


def fresh(budget: float, min_calls: int):
    return _calls(lambda: subprocess.run([sys.executable, "-c", FRESH], check=True, capture_output=True),
                  budget, min_calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=float, default=30.0, help="seconds per configuration")
    ap.add_argument("--min-calls", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.budget, args.min_calls)))
        return
    from tabulate import tabulate

    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    med = statistics.median
    rows = []
    base = med(fresh(args.budget, args.min_calls))
    rows.append(["fresh interpreter (torch, FSDP2, TP, fake group)", f"{base:.3f}", "1.00", "-"])
    for mode, label in (("plain", "simulate(noop), forkserver without the preload"),
                        ("preload", "simulate(noop), forkserver with the preload")):
        got = run_child(mode, args.budget, args.min_calls)
        rows.append([label, f"{med(got['calls']):.3f}", f"{med(got['calls']) / base:.2f}", len(got["calls"])])
        rows.append(["... its first call (starts the forkserver)", f"{got['first']:.3f}", f"{got['first'] / base:.2f}", 1])
    over = run_child("overhead", args.budget, args.min_calls)
    for name in ("fsdp2 1024", "tp8 x fsdp128"):
        plain, counted = med(over[f"{name} plain"]), med(over[f"{name} counted"])
        rows.append([f"{name} step in-process, plain", f"{plain:.3f}", "-", len(over[f"{name} plain"])])
        rows.append([f"{name} step in-process, counted ({counted / plain:.2f}x plain)", f"{counted:.3f}", "-",
                     len(over[f"{name} counted"])])
    suite = run_child("suite", args.budget, 1)
    for name, times in suite.items():
        rows.append([f"simulate({name}) (the suite's)", f"{med(times):.3f}", "-", len(times)])
    print(tabulate(rows, headers=["configuration", "median s", "vs fresh", "calls"], tablefmt="simple",
                   disable_numparse=True))
    print(f"load average at the start: {load} (2-core machine: figures above ~2 are shared with other work)")


if __name__ == "__main__":
    main()
