"""How often does the timing gate cry wolf, and how often does it catch a real slowdown?

Times a real DDP training step (suites.timing_models, MobileNetV2 by default, on this machine's
plan: GPUs if there are enough, else emulated gloo CPU ranks) in many separate launches, each a
fresh `dist.benchmark` as in a CI run. A third of the runs are unchanged; the others inject a
slowdown of 10% or 25%: after each step, every rank busy-waits for that fraction of the step time
measured by a first calibration launch (the achieved slowdown is printed too).
Conditions are interleaved, so load from other work on the machine hits them alike.

Then every (baseline run, candidate run) pair is judged:
  false-alarm rate = share of unchanged-vs-unchanged pairs judged a regression;
  power            = share of unchanged-vs-slowed pairs judged a regression.
For comparison it also applies the two halves of the rule alone: significance only (asv without
its effect size) and the effect size only (pytest-benchmark's percentage).

    python benchmarks/gate_power.py [--runs 12] [--repeat 10] [--arch mobilenet_v2]

Prints; asserts nothing. Figures depend on the load of the machine when they were taken.
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def slowed_step(extra_s: float, arch: str, batch: int, image: int):
    """The suites' DDP step, then a busy wait of ``extra_s`` seconds in every rank (busy, not a
    sleep: a sleeping rank would hand its core to the other one)."""
    from suites import timing_models as tm

    inner = tm.ddp_step(arch, batch, image)
    if not extra_s:
        return inner

    def step():
        inner()
        end = time.perf_counter() + extra_s
        while time.perf_counter() < end:
            pass

    return step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=12, help="launches per condition (default 12)")
    ap.add_argument("--repeat", type=int, default=10, help="timed iterations per launch (default 10)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--arch", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--image", type=int, default=32)
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args(argv)

    import gate_power as me  # ranks import the step from this file by module name, not __main__

    from pytest_mgpu.devices import detect_hardware, plan_for
    from pytest_mgpu.dist import Dist
    from pytest_mgpu.launch.spawn import SpawnLauncher
    from pytest_mgpu.timing.gate import ALPHA, SLOWER, judge, mann_whitney

    plan = plan_for(args.world_size, detect_hardware(), "cpu")
    launcher = SpawnLauncher()
    conditions = (0.0, 0.10, 0.25)
    runs = {c: [] for c in conditions}
    t0 = time.perf_counter()
    try:
        dist = Dist(plan=plan, launcher=launcher, label="gate_power", echo_output=False,
                    device_ids=tuple(str(i) for i in range(args.world_size)) if plan.device_type == "cuda" else ())
        # the step's time here and now, so that +10% is 10% of it (a fixed busy wait per step)
        ref = statistics.median(
            dist.benchmark(me.slowed_step, 0.0, args.arch, args.batch, args.image, warmup=args.warmup,
                           repeat=2 * args.repeat).samples)
        for i in range(args.runs):
            for c in conditions:
                m = dist.benchmark(me.slowed_step, c * ref, args.arch, args.batch, args.image,
                                   warmup=args.warmup, repeat=args.repeat)
                runs[c].append(m.samples)
            print(f"round {i + 1}/{args.runs}: medians "
                  + ", ".join(f"+{int(c * 100)}%: {statistics.median(runs[c][-1]) * 1e3:.1f} ms" for c in conditions),
                  flush=True)
    finally:
        launcher.close()
    wall = time.perf_counter() - t0

    base = runs[0.0]
    meds = [statistics.median(s) for s in base]
    print(f"\n{args.arch} b{args.batch} {args.image}px, DDP on {plan.describe()}; {args.runs} launches per "
          f"condition, {args.repeat} timed iterations each; {wall:.0f} s")
    print(f"unchanged runs: median of medians {statistics.median(meds) * 1e3:.1f} ms, run-to-run spread "
          f"(max/min median) {max(meds) / min(meds):.3f}")
    for c in conditions[1:]:
        got = statistics.median(statistics.median(s) for s in runs[c]) / statistics.median(meds) - 1
        print(f"injected +{c * 100:.0f}% ({c * ref * 1e3:.1f} ms busy wait per step): achieved {got * 100:+.1f}% "
              "(median of medians)")

    def rate(cands, same, rule):
        pairs = [(b, c) for (i, b), (j, c) in itertools.product(enumerate(base), enumerate(cands))
                 if not (same and i == j)]
        return sum(rule(c, b) for b, c in pairs) / len(pairs)

    def gate(thr):
        return lambda c, b: judge(c, b, threshold=thr).status == SLOWER

    def significance_only(c, b):
        return mann_whitney(c, b).p_greater < ALPHA

    def effect_only(thr):
        return lambda c, b: statistics.median(c) / statistics.median(b) > 1 + thr

    print(f"\nrule (alpha {ALPHA:g})                   false alarms   power +10%   power +25%")
    rules = [(f"gate, threshold {int(t * 100)}%", gate(t)) for t in (0.05, 0.10, 0.15, 0.20)]
    rules += [("significance only", significance_only)]
    rules += [(f"effect only, {int(t * 100)}%", effect_only(t)) for t in (0.05, 0.10)]
    for name, rule in rules:
        print(f"{name:<38}{rate(base, True, rule) * 100:>11.1f}%{rate(runs[0.10], False, rule) * 100:>12.1f}%"
              f"{rate(runs[0.25], False, rule) * 100:>12.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
