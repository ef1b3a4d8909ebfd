"""What the reference's companions (float64 shadow, float32 twin) cost: the suites' parity calls,
each run with them (the default) and without (an explicit rtol, which needs no measured line),
alternately in one pytest session, so both see the same machine load.

    python benchmarks/parity/parity_cost.py            # a few minutes on 2 cores
    python benchmarks/parity/parity_cost.py --repeat 3

Prints the median seconds per call with and without, and the ratio. Asserts nothing.

``--training`` measures ``dist.assert_same_training`` instead: per case, the call against running the
two loops once each (the distributed loop in the ranks, the one-device loop in one process, each
stopped after the same N steps by a bare optimizer hook), alternately in one session. The ratio is
what recording, the companions (float64 run or same-precision twin) and the judgement cost on top of
the user's own training; the budget is 2x on every case (docs/design/parity-calibration.md, "What it
costs", has the figures per case, which cases are still above it, and what each part costs; the
``--repeat 5`` medians vary by 10-30% between sessions on a loaded machine). ``--root /work/main`` runs
the same log-mode cases
against another checkout (the figure before a change; record="optimizer" cases need this one):

    python benchmarks/parity/parity_cost.py --training --repeat 3
    python benchmarks/parity/parity_cost.py --training --root ../main --cases log

``--failing`` measures what a failure costs: per case, ``dist.assert_same_training`` on a loop with a
bug (caught as ParityError, its message built: the localisation and the causes included) against the
same call on the correct loop, alternately in one session. The ratio is what failing adds:

    python benchmarks/parity/parity_cost.py --failing --repeat 3

``--resume`` measures ``dist.assert_resumes`` (suites/resume_trainers.py) against running the
uninterrupted trainer once for the same N steps in a fresh folder; the budget is 3.5x:

    python benchmarks/parity/parity_cost.py --resume --repeat 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[2]

TEST_FILE = '''
import functools, json, os, time, pytest
from suites import models as M

OUT = os.environ["COST_OUT"]
img = functools.partial(M.image_batch, batch=8, size=32)
CASES = [  # the suites' parity calls, as suites/ makes them on emulated CPU ranks
    ("mlp", "ddp", M.mlp, M.mnist_batch, {"steps": 3}, 2),
    ("mlp", "ddp", M.mlp, M.mnist_batch, {"steps": 3}, 4),
    ("resnet18-gn", "ddp", functools.partial(M.resnet, 18, norm="group"), img, {"steps": 2}, 2),
    ("resnet18-gn", "ddp", functools.partial(M.resnet, 18, norm="group"), img, {"steps": 2}, 4),
    ("mobilenet_v2-gn", "ddp", functools.partial(M.mobilenet_v2, norm="group", dropout=0.0), img, {"steps": 2}, 2),
    ("resnet18-gn", "fsdp", functools.partial(M.resnet, 18, norm="group"), img, {"steps": 2}, 2),
    ("resnet50 split before layer3", "model_parallel", functools.partial(M.resnet, 50), functools.partial(img, batch=4),
     {"steps": 1, "split_points": ["layer3"]}, 2),
    ("resnet18-eval split_size=2", "pipeline", functools.partial(M.resnet, 18, eval_mode=True),
     functools.partial(img, batch=4), {"steps": 1, "split_size": 2}, 2),
]


@pytest.mark.parametrize("repeat", range(int(os.environ.get("COST_REPEAT", "2"))))
@pytest.mark.parametrize("case", [pytest.param(c, marks=getattr(pytest.mark, f"gpu{c[5]}"), id=f"{c[0]}-{c[1]}-w{c[5]}")
                                  for c in CASES])
def test_cost(dist, case, repeat):
    name, strategy, model, batch, opts, _ = case
    for companions in ((True, False) if repeat % 2 == 0 else (False, True)):
        extra = {} if companions else {"rtol": 1e9}
        t0 = time.perf_counter()
        dist.assert_parity(strategy, model, batch, **opts, **extra)
        with open(OUT, "a") as f:
            f.write(json.dumps({"case": f"{name} {strategy} x{dist.world_size}", "companions": companions,
                                "s": time.perf_counter() - t0}) + "\\n")
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--training", action="store_true", help="assert_same_training against the loops alone")
    parser.add_argument("--resume", action="store_true", help="assert_resumes against the trainer run once")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose pytest_mgpu is measured")
    parser.add_argument("--cases", default="", help="--training: 'log' or 'optimizer' keeps those cases")
    parser.add_argument("--failing", action="store_true", help="assert_same_training with a bug against without")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cost.jsonl"
        (Path(tmp) / "test_cost.py").write_text(RESUME_FILE if args.resume else TRAINING_FILE if args.training
                                                 else FAILING_FILE if args.failing else TEST_FILE)
        env = dict(os.environ, COST_OUT=str(out), COST_REPEAT=str(args.repeat), COST_CASES=args.cases,
                   PYTHONPATH=os.pathsep.join([str(args.root.resolve()), os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, "-m", "pytest", "test_cost.py", "--mgpu-fallback=cpu", "-q", "-p",
                        "no:cacheprovider", "--rootdir", tmp], env=env, cwd=tmp, check=False)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    heads = (("trainer once", "assert_resumes") if args.resume else ("loops once each", "assert_same_training")
             if args.training else ("passing", "failing") if args.failing else ("without", "with companions"))
    cases = sorted({r["case"] for r in rows}, key=[r["case"] for r in rows].index)
    table, tot = [], {True: 0.0, False: 0.0}
    for case in cases:
        if {r["companions"] for r in rows if r["case"] == case} != {True, False}:
            continue  # a case that failed (pytest printed why)
        med = {c: statistics.median(r["s"] for r in rows if r["case"] == case and r["companions"] == c)
               for c in (True, False)}
        tot[True] += med[True]
        tot[False] += med[False]
        table.append([case, f"{med[False]:.2f}", f"{med[True]:.2f}", f"{med[True] / med[False]:.2f}x"])
    table.append(["all of the above", f"{tot[False]:.2f}", f"{tot[True]:.2f}", f"{tot[True] / max(tot[False], 1e-9):.2f}x"])
    print(tabulate(table, headers=["call", f"s {heads[0]}", f"s {heads[1]}", "ratio"]))


TRAINING_FILE = '''
import functools, json, os, time, pytest, torch
from tests import user_bugs as B

OUT = os.environ["COST_OUT"]
KEEP = os.environ.get("COST_CASES", "")


class _Stop(BaseException):
    pass


def _stop_after(steps, fn, *args, **kwargs):
    """The loop alone, stopped after ``steps`` optimizer steps by a bare global hook."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    count = [0]

    def hook(opt, a, k):
        count[0] += 1
        if count[0] == steps:
            raise _Stop()

    handle = register_optimizer_step_post_hook(hook)
    try:
        fn(*args, **kwargs)
    except _Stop:
        pass
    finally:
        handle.remove()


def _no_log(model, loss):
    pass


def _log_loop(fn, *args, **kwargs):
    fn(_no_log, *args, **kwargs)


CASES = [("hand_dp (log)", "log", B.hand_dp, B.one_device, {"steps": 3}, (2, 4))]
try:
    from tests import public_trainers as P  # this checkout's public trainers (record="optimizer")
except ImportError:
    P = None
if P is not None:
    CASES += [
        ("ddp tutorial (mp.spawn)", "optimizer", "tutorial", None, {"steps": 10, "spawn": True}, (2, 4)),
        ("minGPT f32-pinned (twin)", "optimizer", P.gpt_ddp_train, P.gpt_one_device, {"steps": 20}, (2, 4)),
        ("minGPT dtype=None (float64 run)", "optimizer", functools.partial(P.gpt_ddp_train, dtype=None),
         functools.partial(P.gpt_one_device, dtype=None), {"steps": 20}, (2,)),
        ("tensor parallel", "optimizer", P.tp_train, P.tp_one_device, {"steps": 20}, (2,)),
    ]
CASES = [c for c in CASES if not KEEP or c[1] == KEEP]


def _programs(case, w):
    name, record, fn, ref, opts, _ = case
    if fn == "tutorial":
        fn = functools.partial(P.multigpu_main, world_size=w, save_every=10**6, total_epochs=1000, batch_size=16)
        ref = functools.partial(P.single_gpu_main, "cpu", 1000, 10**6, 16 * w)
        return fn, ref, ()
    return fn, ref, (w,)


@pytest.mark.parametrize("repeat", range(int(os.environ.get("COST_REPEAT", "2")) + 1))  # 0: warm-up
@pytest.mark.parametrize("case", [pytest.param(c, marks=getattr(pytest.mark, f"gpu{w}"), id=f"{c[0]}-w{w}")
                                  for c in CASES for w in c[5]])
def test_cost(dist, case, repeat):
    name, record, _, _, opts, _ = case
    fn, ref, args = _programs(case, dist.world_size)
    steps = opts["steps"]
    for checked in ((True, False) if repeat % 2 == 0 else (False, True)):
        t0 = time.perf_counter()
        if checked:
            extra = {} if record == "log" else {"record": "optimizer"}
            dist.assert_same_training(fn, ref, *args, **opts, **extra)
        elif record == "log":
            dist.run(_log_loop, fn, *args, steps=steps)
            dist.run_single(_log_loop, ref, *args, steps=steps)
        elif opts.get("spawn"):
            dist.spawn(functools.partial(_stop_after, steps, fn))
            dist.run_single(_stop_after, steps, ref)
        else:
            dist.run(_stop_after, steps, fn, *args)
            dist.run_single(_stop_after, steps, ref, *args)
        if repeat == 0:
            continue  # the first round imports what each side needs in the warm ranks: not counted
        with open(OUT, "a") as f:
            f.write(json.dumps({"case": f"{name} x{dist.world_size}", "companions": checked,
                                "s": time.perf_counter() - t0}) + "\\n")
'''

RESUME_FILE = '''
import functools, json, os, tempfile, time, pytest
from suites import resume_trainers as T
from pytest_mgpu.parity.resume.folder import in_folder

OUT = os.environ["COST_OUT"]
P = functools.partial
CASES = [  # the suite's sizes, where the plugin's fixed costs weigh most; then wider models
    ("ddp snapshot", T.ddp_snapshot, 24, 14, None, 2), ("gpt adamw+cosine", T.gpt_train, 12, 6, None, 2),
    ("fsdp2 dcp", T.fsdp2_dcp, 6, 3, None, 2), ("fsdp2 dcp 4->2", T.fsdp2_dcp, 6, 3, 2, 4),
    ("ddp snapshot h=2048", P(T.ddp_snapshot, hidden=2048, lr=0.002), 24, 14, None, 2),
    ("gpt dim=256", P(T.gpt_train, dim=256, global_batch=64), 12, 6, None, 2),
    ("fsdp2 dcp dim=256", P(T.fsdp2_dcp, dim=256), 6, 3, None, 2),
    ("fsdp2 dcp dim=256 4->2", P(T.fsdp2_dcp, dim=256), 6, 3, 2, 4)]


class _Stop(BaseException):
    pass


def _once(steps, fn, folder):
    from torch.optim.optimizer import register_optimizer_step_post_hook
    taken = [0]

    def hook(opt, args, kwargs):
        taken[0] += 1
        if taken[0] >= steps:
            raise _Stop()
    handle = register_optimizer_step_post_hook(hook)
    try:
        with in_folder(folder):
            fn()
    except _Stop:
        pass
    finally:
        handle.remove()


@pytest.mark.parametrize("repeat", range(int(os.environ.get("COST_REPEAT", "2")) + 1))  # 0: warm-up
@pytest.mark.parametrize("case", [pytest.param(c, marks=getattr(pytest.mark, f"gpu{c[5]}"), id=c[0]) for c in CASES])
def test_cost(dist, case, repeat):
    name, fn, steps, stop, after, _ = case
    for checked in ((True, False) if repeat % 2 == 0 else (False, True)):
        t0 = time.perf_counter()
        if checked:
            dist.assert_resumes(fn, steps=steps, stop_after=stop, world_size_after=after)
        else:
            dist.run(_once, steps, fn, tempfile.mkdtemp())
        if repeat == 0:
            continue
        with open(OUT, "a") as f:
            f.write(json.dumps({"case": f"{name} x{dist.world_size}", "companions": checked,
                                "s": time.perf_counter() - t0}) + "\\n")
'''


FAILING_FILE = '''
import functools, json, os, time, pytest
from pytest_mgpu import ParityError
from tests import evidence_loops as L, public_trainers as P

OUT = os.environ["COST_OUT"]
F = functools.partial
CASES = [  # (name, correct fn, buggy fn, reference, options, world sizes)
    ("hand dp, ranks seeded apart", L.hand_dp, F(L.hand_dp, bug="seed_apart"), L.reference, {"steps": 4}, (2,)),
    ("hand dp, sum not divided", L.hand_dp, F(L.hand_dp, bug="sum_no_divide"), L.reference, {"steps": 4}, (2, 4)),
    ("hand dp, EMA teacher on rank 0", F(L.hand_dp, bug="teacher"), F(L.hand_dp, bug="ema_rank0_only"),
     F(L.reference, bug="teacher"), {"steps": 4}, (2,)),
    ("minGPT DDP, no_sync left on", P.gpt_ddp_train, F(P.gpt_ddp_train, bug="no_sync"), P.gpt_one_device,
     {"steps": 20}, (2,)),
    ("minGPT DDP, loss x world", P.gpt_ddp_train, F(P.gpt_ddp_train, bug="loss_times_world"), P.gpt_one_device,
     {"steps": 20}, (2,)),
]


@pytest.mark.parametrize("repeat", range(int(os.environ.get("COST_REPEAT", "2")) + 1))  # 0: warm-up
@pytest.mark.parametrize("case", [pytest.param(c, marks=getattr(pytest.mark, f"gpu{w}"), id=f"{c[0]}-w{w}")
                                  for c in CASES for w in c[5]])
def test_cost(dist, case, repeat):
    name, good, bad, ref, opts, _ = case
    for failing in ((True, False) if repeat % 2 == 0 else (False, True)):
        t0 = time.perf_counter()
        try:
            dist.assert_same_training(bad if failing else good, ref, dist.world_size, record="optimizer", **opts)
            assert not failing, "the bug was not caught"
        except ParityError as exc:
            assert failing, str(exc)
            str(exc)
        if repeat == 0:
            continue
        with open(OUT, "a") as f:
            f.write(json.dumps({"case": f"{name} x{dist.world_size}", "companions": failing,
                                "s": time.perf_counter() - t0}) + "\\n")
'''


if __name__ == "__main__":
    main()
