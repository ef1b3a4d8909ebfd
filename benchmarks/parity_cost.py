"""What the reference's companions (float64 shadow, float32 twin) cost: the suites' parity calls,
each run with them (the default) and without (an explicit rtol, which needs no measured line),
alternately in one pytest session, so both see the same machine load.

    python benchmarks/parity_cost.py            # a few minutes on 2 cores
    python benchmarks/parity_cost.py --repeat 3

Prints the median seconds per call with and without, and the ratio. Asserts nothing.
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

ROOT = Path(__file__).resolve().parent.parent

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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cost.jsonl"
        (Path(tmp) / "test_cost.py").write_text(TEST_FILE)
        env = dict(os.environ, COST_OUT=str(out), COST_REPEAT=str(args.repeat),
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, "-m", "pytest", "test_cost.py", "--mgpu-fallback=cpu", "-q", "-p",
                        "no:cacheprovider", "--rootdir", tmp], env=env, cwd=tmp, check=False)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    cases = sorted({r["case"] for r in rows}, key=[r["case"] for r in rows].index)
    table, tot = [], {True: 0.0, False: 0.0}
    for case in cases:
        med = {c: statistics.median(r["s"] for r in rows if r["case"] == case and r["companions"] == c)
               for c in (True, False)}
        tot[True] += med[True]
        tot[False] += med[False]
        table.append([case, f"{med[False]:.2f}", f"{med[True]:.2f}", f"{med[True] / med[False]:.2f}x"])
    table.append(["all of the above", f"{tot[False]:.2f}", f"{tot[True]:.2f}", f"{tot[True] / max(tot[False], 1e-9):.2f}x"])
    print(tabulate(table, headers=["parity call", "s without", "s with companions", "ratio"]))


if __name__ == "__main__":
    main()
