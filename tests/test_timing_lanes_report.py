"""Both lanes rendered from one row type: the terminal table, Markdown, CSV, JSON, charts, and compare
judging a revision row again from its pairs (synthetic measurements; no ranks)."""
import csv
import io
import json
import math
import random
import re
import subprocess
import sys

import pytest

from pytest_mgpu.timing import messages, report
from pytest_mgpu.timing.pairing import judge_pairs


def _pairs(n, ratio, seed=0):
    rng = random.Random(seed)
    base = [0.010 * (1 + rng.uniform(-0.3, 0.3)) for _ in range(n)]
    return [b * ratio * math.exp(rng.gauss(0, 0.02)) for b in base], base


def _measurement(name, ratio, history_status="new", dirty="", rev="origin/main", world_size=2):
    head, base = _pairs(30, ratio, seed=len(name))
    v = judge_pairs(head, base, 0.10)
    return {
        "key": f"t.py::test_{name}::{name}", "median_s": 0.011, "iqr_s": 0.001, "samples_s": [0.011] * 9,
        "rank_samples_s": [[0.011] * 9] * world_size, "slowest_rank": 0, "skew": 0.0, "x": 0.1,
        "reference_hash": "h", "gate_mode": "fail", "fingerprint_key": "fp", "history_median_s": None,
        "verdict": {"status": history_status, "x": 0.1, "n_history": 0},
        "task": {"name": name, "strategy": "ddp", "group": f"{name}-group-with-a-long-name", "params": {},
                 "world_size": world_size, "device_type": "cpu", "emulated": True, "batch_size": 32},
        "revision": {"rev": rev, "commit": "1a2b3c4d" * 5, "short": "1a2b3c4", "dirty": dirty,
                     "verdict": v.to_dict(), "head_median_s": sorted(head)[15], "base_median_s": sorted(base)[15],
                     "pairs_head": head, "pairs_base": base, "head_first": [True] * 30, "iterations": 3,
                     "budget_s": 4.0, "wall_s": 4.2},
    }


MEASURED = [("t.py::test_a", "passed", _measurement("a", 1.3, dirty="2 uncommitted change(s)")),
            ("t.py::test_b", "passed", _measurement("b", 1.0, history_status="same")),
            ("t.py::test_c", "passed", _measurement("c", 0.7, rev="a-very-long-branch-name/with/parts"))]


def test_one_row_type_both_lanes():
    rows = report.build_rows(MEASURED)
    lanes = [(r.name, r.lane) for r in rows]
    # a history verdict of "new" has nothing to say beside the revision lane; "same" does
    assert lanes == [("a", "revision"), ("b", "history"), ("b", "revision"), ("c", "revision")]
    a = rows[0]
    assert a.against == "origin/main@1a2b3c4" and "2 uncommitted change(s)" in a.head
    assert a.base_s < a.median_s and report.change_cell(a).startswith("+") and "[" in report.change_cell(a)
    assert report.verdict_cell(a) == "SLOWER (failed)" and report.verdict_cell(rows[3]) == "faster"
    table = report.terminal_table(rows)
    assert max(len(line) for line in table.splitlines()) <= report.TERMINAL_WIDTH
    assert "vs origin/main@1a2b3c4 +dirty" in table and "history" in table
    assert "@1a2b3c4" in table.splitlines()[-1]  # a long REV is clipped, its commit kept


def test_a_failed_test_s_verdict_is_not_cut_in_the_terminal():
    rows = report.build_rows([("t.py::test_d", "failed", _measurement("d", 0.7, history_status="learning"))])
    table = report.terminal_table(rows)
    assert not any(line.endswith("~") for line in table.splitlines()), table
    assert [line.split()[-1] for line in table.splitlines()[2:]] == ["0/5", "faster"]  # the outcome left out
    assert max(len(line) for line in table.splitlines()) <= report.TERMINAL_WIDTH
    history = report.terminal_table([r for r in rows if r.lane == "history"])
    assert history.splitlines()[2].endswith("learning 0/5"), history
    assert report.verdict_cell(rows[1], 24) == "faster (test failed)"  # where the column holds both


def test_a_row_alone_in_its_group_claims_no_speed_up():
    alone = dict(_measurement("e", 1.0), revision=None)
    [row] = report.build_rows([("t.py::test_e", "passed", alone)])
    assert row.speedup is None and row.efficiency is None
    assert re.split(r"\s{2,}", report.terminal_table([row]).splitlines()[2])[5:7] == ["-", "-"]
    two = report.build_rows([("t.py::test_e", "passed", alone),
                             ("t.py::test_f", "passed", dict(alone, task=dict(alone["task"], world_size=4)))])
    assert [r.speedup for r in two] == [pytest.approx(1.0), pytest.approx(1.0)] and two[1].efficiency == 0.5


def test_a_benchmark_new_at_rev_shows_its_measurement_and_the_json_stays_strict():
    new = _measurement("g", 1.0)
    new["revision"] = dict(new["revision"], pairs_head=[], pairs_base=[], head_first=[], head_median_s=None,
                           base_median_s=None, verdict={"status": "new", "threshold": 0.1,
                                                        "note": "new in this change: ..."})
    rows = report.build_rows([("t.py::test_g", "passed", new)])
    assert [(r.lane, report.verdict_cell(r)) for r in rows] == [("history", "new 0/5"), ("revision", "new")]
    assert rows[0].median_s == pytest.approx(0.011)  # what dist.benchmark measured, shown
    text = report.to_json(rows, [("t.py::test_g", "passed", new)], [])

    def refuse(constant):
        raise AssertionError(f"{constant} in the JSON report")

    doc = json.loads(text, parse_constant=refuse)
    assert doc["rows"][1]["median_s"] is None


def test_a_change_over_100_percent_fits_its_cell():
    cell = messages.revision_change_cell({"verdict": {"status": "slower", "ratio": 2.125, "low": 2.109, "high": 2.145,
                                                      "pairs": 20, "threshold": 0.1}})
    assert cell == "+112% [+111,+114]" and len(cell) <= 21


def test_markdown_csv_and_json_carry_the_lane(tmp_path):
    rows = report.build_rows(MEASURED)
    md = report.markdown(rows)
    assert "| lane" in md and "vs origin/main@1a2b3c4 +dirty" in md
    assert "against origin/main (1a2b3c4): base" in md and "99% bootstrap interval" in md
    got = list(csv.DictReader(io.StringIO(report.to_csv(rows))))
    a = got[0]
    assert a["lane"] == "revision" and a["against"] == "origin/main@1a2b3c4" and a["verdict"] == "slower"
    assert float(a["ci_low"]) > 1.1 and float(a["ratio"]) == pytest.approx(1.3, rel=0.05)
    assert got[1]["lane"] == "history" and got[1]["verdict"] == "same"
    doc = json.loads(report.to_json(rows, MEASURED, []))
    assert doc["rows"][0]["lane"] == "revision" and doc["rows"][0]["change"].startswith("+")
    assert doc["measurements"][0]["revision"]["pairs_head"]


def test_charts_of_a_revision_lane(tmp_path):
    pytest.importorskip("matplotlib")
    from pytest_mgpu.timing import plots

    files = plots.draw(report.build_rows(MEASURED), tmp_path)
    names = sorted(p.name for p in files)
    assert any("vs-origin-main-1a2b3c4" in n for n in names), names
    assert all(p.stat().st_size > 0 for p in files)


def test_compare_judges_a_revision_row_again_from_its_pairs(tmp_path):
    """compare re-decides the lane from the stored pairs, with its own threshold, by the same function."""
    doc = {"format": report.REPORT_FORMAT, "rows": [], "measurements": [d for _, _, d in MEASURED]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    run = [sys.executable, "-m", "pytest_mgpu", "compare", str(path), str(path)]
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "SLOWER: t.py::test_a::a (against origin/main)" in r.stdout, r.stdout
    r = subprocess.run(run + ["--regression", "40"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "SLOWER" not in r.stdout, r.stdout
