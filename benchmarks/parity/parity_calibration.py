"""Where does a correct strategy land against the float64 floor, and where do real bugs land?

Runs a zoo of correct configurations (MLP, CNN-GN, ResNet18/50 with GroupNorm and with BatchNorm in
eval mode, MobileNetV2-GN, a Transformer encoder; DDP and FSDP at world sizes 2 and 4, DDP with
accumulation, model parallel, one-process pipelines, a GPipe schedule across ranks) and a set of
injected bugs (a loss scaled by 1.01, outputs out of order within micro-batches or shards under an
MSE loss, a 'sum' loss, BatchNorm in train mode, padding of an uneven batch, dropout), each over
several seeds and with torch threads at 1 and at 2 (different reduction orders), through the real
plugin, and records every tensor's error, reference norm and float64 gap. Then it judges the runs
with candidate rules and prints, per rule and configuration, the worst error / floor ratio:

    python benchmarks/parity/parity_calibration.py                  # run (about 10 minutes on 2 cores)
    python benchmarks/parity/parity_calibration.py --seeds 5 --out runs.jsonl
    python benchmarks/parity/parity_calibration.py --analyze runs.jsonl

``--loops`` calibrates ``assert_same_training`` instead, on the user's own loops, which cannot be
re-synchronized: small equivalents of public training code (tests/public_trainers.py: a minGPT-like
trainer with AdamW, float32 pinned or not, in float32 and in bf16 autocast; the DDP tutorial's Trainer
through mp.spawn; the hand-written all_reduce SGD; a tensor-parallel block) for ``--steps`` optimizer
steps (default 100), at world sizes 2 and 4, and the bug set in each setting. It runs every reference
with both companions (the float64 run where it can happen, and the same-precision twin), so the table
shows each floor alone and the rule as shipped (the float64 run where it ran, else the twin), in
units of the line (a run fails above 1):

    python benchmarks/parity/parity_calibration.py --loops --seeds 3 --budget 3600      # the full zoo, ~1-2 h
    python benchmarks/parity/parity_calibration.py --loops --seeds 1 --steps 40 --budget 900 -k "minGPT"

``--budget S`` stops starting runs after S seconds (the table covers what ran); ``-k`` selects
configurations by name (pytest's -k); ``--sizes 2`` keeps one world size.

A rule separates well when every correct run sits far below the chosen multiple and every bug far
above it. Prints; asserts nothing.
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

from parity_calibration_loops import LOOPS_FILE, analyze_loops, is_loops as _is_loops
from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[2]

TEST_FILE = '''
import functools, json, os, pytest, torch
from torch import nn
from pytest_mgpu.parity import ParityError
from suites import models as M

OUT = os.environ["CALIBRATION_OUT"]
SEEDS = range(int(os.environ.get("CALIBRATION_SEEDS", "3")))


def threaded(model_fn, threads):
    torch.set_num_threads(threads)
    return model_fn()


class OutOfOrder(nn.Module):
    """A strategy-only bug: each micro-batch or shard's outputs come back reversed."""
    def __init__(self, inner, full):
        super().__init__()
        self.inner, self.full = inner, full
    def forward(self, x):
        out = self.inner(x)
        return out.flip(0) if x.shape[0] < self.full else out


def out_of_order(model_fn, full):
    return OutOfOrder(model_fn(), full)


def scaled_loss(factor, full, out, y):
    loss = nn.functional.cross_entropy(out, y)
    return loss * factor if out.shape[0] < full else loss


img = functools.partial(M.image_batch, batch=8, size=32)
seq = functools.partial(M.sequence_batch, batch=8)
rn18gn = functools.partial(M.resnet, 18, norm="group")
mbv2gn = functools.partial(M.mobilenet_v2, norm="group", dropout=0.0)
cnngn = functools.partial(M.small_cnn, norm="group")

CORRECT = [
    ("mlp", "ddp", M.mlp, M.mnist_batch, None, {}, (2, 4)),
    ("mlp", "fsdp", M.mlp, M.mnist_batch, None, {}, (2, 4)),
    ("mlp accumulate=2", "ddp", M.mlp, functools.partial(M.mnist_batch, batch=16), None, {"accumulate": 2}, (2,)),
    ("cnn-gn", "ddp", cnngn, img, None, {}, (2, 4)),
    ("cnn-gn", "fsdp", cnngn, img, None, {}, (2,)),
    ("cnn-gn split_size=3", "pipeline", cnngn, img, None, {"split_size": 3}, (2,)),
    ("resnet18-gn", "ddp", rn18gn, img, None, {}, (2, 4)),
    ("resnet18-gn", "fsdp", rn18gn, img, None, {}, (2,)),
    ("resnet18-gn", "model_parallel", rn18gn, img, None, {}, (2, 4)),
    ("resnet18-gn split_size=2", "pipeline", rn18gn, img, None, {"split_size": 2}, (2,)),
    ("resnet18-gn gpipe", "pipeline", functools.partial(M.resnet_sequential, 18, norm="group"), img, None,
     {"schedule": "gpipe", "split_points": ["layer3"]}, (2,)),
    ("resnet18-bn-eval", "ddp", functools.partial(M.resnet, 18, eval_mode=True), img, None, {}, (2,)),
    ("resnet50-gn", "ddp", functools.partial(M.resnet, 50, norm="group"), functools.partial(img, batch=4), None, {}, (2,)),
    ("resnet50-bn-eval", "model_parallel", functools.partial(M.resnet, 50, eval_mode=True), functools.partial(img, batch=4),
     None, {"split_points": ["layer3"]}, (2,)),
    ("mobilenet_v2-gn", "ddp", mbv2gn, img, None, {}, (2, 4)),
    ("mobilenet_v2-gn", "fsdp", mbv2gn, img, None, {}, (2,)),
    ("transformer", "ddp", M.transformer, seq, None, {}, (2, 4)),
    ("transformer", "fsdp", M.transformer, seq, None, {}, (2,)),
]
BUGS = [
    ("loss x1.01 on shards", "ddp", M.mlp, M.mnist_batch, functools.partial(scaled_loss, 1.01, 8), {}, (2,)),
    ("loss x1.01 on shards", "ddp", rn18gn, img, functools.partial(scaled_loss, 1.01, 8), {}, (2,)),
    ("loss x1.01 on shards", "ddp", mbv2gn, img, functools.partial(scaled_loss, 1.01, 8), {}, (2,)),
    ("loss x1.01 on shards", "ddp", M.transformer, seq, functools.partial(scaled_loss, 1.01, 8), {}, (4,)),
    ("micro-batch order, MSE", "pipeline", functools.partial(out_of_order, rn18gn, 8), img, M.mse_onehot,
     {"split_size": 4}, (2,)),
    ("micro-batch order, MSE", "pipeline", functools.partial(out_of_order, functools.partial(M.resnet_sequential, 18, norm="group"), 4),
     functools.partial(img, batch=4), M.mse_onehot, {"split_size": 2}, (2,)),
    ("shard order, MSE", "ddp", functools.partial(out_of_order, mbv2gn, 8), img, M.mse_onehot, {}, (2,)),
    ("shard order, MSE", "ddp", functools.partial(out_of_order, M.mlp, 8), M.mnist_batch, M.mse_onehot, {}, (4,)),
    ("sum loss", "ddp", M.mlp, M.mnist_batch, M.sum_loss, {}, (2,)),
    ("batchnorm train", "ddp", M.small_cnn, img, None, {}, (2,)),
    ("uneven batch 10", "ddp", M.mlp, functools.partial(M.mnist_batch, batch=10), None, {}, (4,)),
    ("dropout 0.1", "ddp", functools.partial(M.mlp, dropout=0.1), M.mnist_batch, None, {}, (2,)),
]


def _cases(table, bug):
    for name, strategy, model, batch, loss, opts, sizes in table:
        for w in sizes:
            yield pytest.param(name, strategy, model, batch, loss, opts, bug, marks=getattr(pytest.mark, f"gpu{w}"),
                               id=f"{'bug' if bug else 'ok'}-{name}-{strategy}-w{w}")


@pytest.mark.parametrize("name,strategy,model,batch,loss,opts,bug", list(_cases(CORRECT, False)) + list(_cases(BUGS, True)))
@pytest.mark.parametrize("threads", [1, 2])
def test_run(dist, name, strategy, model, batch, loss, opts, bug, threads):
    for seed in SEEDS:
        dist.seed = seed
        try:
            report = dist.assert_parity(strategy, functools.partial(threaded, model, threads),
                                        functools.partial(_seeded, batch, seed), loss_fn=loss, steps=4, **opts)
            passed = True
        except ParityError as exc:
            report, passed = exc.report, False
        row = {"name": name, "strategy": report.facts.strategy, "world": dist.world_size, "seed": seed,
               "threads": threads, "bug": bug, "passed": passed, "rule": report.tolerance.rule,
               "microbatches": report.facts.microbatches, "exact": report.facts.exact,
               "worst_ratio": report.worst_ratio,
               "tensors": [[r.step, e.kind, e.name, e.norm_err, e.norm_ref, e.floor, e.numel, e.twin]
                           for r in report.records for e in r.errors]}
        with open(OUT, "a") as f:
            f.write(json.dumps(row) + "\\n")


def _seeded(batch_fn, seed, step):
    return batch_fn(step, seed=seed)
'''


def run(out: Path, seeds: int, select: str, loops: bool = False, budget: float = math.inf, steps: int = 100,
        bug_steps: int = 100, sizes: str = "2,4", first_seed: int = 0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        test = Path(tmp) / "test_calibration.py"
        test.write_text(LOOPS_FILE if loops else TEST_FILE)
        env = dict(os.environ, CALIBRATION_OUT=str(out), CALIBRATION_SEEDS=str(seeds),
                   CALIBRATION_DEADLINE=str(time.time() + budget), CALIBRATION_STEPS=str(steps),
                   CALIBRATION_BUG_STEPS=str(bug_steps), CALIBRATION_SIZES=sizes,
                   CALIBRATION_FIRST_SEED=str(first_seed),
                   PYTEST_MGPU_PARITY_COMPANIONS="both",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "pytest", str(test), "--mgpu-fallback=cpu", "-q", "-p", "no:cacheprovider",
               "--rootdir", tmp] + ([] if loops else ["-x"]) + (["-k", select] if select else [])
        subprocess.run(cmd, env=env, cwd=tmp, check=False)


RULES = ("shadow", "twin", "both", "plugin")


def _twin_agrees(row, facts) -> bool:
    """Rank 0's decision after step 0: retire the shadow where the twin's loss agrees."""
    from pytest_mgpu.parity.judge.tolerance import twin_loss_agrees

    loss = next((t for t in row["tensors"] if t[0] == 0 and t[1] == "loss"), None)
    if loss is None or loss[5] is None or loss[7] is None or loss[4] == 0:
        return False
    return twin_loss_agrees(loss[7], loss[4], loss[5] / loss[4], facts)


def ratio(row, rule: str) -> float:
    """The run's worst error / line, in units of MULTIPLE (so the rule fails where this exceeds 1 x
    MULTIPLE): the plugin's own judge, with the floors it may use restricted to ``rule``."""
    from pytest_mgpu.parity import tolerance as T
    from pytest_mgpu.parity.records import RunFacts, StepRecord, TensorError

    facts = RunFacts(row["strategy"], row["world"], microbatches=row["microbatches"], exact=row["exact"])
    retire = rule == "plugin" and _twin_agrees(row, facts)
    records = {}
    for step, kind, name, err, ref, floor, numel, twin in row["tensors"]:
        keep_floor = rule != "twin" and floor is not None and not (retire and step > 0)
        e = TensorError(kind, name, (numel,), err, ref, norm_err=err, norm_ref=ref, numel=numel,
                        floor=floor if keep_floor else math.nan,
                        twin=twin if rule != "shadow" and twin is not None else math.nan)
        records.setdefault(step, StepRecord(step)).errors.append(e)
    tol, _ = T.measure_tolerance([records[s] for s in sorted(records)], facts)
    tol = tol or T.derive_tolerance(facts)  # as the judge does where nothing was measured
    worst = max((tol.ratio(e, r.step) for r in records.values() for e in r.errors), default=0.0)
    return worst * T.MULTIPLE


def analyze(path: Path) -> None:
    from pytest_mgpu.parity.judge.tolerance import MULTIPLE

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    table = defaultdict(dict)
    for row in rows:
        key = ("bug" if row["bug"] else "ok", row["name"], row["strategy"], row["world"])
        agg = table[key]
        agg["runs"] = agg.get("runs", 0) + 1
        for rule in RULES:
            r = ratio(row, rule)
            if row["bug"]:
                agg[rule] = min(agg.get(rule, math.inf), r)  # the weakest detection over seeds/threads
            else:
                agg[rule] = max(agg.get(rule, 0.0), r)  # the closest call over seeds/threads
    out = [[*k, v["runs"]] + [f"{v[r]:.3g}" for r in RULES] for k, v in sorted(table.items())]
    print(tabulate(out, headers=["", "config", "strategy", "W", "runs"] + [f"{r} (x MULTIPLE)" for r in RULES]))
    print(f"\nMULTIPLE = {MULTIPLE:g}: a run fails where its figure exceeds {MULTIPLE:g}")
    for rule in RULES:
        ok = max((v[rule] for k, v in table.items() if k[0] == "ok"), default=0)
        bug = min((v[rule] for k, v in table.items() if k[0] == "bug"), default=math.inf)
        n_ok = sum(v["runs"] for k, v in table.items() if k[0] == "ok")
        print(f"{rule:>6}: worst of {n_ok} correct runs {ok:.3g}; weakest bug {bug:.3g}; "
              f"separation {bug / max(ok, 1e-300):.3g}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--analyze", type=Path, default=None, help="judge recorded runs, run nothing")
    parser.add_argument("-k", dest="select", default="")
    parser.add_argument("--loops", action="store_true", help="assert_same_training on public training loops")
    parser.add_argument("--budget", type=float, default=math.inf, help="seconds after which no run starts")
    parser.add_argument("--steps", type=int, default=100, help="--loops: optimizer steps of a correct run")
    parser.add_argument("--bug-steps", type=int, default=100, help="--loops: optimizer steps of a bug run")
    parser.add_argument("--sizes", default="2,4", help="--loops: world sizes, comma-separated")
    parser.add_argument("--first-seed", type=int, default=0, help="--loops: seeds first-seed .. first-seed+seeds-1")
    args = parser.parse_args()
    if args.analyze:
        (analyze_loops if _is_loops(args.analyze) else analyze)(args.analyze)
        return
    out = args.out or Path(tempfile.mkdtemp()) / "calibration.jsonl"
    t0 = time.time()
    run(out, args.seeds, args.select, args.loops, args.budget, args.steps, args.bug_steps, args.sizes, args.first_seed)
    print(f"runs written to {out} ({time.time() - t0:.0f} s)")
    (analyze_loops if args.loops else analyze)(out)

if __name__ == "__main__":
    main()
