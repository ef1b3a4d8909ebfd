"""How well ``dist.assert_same_training`` diagnoses held-out training bugs: false alarms on correct
loops, bugs caught, and whether the first "likely cause" names the bug.

    nice -n 5 python benchmarks/parity/parity_diagnosis.py                  # the first set: 65 cases, ~1 min on 2 cores
    python benchmarks/parity/parity_diagnosis.py -k moe_ep --json out.jsonl  # some cases, rows kept
    python benchmarks/parity/parity_diagnosis.py --analyze out.jsonl        # print a saved run again
    python benchmarks/parity/parity_diagnosis.py --set set2                 # the second held-out set
    python benchmarks/parity/parity_diagnosis.py --set set3 --plugin ../wt-before   # another checkout judged
    python benchmarks/parity/parity_diagnosis.py --set set4                 # Lightning, accelerate, transformers, peft
    python benchmarks/parity/parity_diagnosis.py --set set5                 # hand-sharded TP, EP MoE, AMP, ...
    python benchmarks/parity/parity_diagnosis.py --set set6                 # vocab-parallel CE, 1F1B by hand, all_to_all top-2, ...
    python benchmarks/parity/parity_diagnosis.py --set set7                 # ring attention, DLRM tables, GRPO, DPO, SyncBN FCN, ...
    python benchmarks/parity/parity_diagnosis.py --set set8                 # DDPM, TBPTT LSTM, Ulysses, KD, ZeRO-2 fp16, bf16 masters
    python benchmarks/parity/parity_diagnosis.py --set set9                 # MLM masking, MAE, mixup/cutmix, PPO+GAE, SimCLR gather
    python benchmarks/parity/parity_diagnosis.py --set set10                # MoCo queue, focal num_pos, CTC lengths, beta-VAE, T5, ViT LLRD
    python benchmarks/parity/parity_diagnosis.py --set set11                # the same six kinds, written by a second outsider
    python benchmarks/parity/parity_diagnosis.py --set set12                # WGAN-GP, SAM, SWA, LARS, bf16 AMP + checkpointing, TP x DP
    python benchmarks/parity/parity_diagnosis.py --set set13                # DP-SGD, Lion/Adafactor, schedule-free, GCN sampling, SNGAN, MTL weights, Switch MoE
    python benchmarks/parity/parity_diagnosis.py --set set14                # Muon, Barlow Twins, DiT CFG, two-tower logQ, packed LM, tied-embedding pipeline, OHEM
    python benchmarks/parity/parity_diagnosis.py --set set15                # Mean Teacher, aux-loss-free EP MoE, AMP + plateau, accelerate GPT-2, Fabric ConvNeXt, peft DoRA
    python benchmarks/parity/parity_diagnosis.py --set set16                # BERT accumulation, Megatron TP, Fabric GPT, timm ViT + EMA, top-1 MoE capacity, GPipe by hand
    python benchmarks/parity/parity_diagnosis.py --set set17                # CLIP gather, T5, SWA, ZeroRedundancyOptimizer, focal num_pos, DINO centering
    python benchmarks/parity/parity_diagnosis.py --set set18                # Fabric bf16 distillation, pseudo-labels in eval, Mixtral aux loss, Partial FC, nnU-Net dice, YOLOv5 warm-up
    python benchmarks/parity/parity_diagnosis.py --set set19                # Megatron sequence parallel, GradCache retrieval, SAC, StyleGAN2 lazy R1, accelerate plateau validation, Fabric fp16 scaler
    python benchmarks/parity/parity_diagnosis.py --set set20                # timm cosine + accumulation, expert-choice EP MoE, Llama TP by hand, R-Drop fp16, memory-bank NCE, GPT-2 poly schedule

Method. ``benchmarks/heldout/set1/`` holds nine trainer families written after public code (each
module's docstring names it): per family a correct distributed loop ``train``, its correct
one-device loop ``reference``, correct variants (``CORRECT``) and bugs (``BUGS``, each a flag of
``train`` only). ``benchmarks/heldout/set1/rubric.py`` holds, per bug, the expected first cause and the
regexes that accept a diagnosis; it was committed before the first run and is not tuned to the
messages. This script writes one pytest file into a temporary folder whose single parametrized test
runs ``dist.assert_same_training(partial(train, bug=..., variant=...), reference, world_size,
steps=STEPS, record="optimizer")`` per case, and runs it as ``python -m pytest <file>
--mgpu-fallback=cpu -p no:cacheprovider`` with this checkout first on ``PYTHONPATH`` (so the plugin
judged is this checkout's). Each case appends one JSON row: outcome (``passed`` or the exception's
class), message, wall seconds. A correct run that fails is a false alarm; a bug that passes is
missed; a caught bug's diagnosis is right when a rubric regex matches the first line containing
"likely cause" (lower-cased); a second column applies the same regexes to that line's cause alone
(the text before "Fix:"), and the cases where the two disagree are listed for a reader to settle.
An exception other than ParityError / StepCountError is a crash (the families' code is meant not to
raise); it is a crash inside the plugin when the innermost frame among the plugin's files and the
families' is the plugin's (or when it was raised in the test process itself). A family with a
``SHARDS`` dict (hand-sharded tensors no concatenation rebuilds) gets it as ``shards=`` when the
judged plugin's ``assert_same_training`` has that keyword; the row records ``shards_passed``. The ranks run with
``OMP_NUM_THREADS=1`` unless it is set: on a loaded 2-core machine intra-op threads make a tiny
model's step 50x slower. Asserts nothing.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.parity.diagnosis_report import report  # noqa: E402

SETS = ("set1", "set2", "set3", "set4", "set5", "set6", "set7", "set8", "set9", "set10", "set11", "set12", "set13", "set14", "set15",
        "set16", "set17", "set18", "set19", "set20")  # under benchmarks/heldout/
OLD_NAMES = {"heldout": "set1", "heldout2": "set2", "heldout3": "set3", "heldout4": "set4", "heldout5": "set5"}  # what --set once took
PLUGIN = ROOT  # the checkout whose pytest_mgpu is judged; --plugin picks another
PACKAGE = "heldout.set1"  # the family set judged; --set picks another before anything reads it


def families() -> tuple[str, ...]:
    """The families of the chosen set."""
    return importlib.import_module(f"benchmarks.{PACKAGE}").FAMILIES


# The location a cause line names (`at amp_skip.py:69 (scheduler.step)`, `at a.py:85 (backward) to :87
# (optimizer.step)`, `at tp_mlp.py:109-115`): a file's name is no diagnosis, so the rubric does not read it.
LOCATION = re.compile(r" at [\w.-]+\.py:[\d, :-]*\d( \([^)]*\))?( to [\w.-]*:\d+( \([^)]*\))?)?")


def right(bug_id: str, cause: str | None) -> bool:
    """The chosen set's rubric, on the cause without the location it names."""
    cause = LOCATION.sub("", cause) if cause else cause
    return importlib.import_module(f"benchmarks.{PACKAGE}.rubric").right(bug_id, cause)

CAUGHT = ("ParityError", "StepCountError")

TEST_FILE = '''
import functools, importlib, inspect, json, os, time, pytest
import pytest_mgpu

OUT = os.environ["DIAG_OUT"]
CASES = json.loads(os.environ["DIAG_CASES"])


@pytest.mark.parametrize("case", [pytest.param(c, marks=getattr(pytest.mark, "gpu%d" % c["world"]), id=c["name"])
                                  for c in CASES])
def test_case(dist, case):
    fam = importlib.import_module("benchmarks." + os.environ["DIAG_PACKAGE"] + "." + case["family"])
    fn = functools.partial(fam.train, bug=case["bug"], variant=case["variant"])
    row = dict(case)
    row["plugin"] = os.path.dirname(os.path.dirname(os.path.abspath(pytest_mgpu.__file__)))
    kw = {}
    if getattr(fam, "SHARDS", None) and "shards" in inspect.signature(dist.assert_same_training).parameters:
        kw["shards"] = fam.SHARDS   # a hand-sharded family's unsharding, where the plugin takes it
    row["shards_passed"] = bool(kw)
    t0 = time.perf_counter()
    try:
        report = dist.assert_same_training(fn, fam.reference, dist.world_size, steps=fam.STEPS,
                                           record="optimizer", **kw)
        row["outcome"], row["message"] = "passed", ""
        row["notes"] = [str(n) for n in report.notes][:6]
    except Exception as exc:  # every outcome is a row; the script judges them
        row["outcome"], row["message"] = type(exc).__name__, str(exc)
    row["s"] = time.perf_counter() - t0
    with open(OUT, "a") as f:
        f.write(json.dumps(row) + "\\n")
'''


def all_cases() -> list[dict]:
    """Every correct variant at each of its world sizes, then every bug at 2 ranks (the family's
    ``BUG_WORLD`` where it sets one)."""
    cases = []
    for family in families():
        mod = importlib.import_module(f"benchmarks.{PACKAGE}.{family}")
        for variant, worlds in mod.CORRECT.items():
            for w in worlds:
                cases.append({"name": f"{family}.ok-{variant}-w{w}", "family": family, "bug": None,
                              "variant": None if variant == "default" else variant, "world": w})
        bw = getattr(mod, "BUG_WORLD", 2)   # a family whose bugs need more ranks says so
        for bug in mod.BUGS:
            cases.append({"name": f"{family}.{bug}-w{bw}", "family": family, "bug": bug, "variant": None, "world": bw})
    return cases


def pythonpath() -> str:
    """The judged checkout first, then this repo's root (the families), then what was set."""
    parts = [str(PLUGIN)] + ([str(ROOT)] if PLUGIN != ROOT else []) + [os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(parts)


def check_plugin() -> None:
    """Stop unless ``pytest_mgpu`` imports from the judged checkout in the ranks' environment."""
    got = subprocess.run([sys.executable, "-c", "import pytest_mgpu; print(pytest_mgpu.__file__)"],
                         env=dict(os.environ, PYTHONPATH=pythonpath()), cwd=tempfile.gettempdir(),
                         capture_output=True, text=True, check=True).stdout.strip()
    if Path(got).resolve().parent.parent != PLUGIN:
        raise SystemExit(f"pytest_mgpu imports from {got}, not from {PLUGIN}")
    print(f"plugin judged: {got}", flush=True)


def run(cases: list[dict], out: Path) -> float:
    """Run ``cases`` in one pytest session; rows are appended to ``out``. Returns wall seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "test_diagnosis.py").write_text(TEST_FILE)
        env = dict(os.environ, DIAG_OUT=str(out), DIAG_CASES=json.dumps(cases), DIAG_PACKAGE=PACKAGE,
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                   PYTHONPATH=pythonpath())
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "test_diagnosis.py", "--mgpu-fallback=cpu", "-q", "-p",
                        "no:cacheprovider", "--rootdir", tmp], env=env, cwd=tmp, check=False)
        return time.perf_counter() - t0


def first_cause(message: str) -> str | None:
    """The first line of ``message`` that holds "likely cause" with text after it, else the first
    item under a "likely causes:" heading."""
    lines = message.splitlines()
    for i, line in enumerate(lines):
        low = line.lower()
        if "likely cause" in low:
            rest = re.sub(r".*likely causes?:?", "", line, flags=re.I).strip()
            if rest:
                return line.strip()
            for nxt in lines[i + 1:]:
                if nxt.strip():
                    return nxt.strip()
    return None


def plugin_crash(row: dict) -> bool:
    """An error that is neither a verdict nor the user's: any exception class other than the
    verdicts raised in the test process, or a RankFailure whose innermost frame among the plugin's
    and the families' files is the plugin's."""
    if row["outcome"] in CAUGHT + ("passed",):
        return False
    if row["outcome"] != "RankFailure":
        return True
    frames = [f for f in re.findall(r'File "([^"]+)"', row["message"])
              if "pytest_mgpu" in f or "benchmarks/heldout/" in f]
    return bool(frames) and "pytest_mgpu" in frames[-1]


def judge(row: dict) -> dict:
    """Add ``kind`` (correct / bug), ``caught``, ``cause``, ``right``, ``right_cause_only``, ``crash``
    and ``plugin_crash`` to a result row. ``right`` applies the rubric to the whole first
    likely-cause line (its "Fix:" included), ``right_cause_only`` to the text before "Fix:"."""
    row = dict(row)
    row["kind"] = "bug" if row["bug"] else "correct"
    row["crash"] = row["outcome"] not in CAUGHT + ("passed",)
    row["plugin_crash"] = plugin_crash(row)
    row["caught"] = row["outcome"] in CAUGHT
    row["cause"] = first_cause(row["message"]) if row["message"] else None
    bug_id = f"{row['family']}.{row['bug']}"
    row["right"] = bool(row["bug"]) and row["caught"] and right(bug_id, row["cause"])
    cause_only = re.split(r"\.\s+fix:", row["cause"] or "", maxsplit=1, flags=re.I)[0]
    row["right_cause_only"] = bool(row["bug"]) and row["caught"] and right(bug_id, cause_only)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="keep the cases whose name contains this (comma: any of)")
    parser.add_argument("--json", type=Path, help="also keep the rows in this JSONL file")
    parser.add_argument("--analyze", type=Path, help="print the report of a saved JSONL file; run nothing")
    parser.add_argument("--set", choices=SETS + tuple(OLD_NAMES), default="set1", dest="package",
                        help="the family set under benchmarks/heldout/: set1 (default), set2, ..., set19 or set20")
    parser.add_argument("--plugin", type=Path, default=ROOT,
                        help="the checkout whose pytest_mgpu is judged (default: this one)")
    args = parser.parse_args()
    global PACKAGE, PLUGIN
    PACKAGE = "heldout." + OLD_NAMES.get(args.package, args.package)
    PLUGIN = args.plugin.resolve()
    if args.analyze:
        rows = [json.loads(line) for line in args.analyze.read_text().splitlines() if line.strip()]
        report([judge(r) for r in rows], None)
        return
    check_plugin()
    keys = [k for k in args.k.split(",") if k]
    cases = [c for c in all_cases() if not keys or any(k in c["name"] for k in keys)]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.json.resolve() if args.json else Path(tmp) / "rows.jsonl"
        if out.exists():
            out.unlink()
        wall = run(cases, out)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    missing = {c["name"] for c in cases} - {r["name"] for r in rows}
    report([judge(r) for r in rows], wall, sorted(missing))


if __name__ == "__main__":
    main()
