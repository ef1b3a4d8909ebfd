"""How often does each timing lane cry wolf, and how often does it catch a real slowdown?

Two lanes, measured in the same run, round by round, so that the machine's load hits them alike:

history lane: a small compute-bound DDP training step (an MLP, gradient accumulation over
  micro-batches, 2 ranks: gloo CPU ranks here, GPUs where there are enough) in many SEPARATE launches,
  each a fresh ``dist.benchmark`` as in a CI run, each taken twice (the second is what the gate's
  re-measurement would see). Slowdowns of +10/+25/+50% are more micro-batches of the same work. Rules
  applied to the same launches:
    today:  one-sided Mann-Whitney U (p < 0.01) on iterations vs ONE stored launch AND median +10%;
    new:    x = ln(step median / in-run reference median) vs a history of the other unchanged launches
            (one-sided t prediction interval AND +10%), and, when flagged, the re-measurement too.
revision lane (``--mgpu-against``): the same step in a temporary git repository (revision_bench.py):
  a base commit, an unchanged commit, and commits with +10/+25/+50% micro-batches. Each trial is the
  lane's own ``run_duet`` of a head revision against the base (interleaved pairs of batches under the
  lane's time budget, two sets of warm ranks, each importing its revision from a worktree), judged by
  ``pairing.judge_pairs`` (99% bootstrap interval of head/base; slower when it lies above +10%).

False alarms = unchanged candidates judged slower; power = slowed candidates judged slower. Per suite
run = 1 - (1 - per measurement)^20 (a suite has about 20 measurements). Each phase runs with N
CPU-burning processes beside it (``--loads 0 6``: quiet, then 6 burners on the 2 cores).

    python benchmarks/timing/gate_power.py --budget-s 3600 --loads 0 6      # both tables, quiet and loaded
    python benchmarks/timing/gate_power.py --budget-s 300 --loads 0         # a small check that it works
    python benchmarks/timing/gate_power.py --analyse /tmp/gate_power.json   # tables again, no launches

Prints; asserts nothing. Figures depend on the load of the machine when they were taken (the load
average is printed per phase: other jobs on the machine add to the burners).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

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


def _history_launch(me, plan, c: float, min_run_time: float) -> dict:
    from pytest_mgpu.dist import Dist
    from pytest_mgpu.launch.spawn import SpawnLauncher

    launcher = SpawnLauncher()  # a separate launch: fresh rank processes, as a CI job would have
    try:
        dist = Dist(plan=plan, launcher=launcher, label="gate_power", echo_output=False,
                    device_ids=("0", "1") if plan.device_type == "cuda" else ())
        micro = int(round(MICRO * (1 + c)))
        return {"slowdown": c, "first": launch_once(me, dist, micro, min_run_time),
                "second": launch_once(me, dist, micro, min_run_time)}
    finally:
        launcher.close()


@contextlib.contextmanager
def burners(n: int):
    """``n`` processes that burn a CPU each while the phase runs (ended by their pids afterwards)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _take(phase: dict, kind: str, c: float, r: int, take) -> Optional[float]:
    """One launch or duet into the phase; returns the step's median (the lane's budget is sized by it)."""
    try:
        got = dict(take(), round=r)
    except Exception as exc:  # a launch the loaded machine broke: counted, not judged
        phase.setdefault("errors", []).append(f"{kind} +{c:.0%}: {type(exc).__name__}: {exc}"[:300])
        print(f"  ({kind} +{c:.0%} failed: {type(exc).__name__}: {str(exc)[:120]})", flush=True)
        return None
    phase[kind].append(got)
    return got["first"]["median"] if kind == "launches" else None


def _phase(me, plan, bench, n_burners: int, budget_s: float, args, save, phases: list) -> dict:
    import random

    conditions = [0.0, 0.0] + list(SLOWDOWNS)  # twice as many unchanged launches: they are the history
    phase = {"burners": n_burners, "load_before": os.getloadavg()[0], "launches": [], "duets": []}
    phases.append(phase)  # saved with every round: a phase cut short can still be analysed
    rng = random.Random()
    t0 = time.perf_counter()
    with burners(n_burners):
        r, last = 0, 0.0
        while r < args.rounds and time.perf_counter() - t0 + last < budget_s:
            t_round = time.perf_counter()
            bench.new_sets()  # new sets of ranks every round: their own speed varies as between CI jobs
            for c in rng.sample(conditions, len(conditions)):
                if "history" in args.lanes:
                    _take(phase, "launches", c, r, lambda: _history_launch(me, plan, c, args.min_run_time))
                if "revision" in args.lanes:
                    _take(phase, "duets", c, r, lambda: bench.duet(c, rng))
            last, r = time.perf_counter() - t_round, r + 1
            phase["wall_s"], phase["load_after"] = time.perf_counter() - t0, os.getloadavg()[0]
            save()
            duets = [d for d in phase["duets"] if d["round"] == r - 1]
            print(f"{n_burners} burners, round {r} ({time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.1f}): "
                  + ", ".join(f"+{int(d['slowdown'] * 100)}% x{d['verdict']['ratio'] or 0:.3f} {d['verdict']['status']}"
                              for d in sorted(duets, key=lambda d: d["slowdown"])), flush=True)
    return phase


def collect(args) -> dict:
    import gate_power as me  # ranks import the step from this file by module name, not __main__
    from revision_bench import RevisionBench

    from pytest_mgpu.devices import detect_hardware, plan_for

    plan = plan_for(2, detect_hardware(), "cpu")
    data = {"plan": plan.describe(), "micro": MICRO, "lane_budget_s": args.lane_budget_s,
            "min_run_time": args.min_run_time, "phases": []}

    def save():
        with open(args.out, "w") as f:  # after every round: a cut run can still be analysed
            json.dump(data, f)

    bench = RevisionBench(SLOWDOWNS, args.lane_budget_s, min_run_time=args.min_run_time)
    try:
        for n in args.loads:
            _phase(me, plan, bench, n, args.budget_s / len(args.loads), args, save, data["phases"])
    finally:
        bench.close()
    save()
    return data


def _corr(a, b) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))


def describe(phase: dict, data: dict) -> None:
    base = [d for d in phase["launches"] if d["slowdown"] == 0.0]
    step = [math.log(d["first"]["median"]) for d in base]
    ref = [math.log(d["first"]["ref"]) for d in base]
    xs = [d["first"]["x"] for d in base]
    within = [math.log(d["second"]["median"] / d["first"]["median"]) for d in base]
    within_x = [d["second"]["x"] - d["first"]["x"] for d in base]
    iqr = sorted(d["first"]["iqr"] / d["first"]["median"] for d in phase["launches"])
    print(f"\nhistory lane: MLP DDP step, {data['micro']} micro-batches, on {data['plan']}; {len(phase['launches'])} "
          f"launches (x2 measurements)")
    print(f"unchanged launches: {len(base)}; step median {statistics.median(d['first']['median'] for d in base) * 1e3:.2f} ms, "
          f"reference median {statistics.median(d['first']['ref'] for d in base) * 1e3:.2f} ms")
    if len(base) > 2:
        print(f"across launches (sd in log space): step {statistics.stdev(step):.4f}, reference {statistics.stdev(ref):.4f}, "
              f"x = ln(step/reference) {statistics.stdev(xs):.4f}; step/reference correlation {_corr(step, ref):.3f}; "
              f"max/min step median {math.exp(max(step) - min(step)):.3f}")
        print(f"within a launch (first vs second measurement, sd of the log difference): step "
              f"{statistics.stdev(within):.4f}, x {statistics.stdev(within_x):.4f}")
    print(f"IQR/median of all measurements: median {statistics.median(iqr) * 100:.1f}%, max {iqr[-1] * 100:.1f}%; "
          f"marked unstable: {sum(bool(d['first']['unstable']) for d in phase['launches'])}")
    for c in SLOWDOWNS:
        got = [d["first"]["median"] for d in phase["launches"] if d["slowdown"] == c]
        gx = [d["first"]["x"] for d in phase["launches"] if d["slowdown"] == c]
        if got:
            print(f"injected +{c * 100:.0f}%: achieved {statistics.median(got) / math.exp(statistics.median(step)) * 100 - 100:+.1f}% "
                  f"in step medians, {math.exp(statistics.median(gx) - statistics.median(xs)) * 100 - 100:+.1f}% in x")


def history_rules(phase: dict, history: int) -> list:
    """(rule, false alarms per measurement, [power per slowdown]) of the history lane's rules."""
    from pytest_mgpu.timing.gate import SLOWER, judge
    from pytest_mgpu.timing.rule import confirm, judge_history

    base = [d for d in phase["launches"] if d["slowdown"] == 0.0]

    def today(cands, same):
        pairs = [(b, c) for b in base for c in cands if not (same and b is c)]
        return sum(judge(c["first"]["samples"], b["first"]["samples"], 0.10).status == SLOWER for b, c in pairs) / max(1, len(pairs))

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
        return hits / max(1, len(cands))

    rules = [("today: MWU on iterations vs 1 launch, +10%", today),
             (f"medians vs {history}-launch history (t PI), +10%", lambda c, s: new(c, False, False)),
             (f"x vs {history}-launch history (t PI), +10%", lambda c, s: new(c, True, False)),
             ("x vs history, re-measured when flagged (the history lane)", lambda c, s: new(c, True, True))]
    return [(name, rule(base, True), [rule([d for d in phase["launches"] if d["slowdown"] == c], False)
                                      for c in SLOWDOWNS]) for name, rule in rules]


def revision_summary(phase: dict, threshold: float = 0.10) -> dict:
    """The revision lane's verdicts, judged again from the stored pairs (as compare does)."""
    from pytest_mgpu.timing.pairing import judge_pairs

    by = {}
    for d in phase["duets"]:
        v = judge_pairs(d["pairs_head"], d["pairs_base"], threshold, d.get("pairs_block"))
        by.setdefault(d["slowdown"], []).append((d, v))

    def share(c, status):
        got = by.get(c, [])
        return sum(v.status.value == status for _, v in got) / max(1, len(got))

    out = {"fa": share(0.0, "slower"), "power": [share(c, "slower") for c in SLOWDOWNS],
           "unstable": sum(v.status.value == "unstable" for g in by.values() for _, v in g) / max(1, len(phase["duets"])),
           "n": {c: len(g) for c, g in by.items()}, "detail": []}
    for c, got in sorted(by.items()):
        widths = [math.log(v.high / v.low) for _, v in got if v.low]
        out["detail"].append(
            f"  +{c * 100:.0f}%: {len(got)} trials, head/base median x{statistics.median(v.ratio for _, v in got if v.ratio):.3f}, "
            f"pairs median {statistics.median(len(d['pairs_head']) for d, _ in got)} of "
            f"{statistics.median(d['iterations'] for d, _ in got)} iteration(s), 99% interval width median "
            f"{statistics.median(widths) if widths else float('nan'):.3f} (log; the same-band is 0.201), verdicts "
            + ", ".join(f"{s} {sum(v.status.value == s for _, v in got)}" for s in ("slower", "same", "faster", "unstable")))
    return out


def analyse(data: dict, history: int) -> None:
    phases = data.get("phases") or [dict(data, burners=0, duets=[])]  # files from before the revision lane
    rows = []
    for ph in phases:
        name = f"{ph['burners']} burners, load {ph.get('load_before', float('nan')):.1f}-{ph.get('load_after', float('nan')):.1f}"
        print(f"\n=== phase: {name}, {ph.get('wall_s', 0):.0f} s"
              + (f"; {len(ph['errors'])} launch(es) failed: {ph['errors'][0]}" if ph.get("errors") else ""))
        for rule_name, fa, powers in (describe(ph, data) or history_rules(ph, history)) if ph["launches"] else ():
            print(f"  {rule_name}: false alarms {fa * 100:.1f}%, power " + ", ".join(f"{p * 100:.0f}%" for p in powers))
            if rule_name.endswith("(the history lane)"):
                rows.append(("history: x vs history, re-measured", name, fa, powers, None,
                             sum(d["slowdown"] == 0.0 for d in ph["launches"])))
        if ph["duets"]:
            rev = revision_summary(ph)
            budgets = [d.get("budget_s") or data.get("lane_budget_s") or 0 for d in ph["duets"]]
            walls = [d["wall_s"] for d in ph["duets"]]
            print(f"revision lane: budget per trial median {statistics.median(budgets):.1f} s, wall median "
                  f"{statistics.median(walls):.1f} s (max {max(walls):.1f} s):")
            print("\n".join(rev["detail"]))
            rows.append(("revision: vs REV, 99% interval", name, rev["fa"], rev["power"], rev["unstable"], rev["n"].get(0.0, 0)))
    print("\n| lane | phase | false alarms / measurement | / suite run (20) | "
          + " | ".join(f"power +{int(c * 100)}%" for c in SLOWDOWNS) + " | unstable | unchanged trials |")
    print("|" + "---|" * (6 + len(SLOWDOWNS)))
    for lane, name, fa, powers, unstable, n in rows:
        print(f"| {lane} | {name} | {fa * 100:.1f}% | {(1 - (1 - fa) ** SUITE) * 100:.0f}% | "
              + " | ".join(f"{p * 100:.0f}%" for p in powers)
              + f" | {'-' if unstable is None else f'{unstable * 100:.0f}%'} | {n} |")
    print("(a false-alarm rate of 0 in n unchanged trials bounds the true rate below 3/n at 95% confidence)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-s", type=float, default=1800.0, help="wall time of the whole run, split between phases")
    ap.add_argument("--loads", type=int, nargs="+", default=[0, 6], help="CPU-burning processes beside each phase")
    ap.add_argument("--rounds", type=int, default=1000, help="at most this many rounds per phase (each: 2 unchanged "
                    "+ 1 per slowdown, in both lanes)")
    ap.add_argument("--min-run-time", type=float, default=0.5, help="history lane: seconds of timed steps per measurement")
    ap.add_argument("--lane-budget-s", type=float, default=None,
                    help="revision lane: a fixed budget per trial (default: pytest's, from min_run_time and the "
                         "history lane's step median of the same round)")
    ap.add_argument("--lanes", nargs="+", default=["history", "revision"], choices=["history", "revision"])
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
