"""``python -m pytest_mgpu compare OLD NEW``: the table, and the exit status CI steps rely on."""
import json
import math
import subprocess
import sys

from pytest_mgpu.timing.baselines import BaselineStore, Launch, NewLaunch
from pytest_mgpu.timing.fingerprint import Fingerprint
from pytest_mgpu.timing.report import write

FP = Fingerprint("Test CPU", 2, "gloo", "2.14.1", None, True, "GenuineIntel 6/1/1", "AVX2")
KEY = "t.py::test_step[gpu2]::ddp"


def _history(directory, xs, ref=0.01):
    store = BaselineStore(directory)
    for x in xs:
        med = ref * math.exp(x)
        store.save(FP, {KEY: NewLaunch(Launch("t", med, med / 20, 10, None, "0.1.0", ref, "h1", x), [med] * 10,
                                       {"strategy": "ddp", "group": "step", "world_size": 2})})
    return store.path_for(FP)


def _compare(old, new):
    return subprocess.run([sys.executable, "-m", "pytest_mgpu", "compare", str(old), str(new)],
                          capture_output=True, text=True, timeout=120)


def test_compare_baseline_histories_exit_status(tmp_path):
    xs = [0.0, 0.02, -0.01, 0.015, -0.02, 0.01, 0.0, -0.005]
    old = _history(tmp_path / "old", xs)
    same = _history(tmp_path / "same", [0.01])
    slower = _history(tmp_path / "slower", [math.log(1.4)])
    r = _compare(old, same)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ddp" in r.stdout and "same" in r.stdout and "(n=8)" in r.stdout
    r = _compare(old, slower)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"SLOWER: {KEY}" in r.stdout and "+39.8% (n=8)" in r.stdout
    assert all(len(line) <= 120 for line in r.stdout.splitlines())


def test_compare_reports_with_samples_and_a_damaged_file(tmp_path):
    def report(path, median):
        d = {"key": KEY, "median_s": median, "iqr_s": 0.001, "x": None, "samples_s": [median * (1 + 0.01 * i) for i in range(10)],
             "rank_samples_s": [[median] * 10], "slowest_rank": 0, "skew": 0.0,
             "task": {"name": "ddp", "strategy": "ddp", "group": "step", "params": {}, "world_size": 2,
                      "device_type": "cpu", "emulated": True, "batch_size": None}}
        path.write_text(json.dumps({"format": "pytest-mgpu timing report 2", "rows": [], "measurements": [d]}))
        return path

    old, new, slow = report(tmp_path / "a.json", 0.1), report(tmp_path / "b.json", 0.1), report(tmp_path / "c.json", 0.2)
    assert _compare(old, new).returncode == 0
    r = _compare(old, slow)
    assert r.returncode == 1 and "SLOWER" in r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    r = _compare(old, bad)
    assert r.returncode == 2 and "bad.json" in r.stdout


def test_report_without_suffix_appends_markdown(tmp_path):
    summary = tmp_path / "step_summary"
    summary.write_text("earlier step\n")
    write(summary, [], [], ["note one"])
    write(summary, [], [], ["note two"])
    text = summary.read_text()
    assert text.startswith("earlier step\n") and text.count("## pytest-mgpu timing") == 2 and "note two" in text
