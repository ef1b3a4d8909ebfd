"""Where CI's time goes: the wall time of each ``.ci/run`` step, the slowest tests with their share, and
what each of them spends its time on. Prints; asserts nothing.

    python benchmarks/ci_cost.py                          # every step of .ci/run but the second torch
    python benchmarks/ci_cost.py --steps tests            # one step (tests, suites, examples, docs, mypy, mkdocs)
    python benchmarks/ci_cost.py --steps tests,suites --top 30
    python benchmarks/ci_cost.py --from tests=run.log     # read a finished run instead: pytest's --durations
                                                          # output (a log) or a junit XML file, per step
    python benchmarks/ci_cost.py --markdown               # the tables as Markdown (docs/design/ci-cost.md)

The steps are the ``run ...`` lines of ``.ci/run`` (the install and the second torch's subset are left
out: the install is a cache question, the subset needs its own venv). Each pytest step runs with
``--junitxml`` and ``--durations=0``; its wall time is the whole command's, its tests' times are what
junit recorded (setup, call and teardown together). While a step runs the load average is read every
5 s: each step's line says the load it ran under (median and highest), since on a shared machine the
same step takes 2-4x longer at load 10 than at load 1.

What a test spends its time on is read from its source, not measured: the test function, the
fixtures it asks for (its module's and its folder's conftest.py's, and those these ask for), the
helpers of its module these call (one level), and the
module's code templates it names (what a pytester session runs). The heuristics, each a count of what
the code does:
- ``pytester sessions``: ``runpytest``/``inline_run`` calls, a ``subpytest`` fixture's ``popen``/``run``
  (a whole pytest session each, with its own rank start-up);
- ``process starts``: ``--mgpu-isolate``, ``subprocess``, ``sys.executable``, ``mp.spawn``, ``dist.spawn``
  (fresh interpreters, each importing torch: about a second each on 2 cores);
- ``rank calls``: ``dist.run``/``run_single``/``benchmark`` and the parity checks, and a ``dist`` fixture
  (warm ranks: the first call of a session starts them and imports torch in each);
- ``float64 shadow``: ``assert_same_training``/``assert_parity``/``assert_resumes`` (the reference loop
  again in float64 and a float32 twin, unless an explicit tolerance is given);
- ``model builds``: torchvision models, transformers, the trainer zoos of tests/ and suites/;
- ``calibration loops``: a loop of 100 or more iterations, or the words false alarm / power / trials;
- ``timing loops``: ``dist.benchmark``, ``min_run_time``, ``--mgpu-against`` (timed iterations);
- ``torch.compile``: a compile in the test or its ranks.
The order printed is by count; the first is the likeliest cost. A test none matches says "plain".
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
STEP_NAMES = {"tests/": "tests", "suites/": "suites", "examples/": "examples", "README.md": "docs",
              "mypy": "mypy", "mkdocs": "mkdocs"}

# category: patterns over a test's source (and its helpers'); a fixture name counts once
CATEGORIES: Dict[str, Tuple[str, ...]] = {
    "pytester sessions": (r"\brunpytest\w*\(", r"\binline_run\(", r"\bsubpytest\.(?:popen|run)\(", r"\bpytester\b",
                          r"\bSubpytest\("),
    "process starts": (r"--mgpu-isolate", r"\bsubprocess\.", r"sys\.executable", r"\bmp\.spawn\(",
                       r"\bdist\.spawn\(", r"\bPopen\("),
    "rank calls": (r"\bdist\.(?:run|run_single|benchmark)\(", r"\bworld_sizes\(", r"\bdist\b"),
    "float64 shadow": (r"assert_same_training\(", r"assert_parity\(", r"assert_resumes\("),
    "model builds": (r"torchvision", r"\bresnet\w*\(", r"mobilenet", r"Transformer", r"\bGPT\b",
                     r"\b(?:public_trainers|modern_trainers|adam_trainers|power_trainers|models)\.\w+"),
    "calibration loops": (r"range\(\s*[1-9]\d{2,}\s*\)", r"false.alarm rate", r"\btrials\b"),
    "timing loops": (r"\bdist\.benchmark\(", r"min_run_time", r"--mgpu-against"),
    "torch.compile": (r"torch\.compile",),
}
ONCE = {r"\bpytester\b", r"\bdist\b"}  # fixtures: present or not, not a count


@dataclass
class Step:
    name: str
    command: List[str]
    wall_s: Optional[float] = None
    rc: Optional[int] = None
    load: Tuple[float, float, float] = (0.0, 0.0, 0.0)  # first, median, highest load average seen
    tests: Dict[str, float] = field(default_factory=dict)  # nodeid -> seconds
    source: str = "run"  # or the file it was read from


def ci_steps() -> List[Step]:
    """The plain ``run ...`` lines of .ci/run, named by what they run."""
    steps = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        if not line.startswith("run ") or "$" in line:
            continue
        cmd = shlex.split(line[4:])
        name = next((n for key, n in STEP_NAMES.items() if key in cmd or key in cmd[0:3]), cmd[-1])
        steps.append(Step(name, cmd))
    return steps


class LoadSampler:
    """Reads /proc/loadavg every ``every`` seconds until stopped."""

    def __init__(self, every: float = 5.0):
        self.seen: List[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.seen.append(os.getloadavg()[0])

    def finish(self) -> Tuple[float, float, float]:
        self._stop.set()
        self._thread.join()
        return self.seen[0], statistics.median(self.seen), max(self.seen)


def run_step(step: Step) -> Step:
    """Run one step; a pytest step records every test's time through junit XML."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = list(step.command)
        if "pytest" in cmd:
            cmd += [f"--junitxml={junit}", "--durations=0"]
        sampler = LoadSampler()
        t0 = time.perf_counter()
        out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        step.wall_s = time.perf_counter() - t0
        step.load = sampler.finish()
        step.rc = out.returncode
        tail = out.stdout.strip().splitlines()[-1:] if out.stdout.strip() else []
        print(f"{step.name}: {step.wall_s:.0f} s, rc {step.rc}; {' '.join(tail)}", flush=True)
        if junit.is_file():
            step.tests = read_junit(junit)
    return step


def read_junit(path: Path) -> Dict[str, float]:
    """nodeid -> seconds, from a junit XML file (xunit2: classname is the module path with dots)."""
    times: Dict[str, float] = {}
    for case in ET.parse(path).iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        parts = cls.split(".")
        # the module is the longest prefix that is a file; the rest are classes
        for cut in range(len(parts), 0, -1):
            module = ROOT / Path(*parts[:cut]).with_suffix(".py")
            if module.is_file():
                nodeid = "::".join([str(module.relative_to(ROOT))] + parts[cut:] + [name])
                break
        else:
            nodeid = f"{cls}::{name}"
        times[nodeid] = times.get(nodeid, 0.0) + float(case.get("time") or 0.0)
    return times


DURATION = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")
SUMMARY = re.compile(r"in ([\d.]+)s(?: \(|\s*=|$)")


def read_log(path: Path) -> Tuple[Dict[str, float], Optional[float]]:
    """nodeid -> seconds from pytest's ``--durations`` lines (setup, call and teardown summed), and
    the session's wall time from its last line."""
    times: Dict[str, float] = {}
    wall = None
    for line in path.read_text(errors="replace").splitlines():
        m = DURATION.match(line)
        if m:
            times[m.group(3)] = times.get(m.group(3), 0.0) + float(m.group(1))
        s = SUMMARY.search(line)
        if s and ("passed" in line or "failed" in line):
            wall = float(s.group(1))
    return times, wall


# -- what a test spends its time on ------------------------------------------------------------------
_sources: Dict[Path, Tuple[str, Dict[str, ast.AST]]] = {}


def _module(path: Path) -> Tuple[str, Dict[str, ast.AST]]:
    if path not in _sources:
        text = path.read_text()
        defs: Dict[str, ast.AST] = {}
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(node.name, node)
        _sources[path] = (text, defs)
    return _sources[path]


def test_source(nodeid: str) -> List[Tuple[str, int]]:
    """The test function's source, the module's fixtures it asks for, each module helper these call
    with the number of calls, and the module-level strings the test names (pytester templates: the
    inner session's code), once each."""
    file, *rest = nodeid.split("::")
    path = ROOT / file
    if not path.is_file() or not rest:
        return []
    text, defs = _module(path)
    fn = defs.get(rest[-1].split("[", 1)[0])
    if fn is None:
        return []
    body = ast.get_source_segment(text, fn) or ""
    parts = [(body, 1)]
    # the fixtures the test asks for, the module's and its folder's conftest.py's, and those they ask for
    # (a module- or session-scoped pytester session is paid in the setup of the first test that asks)
    assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
    conftest = path.parent / "conftest.py"
    shared = _module(conftest) if conftest.is_file() else ("", {})
    wanted, seen = [a.arg for a in fn.args.args], set()
    while wanted:
        name = wanted.pop()
        src, fixture = (text, defs.get(name)) if name in defs else (shared[0], shared[1].get(name))
        if name in seen or fixture is None or fixture is fn or not isinstance(fixture, ast.FunctionDef):
            continue
        seen.add(name)
        parts.append((ast.get_source_segment(src, fixture) or "", 1))
        wanted += [a.arg for a in fixture.args.args]
    for src, _ in list(parts):
        for name in sorted(set(re.findall(r"\b(\w+)\(", src))):
            helper = defs.get(name)
            if helper is not None and helper is not fn:
                parts.append((ast.get_source_segment(text, helper) or "", len(re.findall(rf"\b{name}\(", src))))
    for name in sorted(set(re.findall(r"\b([A-Z][A-Z0-9_]+)\b", body))):
        m = re.search(rf"^{name}\s*=\s*(?:f|r)?(\"\"\"|''')(.*?)\1", text, re.S | re.M)
        if m:
            parts.append((m.group(2), 1))
    return parts


def spends_on(nodeid: str) -> str:
    """The categories a test's source matches, most matches first, e.g. ``pytester sessions x4, rank calls``."""
    parts = test_source(nodeid)
    if not parts:
        return "?"
    found = []
    for cat, patterns in CATEGORIES.items():
        n = 0
        for p in patterns:
            if p in ONCE:
                n += int(any(re.search(p, src) for src, _ in parts))
            else:
                n += sum(len(re.findall(p, src, re.I)) * times for src, times in parts)
        if n:
            found.append((n, cat))
    found.sort(key=lambda t: -t[0])
    return ", ".join(f"{cat} x{n}" if n > 1 else cat for n, cat in found) or "plain"


# -- the tables --------------------------------------------------------------------------------------
def table(rows: List[List[str]], head: List[str], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*r) for r in rows])


def report(steps: List[Step], top: int, markdown: bool) -> str:
    rows = []
    for s in steps:
        load = "-" if s.source != "run" else f"{s.load[1]:.1f} (max {s.load[2]:.1f})"
        rows.append([s.name, f"{s.wall_s:.0f}" if s.wall_s is not None else "-", str(len(s.tests) or "-"),
                     f"{sum(s.tests.values()):.0f}" if s.tests else "-", load,
                     s.source if s.source != "run" else f"rc {s.rc}"])
    out = [table(rows, ["step", "wall s", "tests", "tests' s", "load (median)", "from"], markdown)]
    total = sum(s.wall_s or 0.0 for s in steps)
    out.append(f"\nall steps: {total:.0f} s; machine: {cpu_model()}, {os.cpu_count()} cores\n")
    for s in steps:
        if not s.tests:
            continue
        whole = s.wall_s or sum(s.tests.values())
        slow = sorted(s.tests.items(), key=lambda kv: -kv[1])[:top]
        share = sum(t for _, t in slow) / whole * 100 if whole else 0.0
        out.append(f"{s.name}: the {len(slow)} slowest of {len(s.tests)} tests take {share:.0f}% of its "
                   f"{whole:.0f} s")
        rows = [[f"{t:.1f}", f"{t / whole * 100:.1f}%" if whole else "-", nodeid, spends_on(nodeid)]
                for nodeid, t in slow]
        out.append(table(rows, ["s", "share", "test", "spends its time on (from its source)"], markdown))
        out.append("")
    return "\n".join(out)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [s.name for s in ci_steps()]
    parser.add_argument("--steps", default=",".join(names), help=f"comma-separated, of: {', '.join(names)}")
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest tests to list per step")
    parser.add_argument("--from", dest="sources", action="append", default=[], metavar="STEP=FILE",
                        help="read STEP from FILE (pytest output with --durations, or junit XML) instead of running it")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = parser.parse_args()
    given = dict(s.split("=", 1) for s in args.sources)
    wanted = [n for n in args.steps.split(",") if n] + [n for n in given if n not in args.steps.split(",")]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        parser.error(f"unknown step(s) {', '.join(unknown)}: choose from {', '.join(names)}")
    steps = []
    for step in ci_steps():
        if step.name not in wanted:
            continue
        if step.name in given:
            path = Path(given[step.name])
            step.source = path.name
            if path.suffix == ".xml":
                step.tests = read_junit(path)
            else:
                step.tests, step.wall_s = read_log(path)
        else:
            print(f"+ {' '.join(step.command)}  (load {os.getloadavg()[0]:.1f})", flush=True)
            run_step(step)
        steps.append(step)
    print(report(steps, args.top, args.markdown))


if __name__ == "__main__":
    sys.exit(main())
