"""Where do ``assert_same_training`` runs of the modern stack land against the line, and are the bugs named?

The calibration of ``parity_calibration.py --loops`` covers DDP-style loops. This one runs small
equivalents of modern public trainers through the real plugin (``record="optimizer"``, gloo CPU ranks):
FSDP2 (fully_shard per block, AdamW, clip_grad_norm_), FSDP2 with a DCP save / rebuild / load, DDP with
gradient accumulation (no_sync) and StepLR, sequence parallel, tensor parallel, 2-D FSDP x TP (4 ranks:
dp 2 x tp 2) and DDP on uneven data or with a rebuilt model. The trainers are tests/modern_trainers.py
(self-seeded: one run per world size) and tests/modern_public.py (the modern stack's public trainers; once a held-out
trial set written by another engineer; its model init follows the test's seed except the TP example's).

Correct runs: several seeds, world sizes 2 and 4, ``--steps`` optimizer steps (default 12; a list such as
``6,20`` runs each length). A run's
figure is ``report.worst_ratio`` (worst error / line; > 1 fails). Bug runs: each at its world size; the
figure is the smallest ``worst_ratio`` over a stack's bugs (must be > 1), and the hint is right when the
first ``likely cause:`` line of the ParityError's message contains the bug's substring (``BUGS`` below,
chosen from the real cause, not from a message).

    python benchmarks/parity/parity_calibration_modern.py                  # ~7 minutes on 2 loaded cores
    python benchmarks/parity/parity_calibration_modern.py --steps 6,20     # the documented table: ~15 minutes
    python benchmarks/parity/parity_calibration_modern.py --quick          # 1 seed, 6 steps
    python benchmarks/parity/parity_calibration_modern.py --analyze runs.jsonl
    python benchmarks/parity/parity_calibration_modern.py -k "fsdp2" --sizes 2

Prints a table per case, then per stack, then every false alarm and wrong hint with the first 3 lines of
its message. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[2]

MODERN_FILE = '''
import functools, json, math, os, time, pytest
from pytest_mgpu import ParityError
from tests import modern_trainers as M
from tests import modern_public as T

P = functools.partial
OUT = os.environ["CALIBRATION_OUT"]
SEEDS = range(int(os.environ.get("CALIBRATION_SEEDS", "3")))
BUG_SEEDS = range(int(os.environ.get("CALIBRATION_BUG_SEEDS", "2")))
STEPS = [int(n) for n in os.environ.get("CALIBRATION_STEPS", "12").split(",")]
SIZES = [int(w) for w in os.environ.get("CALIBRATION_SIZES", "2,4").split(",")]
DEADLINE = float(os.environ.get("CALIBRATION_DEADLINE", "inf"))


def trial(fn, ref):  # the trial trainers take the world size first
    return lambda w, folder, steps: (P(fn, w), P(ref, w))


def fsdp2_dcp(bug="", clip=None):
    return lambda w, folder, steps: (P(M.fsdp2_dcp, folder, steps=steps, bug=bug, clip=clip),
                                     P(M.one_device, steps=steps, clip=clip))


def accumulate(bug=""):
    return lambda w, folder, steps: (P(M.ddp_accumulate, steps=steps, bug=bug), P(M.accumulate_one_device, w, steps=steps))


def sp(bug=""):
    return lambda w, folder, steps: (P(M.sequence_parallel, steps=steps, bug=bug), P(M.toy_one_device, w, steps=steps))


# (stack, case, world sizes, program, seeded)
CORRECT = [
    ("FSDP2", "C1 fsdp2 AdamW+clip (trial)", SIZES, trial(T.fsdp_train, T.fsdp_reference), True),
    ("FSDP2 + DCP reload", "C2 dcp resume, ref straight (trial)", SIZES,
     trial(P(T.fsdp_ckpt_train, save_at=3), P(T.fsdp_ckpt_reference, save_at=3)), True),
    ("FSDP2 + DCP reload", "C2b dcp resume, ref resumes too (trial)", SIZES,
     trial(P(T.fsdp_ckpt_train, save_at=3), P(T.fsdp_ckpt_reference, save_at=3, checkpoint=True)), True),
    ("FSDP2 + DCP reload", "fsdp2_dcp (tests)", SIZES, fsdp2_dcp(), False),
    ("FSDP2 + DCP reload", "fsdp2_dcp clip (tests)", SIZES, fsdp2_dcp(clip=True), False),
    ("DDP accumulation + StepLR", "C3 Trainer no_sync x2 + StepLR (trial)", SIZES,
     trial(T.accum_train, T.accum_reference), True),
    ("DDP accumulation + StepLR", "ddp_accumulate (tests)", SIZES, accumulate(), False),
    ("sequence parallel", "C4 sequence_parallel_example (trial)", SIZES, trial(T.sp_train, T.sp_reference), True),
    ("sequence parallel", "sequence_parallel (tests)", SIZES, sp(), False),
    ("tensor parallel", "C5 tensor_parallel_example (trial)", SIZES, trial(T.tp_train, T.tp_reference), False),
    ("tensor parallel", "B12 rank seed before parallelize (harmless)", SIZES,
     trial(P(T.tp_train, bug="rank_seed"), T.tp_reference), False),
    ("2-D FSDP x TP", "C6 fsdp_tp_example dp2 x tp2 (trial)", [4], trial(T.fsdp_tp_train, T.fsdp_tp_reference), True),
    ("DDP uneven / rebuilt", "C7 22 rows drop_last=False (trial)", SIZES,
     trial(T.uneven_train, T.uneven_reference), True),
    ("DDP uneven / rebuilt", "C8 model rebuilt in rank (trial)", SIZES, trial(T.rebuild_train, T.rebuild_reference), True),
]
# (stack, case, world size, program, steps, seeded, substring of the right hint)
BUGS = [
    ("FSDP2", "B1 clip on local shards", 2, trial(P(T.fsdp_train, bug="local_clip"), T.fsdp_reference), 6, True,
     "clipping"),
    ("FSDP2", "B1b get_total_norm of local shards", 2, trial(P(T.fsdp_train, bug="local_clip_api"), T.fsdp_reference),
     6, True, "clipping"),
    ("FSDP2", "B2 no zero_grad", 2, trial(P(T.fsdp_train, bug="no_zero_grad"), T.fsdp_reference), 6, True,
     "not zeroed"),
    ("FSDP2", "B8 meta init, blocks not reset", 2, trial(P(T.fsdp_train, bug="meta_partial_reset"), T.fsdp_reference),
     6, True, "initialise"),
    ("FSDP2", "B11 lr x world size", 2, trial(P(T.fsdp_train, bug="lr_times_world"), T.fsdp_reference), 6, True,
     "learning rate"),
    ("FSDP2", "local_clip (tests)", 2, fsdp2_dcp("local_clip", clip=True), 6, False, "clipping"),
    ("FSDP2", "no_zero_grad (tests)", 2, fsdp2_dcp("no_zero_grad"), 6, False, "not zeroed"),
    ("FSDP2 + DCP reload", "B3 resume without optimizer state", 2,
     trial(P(T.fsdp_ckpt_train, save_at=3, bug="no_optim_state"), P(T.fsdp_ckpt_reference, save_at=3)), 6, True,
     "optimizer's state"),
    ("FSDP2 + DCP reload", "B7 data restarted on resume", 2,
     trial(P(T.fsdp_ckpt_train, save_at=3, bug="data_restart"), P(T.fsdp_ckpt_reference, save_at=3)), 6, True,
     "data repeated"),
    ("FSDP2 + DCP reload", "no_optimizer_state (tests)", 2, fsdp2_dcp("no_optimizer_state"), 6, False,
     "optimizer's state"),
    ("FSDP2 + DCP reload", "data_restarted (tests)", 2, fsdp2_dcp("data_restarted"), 6, False, "data repeated"),
    ("DDP accumulation + StepLR", "B5 loss not divided", 2, trial(P(T.accum_train, bug="no_divide"), T.accum_reference),
     6, True, "without dividing"),
    ("DDP accumulation + StepLR", "B5b loss not divided", 4, trial(P(T.accum_train, bug="no_divide"), T.accum_reference),
     6, True, "without dividing"),
    ("DDP accumulation + StepLR", "B6 scheduler per micro-batch", 2,
     trial(P(T.accum_train, bug="sched_per_micro"), T.accum_reference), 8, True, "learning rate"),
    ("DDP accumulation + StepLR", "scheduler_per_micro_batch (tests)", 4, accumulate("scheduler_per_micro_batch"), 6,
     False, "learning rate"),
    ("DDP accumulation + StepLR", "not_divided (tests)", 4, accumulate("not_divided"), 6, False, "without dividing"),
    ("sequence parallel", "same_rows_everywhere (tests)", 2, sp("same_rows_everywhere"), 6, False, "not sharded"),
    ("tensor parallel", "B9 rank-dependent inputs", 2, trial(P(T.tp_train, bug="rank_inputs"), T.tp_reference), 6,
     False, "rank-dependent inputs"),
    ("tensor parallel", "B12b rank seed, src_data_rank=None", 2,
     trial(P(T.tp_train, bug="rank_seed_local"), T.tp_reference), 6, False, "different weights"),
    ("2-D FSDP x TP", "B4 SP norm grads not reduced over tp", 4,
     trial(P(T.fsdp_tp_train, bug="norm_not_sp"), T.fsdp_tp_reference), 6, True, "not reduced"),
    ("DDP uneven / rebuilt", "B10 local mean vs global mean", 4,
     trial(T.uneven_local_mean_train, T.uneven_global_mean_reference), 6, True, "unequal shards"),
]


def _cases():
    for stack, case, sizes, program, seeded in CORRECT:
        for w in sizes:
            for steps in STEPS:
                yield pytest.param(stack, case, w, program, steps, seeded, "", marks=getattr(pytest.mark, f"gpu{w}"),
                                   id=f"ok-{stack}-{case}-w{w}-{steps}steps")
    for stack, case, w, program, steps, seeded, hint in BUGS:
        if w in SIZES:
            yield pytest.param(stack, case, w, program, steps, seeded, hint, marks=getattr(pytest.mark, f"gpu{w}"),
                               id=f"bug-{stack}-{case}-w{w}")


def _first_cause(text):
    return next((line for line in text.splitlines() if line.startswith("likely cause")), "")


@pytest.mark.parametrize("stack,case,w,program,steps,seeded,hint", list(_cases()))
def test_modern(dist, tmp_path, stack, case, w, program, steps, seeded, hint):
    seeds = (BUG_SEEDS if hint else SEEDS) if seeded else [0]
    for seed in seeds:
        if time.time() > DEADLINE:
            pytest.skip("--budget spent")
        dist.seed = seed
        fn, ref = program(w, str(tmp_path / f"ckpt{seed}"), steps)
        t0 = time.perf_counter()
        try:
            report = dist.assert_same_training(fn, ref, steps=steps, record="optimizer")
            passed, text = True, ""
        except ParityError as exc:
            report, passed, text = exc.report, False, str(exc)
        except Exception as exc:  # a rank failure or a refusal: recorded, not judged by a ratio
            report, passed, text = None, False, f"{type(exc).__name__}: {exc}"
        cause = _first_cause(text)
        row = {"stack": stack, "case": case, "world": w, "seed": seed, "steps": steps, "bug": bool(hint),
               "passed": passed, "raised": report is None and not passed,
               "worst_ratio": report.worst_ratio if report is not None else math.nan,
               "hint": hint, "cause": cause, "named": bool(hint) and hint.lower() in cause.lower(),
               "first": text.splitlines()[:3], "s": time.perf_counter() - t0}
        with open(OUT, "a") as f:
            f.write(json.dumps(row) + "\\n")
'''


def run(out: Path, seeds: int, bug_seeds: int, steps: str, sizes: str, select: str, budget: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        test = Path(tmp) / "test_calibration_modern.py"
        test.write_text(MODERN_FILE)
        env = dict(os.environ, CALIBRATION_OUT=str(out), CALIBRATION_SEEDS=str(seeds),
                   CALIBRATION_BUG_SEEDS=str(bug_seeds), CALIBRATION_STEPS=str(steps), CALIBRATION_SIZES=sizes,
                   CALIBRATION_DEADLINE=str(time.time() + budget),
                   PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks" / "parity"), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "pytest", str(test), "--mgpu-fallback=cpu", "-q", "-p", "no:cacheprovider",
               "--rootdir", tmp] + (["-k", select] if select else [])
        subprocess.run(cmd, env=env, cwd=tmp, check=False)


def _fmt(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def analyze(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    per_case = defaultdict(list)
    for row in rows:
        per_case[(row["stack"], "bug" if row["bug"] else "ok", row["case"], row["world"], row["steps"])].append(row)
    out = []
    for key, rs in sorted(per_case.items()):
        ratios = [r["worst_ratio"] for r in rs if not math.isnan(r["worst_ratio"])]
        fig = (min(ratios) if key[1] == "bug" else max(ratios)) if ratios else math.nan
        named = f"{sum(r['named'] for r in rs)}/{len(rs)}" if key[1] == "bug" else ""
        bad = sum(1 for r in rs if (r["bug"] and r["passed"]) or (not r["bug"] and not r["passed"]))
        out.append([*key, len(rs), len({r["seed"] for r in rs}), _fmt(fig), bad, named,
                    f"{sum(r['s'] for r in rs) / len(rs):.0f}"])
    print(tabulate(out, headers=["stack", "", "case", "W", "steps", "runs", "seeds", "worst/line", "wrong verdicts",
                                 "hint named", "s/run"]))
    print("\nworst/line: for correct runs the largest over seeds, for bugs the smallest (> 1 fails)\n")
    stacks = []
    for stack in dict.fromkeys(r["stack"] for r in rows):
        ok = [r for r in rows if r["stack"] == stack and not r["bug"]]
        bug = [r for r in rows if r["stack"] == stack and r["bug"]]
        ok_r = [r["worst_ratio"] for r in ok if not math.isnan(r["worst_ratio"])]
        bug_r = [r["worst_ratio"] for r in bug if not math.isnan(r["worst_ratio"])]
        stacks.append([stack, len(ok), ",".join(str(w) for w in sorted({r["world"] for r in ok})),
                       ",".join(str(s) for s in sorted({r["steps"] for r in ok})),
                       _fmt(max(ok_r) if ok_r else math.nan), sum(not r["passed"] for r in ok),
                       len(bug), len({r["case"] for r in bug}), _fmt(min(bug_r) if bug_r else math.nan),
                       sum(r["passed"] for r in bug), f"{sum(r['named'] for r in bug)}/{len(bug)}"])
    print(tabulate(stacks, headers=["stack", "correct runs", "W", "steps", "worst correct", "false alarms",
                                    "bug runs", "bug kinds", "weakest bug", "missed", "hints right"]))
    ok = [r for r in rows if not r["bug"]]
    bug = [r for r in rows if r["bug"]]
    print(f"\n{len(ok)} correct runs, worst {_fmt(max((r['worst_ratio'] for r in ok), default=math.nan))}, "
          f"{sum(not r['passed'] for r in ok)} failed; {len(bug)} bug runs, weakest "
          f"{_fmt(min((r['worst_ratio'] for r in bug if not math.isnan(r['worst_ratio'])), default=math.nan))}, "
          f"{sum(r['passed'] for r in bug)} passed; hints {sum(r['named'] for r in bug)}/{len(bug)} right")
    for r in rows:
        wrong = (not r["bug"] and not r["passed"]) or (r["bug"] and (r["passed"] or not r["named"]))
        if wrong:
            what = "FALSE ALARM" if not r["bug"] else "MISSED" if r["passed"] else f"WRONG HINT (want {r['hint']!r})"
            print(f"\n{what}: {r['stack']} / {r['case']} W{r['world']} seed {r['seed']} ratio {_fmt(r['worst_ratio'])}")
            for line in r["first"]:
                print(f"    {line[:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds of a correct run (seeded trainers)")
    parser.add_argument("--bug-seeds", type=int, default=2, help="seeds of a bug run (seeded trainers)")
    parser.add_argument("--steps", default="12", help="optimizer steps of a correct run, comma-separated (6,20)")
    parser.add_argument("--sizes", default="2,4", help="world sizes, comma-separated")
    parser.add_argument("--quick", action="store_true", help="1 seed, 6 steps")
    parser.add_argument("--budget", type=float, default=math.inf, help="seconds after which no run starts")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--analyze", type=Path, default=None, help="judge recorded runs, run nothing")
    parser.add_argument("-k", dest="select", default="")
    args = parser.parse_args()
    if args.analyze:
        analyze(args.analyze)
        return
    if args.quick:
        args.seeds, args.bug_seeds, args.steps = 1, 1, "6"
    out = args.out or Path(tempfile.mkdtemp()) / "calibration_modern.jsonl"
    t0 = time.time()
    run(out, args.seeds, args.bug_seeds, args.steps, args.sizes, args.select, args.budget)
    print(f"runs written to {out} ({time.time() - t0:.0f} s)")
    analyze(out)


if __name__ == "__main__":
    main()
