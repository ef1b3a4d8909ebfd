"""The timing report, its exports, junit properties, baselines and the regression gate, in real
pytest sessions. Wall times are never asserted: a regression is injected by editing a baseline
file so that it claims a step several times faster than this machine can run it."""
import csv
import io
import json
import xml.etree.ElementTree as ET

import pytest

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
    return sorted(d.glob("*.json")) if d.exists() else []


def test_report_table_exports_junit_and_plots(pytester):
    """One session (each costs a rank pool's start): terminal table, the three report formats,
    junit properties and the charts."""
    pytester.makepyfile(BODY)
    result = pytester.runpytest("--mgpu-fallback=cpu", "--mgpu-report=out/report.md", "--mgpu-report=report.json",
                                "--mgpu-report=report.csv", "--junitxml=junit.xml", "--mgpu-plot=charts")
    result.assert_outcomes(passed=TIMED)
    result.stdout.fnmatch_lines([
        "*pytest-mgpu timing*",
        "*no baseline for this fingerprint*5 measurement(s) recorded, none judged*",
        "*group*strategy*W*emulated*median*IQR*samples/s*speed-up*efficiency*slowest rank*vs baseline*verdict*",
        "*mm*single*1*yes*1.00x*100%*no baseline*new*",
        "*mm*ddp*2*yes*",
        "*mm*pipeline split_size=4*2*yes*",
        "*report written to*report.md*",
        "*3 chart(s) drawn in*charts*",
    ])
    # Markdown for a CI job summary
    md = (pytester.path / "out" / "report.md").read_text()
    assert md.startswith("## pytest-mgpu timing") and md.count("\n| mm") == TIMED
    # JSON: rows and raw measurements
    doc = json.loads((pytester.path / "report.json").read_text())
    assert len(doc["rows"]) == len(doc["measurements"]) == TIMED
    ddp = next(r for r in doc["rows"] if r["strategy"] == "ddp")
    assert ddp["world_size"] == 2 and ddp["ranks"] == 2 and ddp["speedup"] > 0
    assert ddp["efficiency"] == pytest.approx(ddp["speedup"] / 2) and ddp["reference"] == "single (1 dev)"
    m = next(d for d in doc["measurements"] if d["task"]["strategy"] == "ddp")
    assert len(m["samples_s"]) == 8 and len(m["rank_samples_s"]) == 2 and m["verdict"]["status"] == "new"
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


def _claim_impossible_speed(path):
    """Rewrite a baseline as if every step had taken a few nanoseconds: any real run is slower."""
    doc = json.loads(path.read_text())
    for e in doc["entries"].values():
        e["samples_s"] = [1e-9 * (1 + 0.01 * i) for i in range(len(e["samples_s"]))]
        e["median_s"] = 1e-9
    path.write_text(json.dumps(doc))


def test_save_compare_and_regression(pytester):
    pytester.makepyfile(BODY + """
@pytest.mark.gpu1
def test_broken(dist):
    dist.benchmark(matmul, 8, warmup=0, repeat=5)
    assert False, "fails after timing"
""")
    args = ["--mgpu-fallback=cpu", "-k", "scaling or broken"]
    # no baseline: records, says so, never fails on timing (even in fail mode)
    result = pytester.runpytest(*args, "--mgpu-gate=fail", "--mgpu-save-baselines")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*no baseline for this fingerprint*",
                                 "*baselines: 2 measurement(s) saved to baselines*.json*",
                                 "*baselines: 1 measurement(s) of failed tests not saved*"])
    (path,) = _baseline_files(pytester)
    doc = json.loads(path.read_text())
    assert sorted(doc["entries"]) == ["test_save_compare_and_regression.py::test_scaling[gpu1]::single",
                                      "test_save_compare_and_regression.py::test_scaling[gpu2]::ddp"]
    assert doc["fingerprint"]["emulated"] is True and path.name.startswith("cpu-")
    assert all(len(e["samples_s"]) == e["n"] == 8 for e in doc["entries"].values())

    # judged against a baseline far faster than this machine can run: the gate must fire
    _claim_impossible_speed(path)
    result = pytester.runpytest(*args, "--mgpu-gate=fail", "--mgpu-regression=25", "--mgpu-report=judged.json")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines([
        "*timing regression:*",
        "*test_scaling[[]gpu2[]]::ddp is slower than its baseline: median * vs baseline 1.0* ns (x*, +*%; "
        "threshold +25%), Mann-Whitney p=* (confidence *%*), n=8 vs 8; baseline: cpu-*.json*",
        "*pytest-mgpu timing*",
        "*gate: fail, threshold +25%*", f"*baseline {path.name}: 1 of 3*new*",
        "*SLOWER (failed)*",
    ])
    judged = json.loads((pytester.path / "judged.json").read_text())["measurements"]
    status = {d["task"]["name"]: (d["verdict"]["status"], d["outcome"]) for d in judged}
    assert status == {"single": ("slower", "failed"), "ddp": ("slower", "failed"), "matmul": ("new", "failed")}
    # by default emulated CPU runs only warn
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=2, failed=1, warnings=2)
    result.stdout.fnmatch_lines(["*TimingRegressionWarning*slower than its baseline*", "*slower (warned)*"])


def test_bad_options_are_usage_errors(pytester):
    pytester.makepyfile("def test_x(): pass")
    for opt, words in (("--mgpu-regression=fast", "percentage"), ("--mgpu-report=out.txt", ".md, .json or .csv")):
        result = pytester.runpytest(opt)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*{words}*"])


def test_xdist_workers_record_every_test_once(pytester):
    pytester.makepyfile(BODY)
    result = pytester.runpytest_subprocess("--mgpu-fallback=cpu", "-n", "2", "--mgpu-report=r.json",
                                           "--mgpu-save-baselines", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=TIMED)
    (path,) = _baseline_files(pytester)  # written once, by the controller
    assert len(json.loads(path.read_text())["entries"]) == TIMED
    doc = json.loads((pytester.path / "r.json").read_text())
    keys = [d["key"] for d in doc["measurements"]]
    assert len(keys) == len(set(keys)) == TIMED
    assert {d["test"] for d in doc["measurements"]} == {
        "test_xdist_workers_record_every_test_once.py::test_scaling[gpu1]",
        "test_xdist_workers_record_every_test_once.py::test_scaling[gpu2]",
        *(f"test_xdist_workers_record_every_test_once.py::test_curve[{s}]" for s in (1, 2, 4)),
    }
    result.stdout.fnmatch_lines(["*pytest-mgpu timing*"])
