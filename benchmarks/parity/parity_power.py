"""The power of the parity checks: the smallest bug ``assert_same_training`` and ``assert_resumes`` catch.

Trainer families (``benchmarks/parity/power_trainers.py``, gloo CPU ranks, world size 2): ``ddp`` (a causal LM,
DDP, DistributedSampler, AdamW + warm-up/cosine LambdaLR + clip 1.0), ``fsdp2`` (fully_shard per block,
AdamW), ``tp`` (ColwiseParallel/RowwiseParallel, AdamW), ``accum`` (DDP, 4 micro-batches with no_sync,
loss / 4, clip 1.0), and ``ddp-resume`` (the ``ddp`` trainer checkpointing every 4 steps, judged by
``assert_resumes(steps=N, stop_after=round(0.7 N))``: 20 -> 14, resumed from step 12).

Bugs of size eps in {1e-1, 1e-2, 1e-3, 1e-4}, on the distributed side only (keyword flags bound into
``fn`` with ``functools.partial``; the reference never sees them), from step ``at`` = N x ``--at``
(default 0.5; 0-based): ``lr`` (every rank's learning rate x (1+eps)), ``grad`` (the last rank's
gradients x (1+eps), after their sync and clipping, before the step), ``moment`` (Adam's exp_avg zeroed
for a fraction eps of its elements, once, before step ``at``), ``weight_decay``, ``momentum`` (Adam's beta1)
and ``betas`` (beta2, held below 1) x (1+eps) from step ``at`` (options judged exactly: caught at any eps
beyond float rounding); for ``ddp-resume``: ``resume_lr`` (the
resumed run's learning rate x (1+eps)) and ``no_scheduler`` (the scheduler's state not loaded on resume;
no eps). A bug is caught when the check raises ``ParityError``.

The eps are bisected, not all run: a bug not caught at eps is assumed not caught below it (the error
it makes shrinks with eps while the line does not), so per family, step count and bug kind the
smallest eps caught takes 2-3 runs (``--all-eps`` runs every eps, to check that assumption). Cells
not run are printed in parentheses, inferred from their neighbours.

False alarms: ``--repeats R`` correct runs per family and step count (data and init seeds 100, 101, ...),
counted "k of n correct runs failed"; ``--burners 6`` runs 6 busy-loop processes for the duration
(killed at the end); ``--no-bugs`` runs only the correct runs.

    python benchmarks/parity/parity_power.py                     # steps 6,20, every family, 2 repeats: ~6 min*
    python benchmarks/parity/parity_power.py --quick             # steps 6, eps 1e-1 and 1e-3, 1 repeat: ~1 min*
    python benchmarks/parity/parity_power.py --steps 100 -k ddp  # opt-in: 25-60 s a check at 100 steps*
    python benchmarks/parity/parity_power.py --no-bugs --repeats 10 --burners 6 --steps 6,20
    python benchmarks/parity/parity_power.py --json runs.jsonl ; python benchmarks/parity/parity_power.py --analyze runs.jsonl

(*) on a shared 2-core machine at load 6-9 (97 checks by default: a median 1.8 s at 6 steps, 5.6 s at 20;
every family at 100 steps: about 50 checks, 20-40 min); see docs/design/parity-calibration.md, "Power".
``POWER_ATTN_BIAS=0`` drops the attention biases (whose key bias has no true gradient). The checkout this
script lives in is put first on PYTHONPATH, so it measures that checkout's plugin. Prints, asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from power_report import analyze  # noqa: E402

EPS = [1e-1, 1e-2, 1e-3, 1e-4]
FAMILIES = ["ddp", "fsdp2", "tp", "accum", "ddp-resume"]
KINDS = {"ddp-resume": ["resume_lr", "no_scheduler"]}
SAME_TRAINING_KINDS = ["lr", "grad", "moment", "weight_decay", "momentum", "betas"]

TEST_FILE = '''
import functools, json, os, time, pytest
from pytest_mgpu import ParityError
import power_trainers as T

P = functools.partial
JOBS = json.load(open(os.environ["POWER_JOBS"]))
OUT = os.environ["POWER_OUT"]


def _check(dist, family, steps, seed, bug):
    """True where the check raised ParityError; the worst ratio; the message's first lines."""
    if family == "ddp-resume":
        fn = P(T.ddp, seed=seed, steps=steps, bug=bug, checkpoint=True)
        call = lambda: dist.assert_resumes(fn, steps=steps, stop_after=round(0.7 * steps))
    else:
        fn, ref = T.FAMILIES[family]
        call = lambda: dist.assert_same_training(P(fn, seed=seed, steps=steps, bug=bug), P(ref, seed=seed, steps=steps),
                                                 steps=steps, record="optimizer")
    try:
        report = call()
        return False, report.worst_ratio, [n for n in report.notes][:2]
    except ParityError as exc:
        return True, exc.report.worst_ratio if exc.report is not None else None, str(exc).splitlines()[:2]


def _run(dist, job, eps):
    bug = None if job["kind"] == "correct" else (job["kind"], eps, job["at"])
    t0 = time.perf_counter()
    try:
        caught, ratio, first = _check(dist, job["family"], job["steps"], job["seed"], bug)
        error = ""
    except Exception as exc:  # a rank failure or a refusal: recorded, counted as neither
        caught, ratio, first, error = None, None, str(exc).splitlines()[:3], type(exc).__name__
    ratio = None if ratio is None else float(ratio)
    row = dict(job, eps=eps, caught=caught, ratio=ratio if ratio is None or ratio < 1e300 else 1e300,
               first=first, error=error, s=time.perf_counter() - t0)
    with open(OUT, "a") as f:
        f.write(json.dumps(row) + "\\n")
    return caught


@pytest.mark.gpu2
@pytest.mark.parametrize("job", JOBS, ids=[j["id"] for j in JOBS])
def test_power(dist, job):
    eps = job["eps"]
    if job["kind"] in ("correct", "no_scheduler"):
        _run(dist, job, 0.0)
    elif job["all_eps"]:
        for e in eps:
            _run(dist, job, e)
    else:  # bisect: every eps before lo caught, every one from hi on passed
        lo, hi = 0, len(eps)
        while lo < hi:
            mid = (lo + hi) // 2
            if _run(dist, job, eps[mid]):
                lo = mid + 1
            else:
                hi = mid
'''


def jobs(args) -> list:
    """The pytest parameters: a bug search per family, step count and bug kind; the correct repeats."""
    out = []
    for steps in [int(s) for s in args.steps.split(",")]:
        for family in [f for f in FAMILIES if not args.select or f in args.select.split(",")]:
            base = {"family": family, "steps": steps, "burners": args.burners, "all_eps": args.all_eps,
                    "attn_bias": os.environ.get("POWER_ATTN_BIAS", "1") != "0",
                    "eps": args.eps, "at": max(1, int(steps * args.at))}
            kinds = [] if args.no_bugs else KINDS.get(family, SAME_TRAINING_KINDS)
            for kind in [k for k in kinds if not args.kinds or k in args.kinds.split(",")]:
                out.append(dict(base, kind=kind, seed=args.seed, id=f"{family}-{steps}-{kind}"))
            for r in range(args.repeats):
                out.append(dict(base, kind="correct", seed=100 + r, id=f"{family}-{steps}-correct-{r}"))
    return out


def run(args, out: Path) -> float:
    """Run the jobs through the real plugin (a pytest subprocess on emulated CPU ranks); the seconds."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    t0 = time.time()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "jobs.json").write_text(json.dumps(jobs(args)))
            (Path(tmp) / "test_power.py").write_text(TEST_FILE)
            env = dict(os.environ, POWER_JOBS=str(Path(tmp) / "jobs.json"), POWER_OUT=str(out),
                       PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks" / "parity"), os.environ.get("PYTHONPATH", "")]))
            cmd = [sys.executable, "-m", "pytest", "test_power.py", "--mgpu-fallback=cpu", "-q", "-p", "no:cacheprovider",
                   "--rootdir", tmp] + (["-x"] if args.exitfirst else [])
            subprocess.run(cmd, env=env, cwd=tmp, check=False)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    return time.time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="6,20", help="optimizer steps per run, comma-separated (6,20,100)")
    parser.add_argument("-k", dest="select", default="", help="families, comma-separated: " + ",".join(FAMILIES))
    parser.add_argument("--eps", default=",".join(f"{e:g}" for e in EPS), help="bug sizes, comma-separated")
    parser.add_argument("--at", type=float, default=0.5, help="the bug starts at step N x AT (0-based, at least 1)")
    parser.add_argument("--seed", type=int, default=0, help="data and init seed of the bug runs")
    parser.add_argument("--repeats", type=int, default=2, help="correct runs per family and step count")
    parser.add_argument("--burners", type=int, default=0, help="busy-loop processes beside the runs")
    parser.add_argument("--no-bugs", action="store_true", help="only the correct runs (false alarms)")
    parser.add_argument("--kinds", default="", help="bug kinds, comma-separated: lr,grad,moment,weight_decay,momentum,betas,resume_lr,no_scheduler")
    parser.add_argument("--all-eps", action="store_true", help="run every eps instead of bisecting")
    parser.add_argument("--quick", action="store_true", help="steps 6, eps 1e-1 and 1e-3, 1 repeat")
    parser.add_argument("-x", dest="exitfirst", action="store_true", help="stop at the first pytest error")
    parser.add_argument("--json", type=Path, default=None, help="append the runs here (JSON lines)")
    parser.add_argument("--analyze", type=Path, default=None, help="print the tables of recorded runs, run nothing")
    args = parser.parse_args()
    if args.analyze:
        analyze(args.analyze)
        return
    if args.quick:
        args.steps, args.eps, args.repeats = "6", "0.1,0.001", 1
    args.eps = sorted((float(e) for e in args.eps.split(",")), reverse=True)
    out = args.json or Path(tempfile.mkdtemp()) / "power.jsonl"
    seconds = run(args, out)
    print(f"runs written to {out} ({seconds:.0f} s, {args.burners} burners)")
    analyze(out)


if __name__ == "__main__":
    main()
