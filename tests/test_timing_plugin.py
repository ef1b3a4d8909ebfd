"""The timing report, its exports, junit properties, and the options around it, in real pytest
sessions (the gate's sessions are in test_timing_gate_sessions.py). Wall times are never asserted."""
import csv
import io
import json
import math
import xml.etree.ElementTree as ET

import pytest

import pytest_mgpu
from pytest_mgpu.timing.baselines import STRUCTURE_FILE
from tests import xdist_together as together

pytestmark = pytest.mark.usefixtures("no_gpus")  # timing sessions of CPU ranks, also on a GPU machine

BODY = """
import pytest, torch, pytest_mgpu

def matmul(n):
    x = torch.randn(n, n)
    def step():
        x @ x
    return step

@pytest_mgpu.world_sizes(1, 2)
def test_scaling(dist):
    dist.benchmark(matmul, 48, warmup=1, repeat=8, batch_size=32, strategy="ddp" if dist.world_size > 1 else "single",
                   group="mm")

@pytest.mark.gpu2
@pytest.mark.parametrize("split", [1, 2, 4])
def test_curve(dist, split):
    dist.benchmark(matmul, 16 * split, warmup=1, repeat=8, single_process=True, strategy="pipeline",
                   group="mm", params={"split_size": split})
"""
TIMED = 5


def _baseline_files(pytester):
    d = pytester.path / "baselines"
    return sorted(p for p in d.glob("*.json") if p.name != STRUCTURE_FILE) if d.exists() else []


def test_report_table_exports_junit_and_plots(pytester):
    """One session (each costs a rank pool's start): terminal table, the three report formats,
    junit properties and the charts."""
    pytester.makepyfile(BODY)
    result = pytester.runpytest("--mgpu-fallback=cpu", "--mgpu-report=out/report.md", "--mgpu-report=report.json",
                                "--mgpu-report=report.csv", "--junitxml=junit.xml", "--mgpu-plot=charts")
    result.assert_outcomes(passed=TIMED)
    lines = result.stdout.str().split("pytest-mgpu timing", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("group"))
    table = lines[start:start + 2 + TIMED]
    assert max(len(line) for line in table) <= 120  # the table; details are in the reports
    result.stdout.fnmatch_lines([
        "*pytest-mgpu timing*",
        "*no baseline for this fingerprint*5 measurement(s) recorded, none judged*",
        "batch_size=32 at every world size of group mm (1, 2): it is the GLOBAL batch*",
        "group*strategy*W*median*IQR*speed-up*eff.*raw change*normalised*verdict",
        "*mm*single*1*1.00x*100%*",
        "*mm*ddp*2*",
        "*mm*pipeline split_size=4*2*",
        "*report written to*report.md*",
        "*3 chart(s) drawn in*charts*",
    ])
    # Markdown for a CI job summary
    md = (pytester.path / "out" / "report.md").read_text()
    assert md.startswith("## pytest-mgpu timing") and md.count("\n| mm") == TIMED
    # JSON: rows and raw measurements
    doc = json.loads((pytester.path / "report.json").read_text())
    assert doc["format"] == "pytest-mgpu timing report 2" and doc["plugin_version"] == pytest_mgpu.__version__
    assert "commit" in doc and doc["fingerprint"]["emulated"] is True and doc["fingerprints"][0].startswith("cpu-")
    assert len(doc["rows"]) == len(doc["measurements"]) == TIMED
    ddp = next(r for r in doc["rows"] if r["strategy"] == "ddp")
    assert ddp["world_size"] == 2 and ddp["ranks"] == 2 and ddp["speedup"] > 0
    assert ddp["efficiency"] == pytest.approx(ddp["speedup"] / 2) and ddp["reference"] == "single (1 dev)"
    m = next(d for d in doc["measurements"] if d["task"]["strategy"] == "ddp")
    assert len(m["samples_s"]) == 8 and len(m["rank_samples_s"]) == 2 and m["verdict"]["status"] in ("new", "unstable")
    assert m["reference_median_s"] > 0 and m["x"] == pytest.approx(math.log(m["median_s"] / m["reference_median_s"]))
    # CSV
    rows = list(csv.DictReader(io.StringIO((pytester.path / "report.csv").read_text())))
    assert sorted(r["strategy"] for r in rows) == ["ddp", "pipeline", "pipeline", "pipeline", "single"]
    assert all(float(r["median_s"]) > 0 for r in rows)
    # junit XML: the measurements as properties of their test case
    cases = ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    props = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")} for c in cases}
    assert len(props) == TIMED
    for name, p in props.items():
        (data,) = json.loads(p["mgpu_timing"])
        assert data["task"]["label"].endswith(name)
        assert float(p[f"mgpu_median_s[{data['task']['name']}]"]) == pytest.approx(data["median_s"], rel=1e-5)
    # charts: bars per group, the split-size curve, scaling efficiency
    charts = sorted(p.name for p in (pytester.path / "charts").iterdir())
    assert charts == ["bars-mm-emulated.png", "curve-mm-emulated-split_size.png", "scaling-efficiency.png"]
    for name in charts:
        assert (pytester.path / "charts" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_options_are_usage_errors(pytester):
    pytester.makepyfile("def test_x(): pass")
    pytester.path.joinpath("afile").write_text("not a folder")
    cases = (
        (["--mgpu-regression=fast"], "percentage"),
        (["--mgpu-report=out.txt"], ".md, .json or .csv"),
        (["--mgpu-save-baselines", "--mgpu-baselines=afile"], "cannot write baselines: *afile is a file, not a directory"),
        (["--mgpu-save-baselines", "--mgpu-baselines=afile/below"], "*afile is a file*"),
        (["--mgpu-save-timing", "-n", "2"], "--mgpu-save-timing cannot be used with -n*share the cores*"),
    )
    for opts, words in cases:
        result = pytester.runpytest(*opts)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, opts
        result.stderr.fnmatch_lines([f"*{words}*"])


XDIST = together.register("test_timing_xdist.py", BODY)  # run in the session shared with the other xdist tests


def test_xdist_warns_shared_cores_and_records_every_test_once(xdist_together):
    run = xdist_together
    names = ["test_scaling[gpu1]", "test_scaling[gpu2]", *(f"test_curve[{s}]" for s in (1, 2, 4))]
    assert run.outcomes(XDIST) == dict.fromkeys(names, "passed"), run.out
    warned = run.warned(XDIST)  # one warning per timed test, and none else
    assert list(warned.values()) == [TIMED] and "TimingNoiseWarning" in next(iter(warned)), run.out
    assert "share the cores" in next(iter(warned)), run.out
    report = run.out.split("pytest-mgpu timing", 1)[1]
    assert "measured under pytest-xdist" in report, run.out
    keys = [d["key"] for d in run.report["measurements"]]
    assert len(keys) == len(set(keys))  # every test of the session once
    assert {d["gate_mode"] for d in run.report["measurements"]} == {"warn"}
    mine = [d for d in run.report["measurements"] if d["test"].startswith(f"{XDIST}::")]
    assert len(mine) == TIMED and {d["test"] for d in mine} == {f"{XDIST}::{name}" for name in names}


SELECTION = """
import pytest, pytest_mgpu

def work():
    pass

def helper(dist):
    return dist.benchmark(work)

@pytest.mark.gpu1
def test_times(dist):
    dist.benchmark(work, repeat=2)

@pytest.mark.gpu1
@pytest.mark.mgpu_benchmark
def test_times_in_a_helper(dist):
    helper(dist)

@pytest.mark.gpu1
def test_runs(dist):
    dist.run(work)

def test_plain():
    pass
"""


def test_timing_tests_are_selected_or_left_out_as_with_pytest_benchmark(pytester):
    pytester.makepyfile(test_sel=SELECTION)
    timing, other = ["test_times", "test_times_in_a_helper"], ["test_runs", "test_plain"]
    for args, kept in ((["--mgpu-benchmarks=only"], timing), (["-m", "mgpu_benchmark"], timing),
                       (["--mgpu-benchmarks=skip"], other), (["-m", "not mgpu_benchmark"], other),
                       ([], timing + other)):
        result = pytester.runpytest("--collect-only", "-q", "--strict-markers", *args)
        ids = sorted(line.split("::")[-1] for line in result.stdout.lines if line.startswith("test_sel.py::"))
        assert ids == sorted(kept), (args, result.stdout.str())
    assert pytester.runpytest("--mgpu-benchmarks=some").ret == pytest.ExitCode.USAGE_ERROR
