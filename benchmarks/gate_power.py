"""How often does the timing gate cry wolf, and how often does it catch a real slowdown?

Times a small compute-bound DDP training step (an MLP, gradient accumulation over micro-batches, 2
ranks: gloo CPU ranks here, GPUs where there are enough) in many SEPARATE launches, each a fresh
``dist.benchmark`` as in a CI run, and takes each launch twice (the second is what the gate's
re-measurement would see). Slowdowns of +10/+25/+50% are injected as more micro-batches of the same
work (so they slow down with the machine exactly as the real step does). Conditions are interleaved
round by round, so the machine's load hits them alike.

Then both rules are applied to the same launches:
  today:  one-sided Mann-Whitney U (p < 0.01) on iterations vs ONE stored launch AND median +10%
          (every ordered pair of launches);
  new:    x = ln(step median / in-run reference median) vs a history of the other unchanged
          launches: above the one-sided t prediction interval AND +10% (gate.judge_history), and, when
          flagged, the re-measurement also flagged (gate's confirmation).
False alarms = unchanged candidates judged slower; power = slowed candidates judged slower. Per suite
run = 1 - (1 - per measurement)^20 (a suite has about 20 measurements). Also printed: the spread of x
and of the raw medians across launches, and the step/reference correlation that the design rests on.

    python benchmarks/gate_power.py [--rounds 12] [--out /tmp/gate_power.json]
    python benchmarks/gate_power.py --analyse /tmp/gate_power.json   # tables again, no launches

Prints; asserts nothing. Figures depend on the load of the machine when they were taken.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Micro-batches of the unchanged step (+25% = 20 of them). Compute-bound means the injected work
# dominates the step: measured on the 2-core machine, a 256-wide MLP at batch 32 spent 3.4 ms of a
# 9.7 ms step in its 8 micro-batches (the rest: barrier, all_reduce, optimizer, Python), so +50%
# more micro-batches moved the median by less than the noise. At 512 wide, batch 64, one
# micro-batch is 2.6 ms (1 thread): 16 of them are ~85% of the step.
MICRO = 16
SLOWDOWNS = (0.10, 0.25, 0.50)
SUITE = 20  # measurements in one suite run


def mlp_step(micro: int, width: int = 512, batch: int = 64):
    """A compute-bound DDP step: ``micro`` forward/backward passes of an MLP (gradients synced once,
    on the last), then SGD. Dense matmuls dominate; the one all_reduce is 2.1 MB."""
    import torch
    import torch.distributed as tdist
    from torch import nn

    from pytest_mgpu import rank_device

    dev = rank_device()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, 10)).to(dev)
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        for i in range(micro):
            ctxm = model.no_sync() if (i < micro - 1 and hasattr(model, "no_sync")) else _null()
            with ctxm:
                nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def launch_once(me, dist, micro: int, min_run_time: float) -> dict:
    m = dist.benchmark(me.mlp_step, micro, min_run_time=min_run_time)
    return {"median": m.median, "iqr": m.iqr, "n": len(m.samples), "ref": m.reference_median, "x": m.x,
            "samples": m.samples, "unstable": m.unstable}


def collect(args) -> dict:
    import gate_power as me  # ranks import the step from this file by module name, not __main__

    from pytest_mgpu.devices import detect_hardware, plan_for
    from pytest_mgpu.dist import Dist
    from pytest_mgpu.launch.spawn import SpawnLauncher

    plan = plan_for(2, detect_hardware(), "cpu")
    conditions = [0.0, 0.0] + list(SLOWDOWNS)  # twice as many unchanged launches: they are the history
    data = {"plan": plan.describe(), "micro": MICRO, "launches": []}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for c in conditions:
            launcher = SpawnLauncher()  # a separate launch: fresh rank processes, as a CI job would have
            try:
                dist = Dist(plan=plan, launcher=launcher, label="gate_power", echo_output=False,
                            device_ids=("0", "1") if plan.device_type == "cuda" else ())
                micro = int(round(MICRO * (1 + c)))
                first = launch_once(me, dist, micro, args.min_run_time)
                second = launch_once(me, dist, micro, args.min_run_time)
            finally:
                launcher.close()
            data["launches"].append({"slowdown": c, "round": r, "first": first, "second": second})
        data["wall_s"] = time.perf_counter() - t0
        with open(args.out, "w") as f:  # after every round: a cut run can still be analysed
            json.dump(data, f)
        last = data["launches"][-len(conditions):]
        print(f"round {r + 1}/{args.rounds} ({time.perf_counter() - t0:.0f} s): "
              + ", ".join(f"+{int(d['slowdown'] * 100)}% {d['first']['median'] * 1e3:.1f}/"
                          f"{d['first']['ref'] * 1e3:.2f} ms" for d in last), flush=True)
    data["wall_s"] = time.perf_counter() - t0
    return data


def _corr(a, b) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))


def describe(data: dict) -> None:
    base = [d for d in data["launches"] if d["slowdown"] == 0.0]
    step = [math.log(d["first"]["median"]) for d in base]
    ref = [math.log(d["first"]["ref"]) for d in base]
    xs = [d["first"]["x"] for d in base]
    within = [math.log(d["second"]["median"] / d["first"]["median"]) for d in base]
    within_x = [d["second"]["x"] - d["first"]["x"] for d in base]
    iqr = sorted(d["first"]["iqr"] / d["first"]["median"] for d in data["launches"])
    print(f"\nMLP DDP step, {data['micro']} micro-batches, on {data['plan']}; {len(data['launches'])} launches "
          f"(x2 measurements) in {data['wall_s']:.0f} s")
    print(f"unchanged launches: {len(base)}; step median {statistics.median(d['first']['median'] for d in base) * 1e3:.2f} ms, "
          f"reference median {statistics.median(d['first']['ref'] for d in base) * 1e3:.2f} ms")
    print(f"across launches (sd in log space): step {statistics.stdev(step):.4f}, reference {statistics.stdev(ref):.4f}, "
          f"x = ln(step/reference) {statistics.stdev(xs):.4f}; step/reference correlation {_corr(step, ref):.3f}; "
          f"max/min step median {math.exp(max(step) - min(step)):.3f}")
    print(f"within a launch (first vs second measurement, sd of the log difference): step "
          f"{statistics.stdev(within):.4f}, x {statistics.stdev(within_x):.4f}; first/second x correlation across "
          f"launches {_corr(xs, [d['second']['x'] for d in base]):.3f}")
    print(f"IQR/median of all measurements: median {statistics.median(iqr) * 100:.1f}%, max {iqr[-1] * 100:.1f}%; "
          f"marked unstable: {sum(bool(d['first']['unstable']) for d in data['launches'])}")
    for c in SLOWDOWNS:
        got = [d["first"]["median"] for d in data["launches"] if d["slowdown"] == c]
        gx = [d["first"]["x"] for d in data["launches"] if d["slowdown"] == c]
        print(f"injected +{c * 100:.0f}%: achieved {statistics.median(got) / math.exp(statistics.median(step)) * 100 - 100:+.1f}% "
              f"in step medians, {math.exp(statistics.median(gx) - statistics.median(xs)) * 100 - 100:+.1f}% in x")


def analyse(data: dict, history: int) -> None:
    from pytest_mgpu.timing.gate import SLOWER, judge
    from pytest_mgpu.timing.rule import confirm, judge_history

    describe(data)
    base = [d for d in data["launches"] if d["slowdown"] == 0.0]

    def today(cands, same):
        pairs = [(b, c) for i, b in enumerate(base) for j, c in enumerate(cands) if not (same and b is c)]
        return sum(judge(c["first"]["samples"], b["first"]["samples"], 0.10).status == SLOWER for b, c in pairs) / len(pairs)

    def hist_for(c, use_x):
        others = [b for b in base if b is not c]
        i = base.index(c) if c in base else c["round"] * 2
        picked = [others[(i + k) % len(others)] for k in range(min(history, len(others)))]
        return [b["first"]["x"] if use_x else math.log(b["first"]["median"]) for b in picked]

    def new(cands, use_x, confirm_it):
        hits = 0
        for c in cands:
            h = hist_for(c, use_x)
            v1 = c["first"]["x"] if use_x else math.log(c["first"]["median"])
            v2 = c["second"]["x"] if use_x else math.log(c["second"]["median"])
            verdict = judge_history(v1, h, 0.10)
            if confirm_it:
                verdict = confirm(verdict, judge_history(v2, h, 0.10))
            hits += verdict.flagged
        return hits / len(cands)

    rules = [("today: MWU on iterations vs 1 launch, +10%", today),
             (f"medians vs {history}-launch history (t PI), +10%", lambda c, s: new(c, False, False)),
             (f"x vs {history}-launch history (t PI), +10%", lambda c, s: new(c, True, False)),
             (f"**x vs history, re-measured when flagged**", lambda c, s: new(c, True, True))]
    head = "| rule | false alarms / measurement | / suite run (20) | " + " | ".join(f"power +{int(c * 100)}%" for c in SLOWDOWNS) + " |"
    print("\n" + head + "\n|" + "---|" * (3 + len(SLOWDOWNS)))
    for name, rule in rules:
        fa = rule(base, True)
        powers = [rule([d for d in data["launches"] if d["slowdown"] == c], False) for c in SLOWDOWNS]
        print(f"| {name} | {fa * 100:.1f}% | {(1 - (1 - fa) ** SUITE) * 100:.0f}% | "
              + " | ".join(f"{p * 100:.0f}%" for p in powers) + " |")
    print(f"(unchanged candidates: {len(base)} for the history rules, {len(base) * (len(base) - 1)} pairs for today's; "
          f"slowed: {len(data['launches']) - len(base)})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12, help="rounds of 2 unchanged + 1 per slowdown launches")
    ap.add_argument("--min-run-time", type=float, default=0.5, help="seconds of timed steps per measurement")
    ap.add_argument("--history", type=int, default=20, help="launches in the gate's history")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "gate_power.json"), help="raw data, for --analyse")
    ap.add_argument("--analyse", metavar="JSON", help="analyse saved data instead of launching")
    args = ap.parse_args(argv)
    if args.analyse:
        with open(args.analyse) as f:
            data = json.load(f)
    else:
        data = collect(args)
        with open(args.out, "w") as f:
            json.dump(data, f)
        print(f"raw data: {args.out}")
    analyse(data, args.history)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
