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


def test_compare_calls_a_change_its_history_cannot_see_noisy_and_passes(tmp_path):
    old = _history(tmp_path / "old", [0.0, 0.3, -0.3, 0.2, -0.2, 0.1, -0.1, 0.0])  # sees only +150% and more
    r = _compare(old, _history(tmp_path / "new", [math.log(1.5)]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "+50.0% (n=8)" in r.stdout and "SLOWER" not in r.stdout
    assert (f"{KEY}: noisy: history spread 22%: only slowdowns above +" in r.stdout
            and "can be seen here (threshold +10%, 8 launches); for a gate on this runner use --mgpu-against"
            in r.stdout), r.stdout
    assert "cannot fail" not in r.stdout  # a history of 8: it can


def _report(path, median, x=None, unstable=""):
    d = {"key": KEY, "median_s": median, "iqr_s": 0.001, "x": x, "reference_hash": "h1", "unstable": unstable,
         "samples_s": [median * (1 + 0.01 * i) for i in range(10)],
         "rank_samples_s": [[median] * 10], "slowest_rank": 0, "skew": 0.0,
         "task": {"name": "ddp", "strategy": "ddp", "group": "step", "params": {}, "world_size": 2,
                  "device_type": "cpu", "emulated": True, "batch_size": None}}
    path.write_text(json.dumps({"format": "pytest-mgpu timing report 2", "rows": [], "measurements": [d]}))
    return path


def test_compare_reports_judges_as_pytest_does_and_names_a_damaged_file(tmp_path):
    """Two reports: OLD is one launch, so NEW is "learning 1/5" with its reference-normalized change,
    as the in-pytest row says, not a verdict of another rule (issue 18: "+9.1% same" vs "+15.9%
    learning 1/5")."""
    old = _report(tmp_path / "a.json", 0.1, x=math.log(10))
    slow = _report(tmp_path / "c.json", 0.2, x=math.log(10 * 1.159))
    r = _compare(old, slow)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "+15.9% (n=1)" in r.stdout and "learning 1/5" in r.stdout and "SLOWER" not in r.stdout
    assert "OLD holds fewer than 5 launches per measurement (a report holds one): its rows are learning and cannot " \
           "fail; a single launch has no spread between launches, so it can see no slowdown at all (2 launches of 1% " \
           "spread see only +376%). To gate, compare against a baseline file with a history" in r.stdout, r.stdout
    assert "or measure against a revision with --mgpu-against" in r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    r = _compare(old, bad)
    assert r.returncode == 2 and "bad.json" in r.stdout


def test_compare_never_calls_an_unstable_measurement_faster_or_slower(tmp_path):
    xs = [0.0, 0.02, -0.01, 0.015, -0.02, 0.01, 0.0, -0.005]
    old = _history(tmp_path / "old", xs)
    for factor in (0.5, 2.0):
        new = _report(tmp_path / f"n{factor}.json", 0.01 * factor, x=math.log(factor),
                      unstable="IQR 80% of the median (limit 60%)")
        r = _compare(old, new)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "unstable" in r.stdout and "faster" not in r.stdout and "SLOWER" not in r.stdout


def test_report_without_suffix_appends_markdown(tmp_path):
    summary = tmp_path / "step_summary"
    summary.write_text("earlier step\n")
    write(summary, [], [], ["note one"])
    write(summary, [], [], ["note two"])
    text = summary.read_text()
    assert text.startswith("earlier step\n") and text.count("## pytest-mgpu timing") == 2 and "note two" in text
