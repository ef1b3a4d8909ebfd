"""``parity_calibration.py --loops``: the zoo of the user's own training loops for
``assert_same_training`` (tests/public_trainers.py), and its table. See parity_calibration.py."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from tabulate import tabulate

LOOPS_FILE = '''
import functools, json, os, time, pytest, torch
from pytest_mgpu import ParityError
from tests import public_trainers as P

OUT = os.environ["CALIBRATION_OUT"]
FIRST = int(os.environ.get("CALIBRATION_FIRST_SEED", "0"))
SEEDS = range(FIRST, FIRST + int(os.environ.get("CALIBRATION_SEEDS", "3")))
STEPS = int(os.environ.get("CALIBRATION_STEPS", "100"))
BUG_STEPS = int(os.environ.get("CALIBRATION_BUG_STEPS", "100"))
SIZES = [int(w) for w in os.environ.get("CALIBRATION_SIZES", "2,4").split(",")]
DEADLINE = float(os.environ.get("CALIBRATION_DEADLINE", "inf"))
EPOCHS = 1000  # epoch-based trainers: enough epochs for any --steps; each side stops at the N-th step


def gpt(bug="", ref=None, **kw):
    return (functools.partial(P.gpt_ddp_train, bug=bug, epochs=EPOCHS, **kw),
            functools.partial(P.gpt_one_device, epochs=EPOCHS, **dict(kw, **(ref or {}))), True, {"record": "optimizer"})


def tutorial(bug="", ref_batch=None):
    def make(w):
        fn = functools.partial(P.multigpu_main, world_size=w, save_every=10**6, total_epochs=EPOCHS, batch_size=16,
                               bug=bug)
        return fn, functools.partial(P.single_gpu_main, "cpu", EPOCHS, 10**6, ref_batch or 16 * w)
    return make, None, False, {"spawn": True}


def hand(bug=""):
    def make(w):
        return (functools.partial(P.init_process, size=w, fn=P.run, bug=bug, epochs=EPOCHS),
                functools.partial(P.run_one_device, w, epochs=EPOCHS))
    return make, None, False, {"spawn": True}


def tp(bug=""):
    return (functools.partial(P.tp_train, bug=bug, steps=10**6), functools.partial(P.tp_one_device, steps=10**6),
            True, {"record": "optimizer"})


PINNED, F32, BF16 = {}, {"dtype": None}, {"use_amp": True}
ZOO = [  # (name, optimizer, precision, program, expected hint for a bug ("" for a correct run), seeded)
    ("minGPT f32-pinned", "AdamW+clip", "float32 (pinned)", gpt(**PINNED), "", True),
    ("minGPT", "AdamW+clip", "float32", gpt(**F32), "", True),
    ("minGPT f32-pinned", "AdamW+clip", "bf16 autocast", gpt(**BF16), "", True),
    ("minGPT", "AdamW+clip", "bf16 autocast", gpt(dtype=None, use_amp=True), "", True),
    ("DDP tutorial (mp.spawn)", "SGD momentum", "float32", tutorial(), "", True),
    ("hand all_reduce SGD (mp.spawn)", "SGD momentum", "float32", hand(), "", False),
    ("tensor parallel", "AdamW", "float32", tp(), "", True),
]
for label, prec, kw in (("minGPT f32-pinned", "float32 (pinned)", PINNED), ("minGPT", "float32", F32),
                        ("minGPT f32-pinned", "bf16 autocast", BF16)):
    ZOO += [(f"bug: {label} loss x world", "AdamW+clip", prec, gpt("loss_times_world", **kw),
             "the loss is scaled by the world size", True),
            (f"bug: {label} no_sync", "AdamW+clip", prec, gpt("no_sync", **kw), "not synchronized", True),
            (f"bug: {label} reference reshuffled", "AdamW+clip", prec, gpt(ref={"shuffle_seed": 1}, **kw),
             "the sides saw different batches", True)]
ZOO += [
    ("bug: tutorial no DistributedSampler", "SGD momentum", "float32", tutorial("no_sampler"), "not sharded", True),
    ("bug: tutorial no set_epoch", "SGD momentum", "float32", tutorial("no_set_epoch"), "set_epoch", True),
    ("bug: tutorial deepcopy before DDP", "SGD momentum", "float32", tutorial("deepcopy"), "holds other parameters", True),
    ("bug: tutorial dropout on the ranks", "SGD momentum", "float32", tutorial("dropout"), "dropout", True),
    ("bug: tutorial reference batch not x W", "SGD momentum", "float32", tutorial(ref_batch=16), "another size", True),
    ("bug: hand SUM not divided", "SGD momentum", "float32", hand("sum_no_divide"), "by the world size", False),
    ("bug: hand no all_reduce", "SGD momentum", "float32", hand("no_allreduce"), "not synchronized", False),
    ("bug: hand seeded by rank", "SGD momentum", "float32", hand("rank_seed"), "different weights", False),
    ("bug: tensor parallel rank inputs", "AdamW", "float32", tp("rank_inputs"), "rank-dependent inputs", True),
]


def _cases():
    for name, opt, prec, program, hint, seeded in ZOO:
        for w in SIZES:
            yield pytest.param(name, opt, prec, program, hint, seeded, marks=getattr(pytest.mark, f"gpu{w}"),
                               id=f"{name}-{prec}-w{w}")


@pytest.mark.parametrize("name,opt,prec,program,hint,seeded", list(_cases()))
def test_loop(dist, name, opt, prec, program, hint, seeded):
    w, steps = dist.world_size, BUG_STEPS if hint else STEPS
    fn, ref, with_w, options = program
    if ref is None:
        fn, ref = fn(w)
    # a loop that seeds itself (the hand-written SGD: torch.manual_seed(1234)) runs once, in the first pass
    for seed in (SEEDS if seeded else ([0] if FIRST == 0 else [])):
        if time.time() > DEADLINE:
            pytest.skip("--budget spent")
        dist.seed = seed
        t0 = time.perf_counter()
        try:
            report = dist.assert_same_training(fn, ref, *((w,) if with_w else ()), steps=steps, **options)
            passed, text = True, ""
        except ParityError as exc:
            report, passed, text = exc.report, False, str(exc)
        row = {"name": name, "optimizer": opt, "precision": prec, "world": w, "seed": seed, "steps": steps,
               "bug": bool(hint), "passed": passed, "named": bool(hint) and hint.lower() in text.lower(),
               "vacuous": text.startswith("nothing was compared"), "worst_ratio": report.worst_ratio,
               "strategy": report.facts.strategy, "dtype": report.facts.dtype, "s": time.perf_counter() - t0,
               "tensors": [[r.step, e.kind, e.name, e.norm_err, e.norm_ref, e.floor, e.numel, e.twin]
                           for r in report.records for e in r.errors]}
        with open(OUT, "a") as f:
            f.write(json.dumps(row) + "\\n")
'''

RULES = ("float64 run alone", "twin alone", "as shipped")


def is_loops(path: Path) -> bool:
    first = next((line for line in path.read_text().splitlines() if line.strip()), "{}")
    return "precision" in json.loads(first)


def loop_ratio(row, rule: str) -> float:
    """The run's worst error / line (> 1 fails) with the floors ``rule`` allows: the float64 run's,
    the twin's, or as shipped (the float64 run's where it ran, the twin's where it did not or where
    the run is in a low precision: loops.add_companions)."""
    from pytest_mgpu.parity import tolerance as T
    from pytest_mgpu.parity.records import RunFacts, StepRecord, TensorError

    low = "bf16" in row["precision"] or row["dtype"] in ("bfloat16", "float16")  # the twin runs beside
    facts = RunFacts(row["strategy"], row["world"], dtype=row["dtype"], microbatches=row["world"], resynced=False)
    shadow_ran = any(t[5] is not None and math.isfinite(t[5]) for t in row["tensors"])
    use_floor = rule == RULES[0] or (rule == RULES[2] and shadow_ran)
    use_twin = rule == RULES[1] or (rule == RULES[2] and (not shadow_ran or low))
    records = {}
    for step, kind, name, err, ref, floor, numel, twin in row["tensors"]:
        e = TensorError(kind, name, (numel,), err, ref, norm_err=err, norm_ref=ref, numel=numel,
                        floor=floor if use_floor and floor is not None else math.nan,
                        twin=twin if use_twin and twin is not None else math.nan)
        records.setdefault(step, StepRecord(step)).errors.append(e)
    tol, _ = T.measure_tolerance([records[s] for s in sorted(records)], facts)
    tol = tol or T.derive_tolerance(facts)
    return max((tol.ratio(e, r.step) for r in records.values() for e in r.errors), default=0.0)


def analyze_loops(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    table = defaultdict(lambda: {"runs": 0, "seeds": set(), "named": 0, "s": 0.0})
    for row in rows:
        key = ("bug" if row["bug"] else "ok", row["name"], row["precision"], row["optimizer"], row["world"], row["steps"])
        agg = table[key]
        agg["runs"] += 1
        agg["seeds"].add(row["seed"])
        agg["named"] += row["named"]
        agg["s"] += row["s"]
        for rule in RULES:
            r = loop_ratio(row, rule)
            agg[rule] = min(agg.get(rule, math.inf), r) if row["bug"] else max(agg.get(rule, 0.0), r)
    out = []
    for k, v in sorted(table.items()):
        named = f"{v['named']}/{v['runs']}" if k[0] == "bug" else ""
        out.append([*k, v["runs"], len(v["seeds"])] + [f"{v[r]:.3g}" for r in RULES] + [named, f"{v['s'] / v['runs']:.0f}"])
    print(tabulate(out, headers=["", "config", "precision", "optimizer", "W", "steps", "runs", "seeds", *RULES,
                                 "hint named", "s/run"]))
    print("\nfigures: worst error / line of a run (> 1 fails): for correct runs the largest over seeds, for bugs "
          "the smallest")
    for rule in RULES:
        ok = [v[rule] for k, v in table.items() if k[0] == "ok"]
        bug = [v[rule] for k, v in table.items() if k[0] == "bug"]
        n_ok = sum(v["runs"] for k, v in table.items() if k[0] == "ok")
        n_bug = sum(v["runs"] for k, v in table.items() if k[0] == "bug")
        false = sum(1 for row in rows if not row["bug"] and loop_ratio(row, rule) > 1)
        missed = sum(1 for row in rows if row["bug"] and loop_ratio(row, rule) <= 1 and not row["vacuous"])
        print(f"{rule:>18}: {n_ok} correct runs, worst {max(ok, default=0):.3g}, {false} false alarm(s); "
              f"{n_bug} bug runs, weakest {min(bug, default=math.inf):.3g}, {missed} missed")
    named = sum(row["named"] for row in rows if row["bug"])
    print(f"hints: {named} of {sum(1 for row in rows if row['bug'])} bug runs named their cause; "
          f"{sum(1 for row in rows if not row['bug'] and not row['passed'])} correct run(s) failed as judged when "
          "recorded (by the plugin of that time; the figures above re-judge them with this checkout's rule)")
