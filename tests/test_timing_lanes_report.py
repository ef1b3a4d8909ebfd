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


def _history_row(name, median_s, history_median_s, ratio, world_size=2, batch=32, keyword="batch_size"):
    d = dict(_measurement(name, 1.0, world_size=world_size), revision=None, median_s=median_s,
             history_median_s=history_median_s)
    d["verdict"] = {"status": "same", "x": math.log(ratio) if ratio else None, "n_history": 5, "center": 0.0}
    d["task"] = dict(d["task"], group="mlp", batch_size=batch, batch_keyword=keyword)
    return d


def test_the_raw_change_of_medians_stands_beside_the_normalised_one():
    """The medians on screen differ by -12%; the gate's reference-normalised figure says -35%: both, labelled."""
    [row] = report.build_rows([("t.py::test_h", "passed", _history_row("h", 0.0088, 0.010, 0.65))])
    assert report.raw_change_cell(row) == "-12.0%" and messages.delta_cell(row.measurement) == "-35.0% (n=5)"
    table = report.terminal_table([row])
    header, _, line = table.splitlines()
    assert header.split()[-4:] == ["raw", "change", "normalised", "verdict"], header
    assert "-12.0%" in line and "-35.0% (n=5)" in line and max(map(len, table.splitlines())) <= report.TERMINAL_WIDTH
    [note] = report.column_notes([row])
    assert note.startswith("raw change: this median against the history's median of medians") and "normalised" in note
    assert report.column_notes(report.build_rows(MEASURED)) == []  # no history: nothing to explain
    md = report.markdown([row])
    assert re.search(r"\| median change +\| judged change +\|", md), md
    assert re.search(r"\| -12\.0% +\| -35\.0% \(n=5\) +\|", md), md


def test_the_same_batch_size_at_every_world_size_is_questioned_and_global_batch_is_not():
    from pytest_mgpu.timing.batches import per_rank_suspects

    def rows(keyword, batches=(64, 64, 64)):
        return report.build_rows([(f"t.py::test_s[gpu{w}]", "passed", _history_row(f"s{w}", 0.01, None, None, w, b, keyword))
                                  for w, b in zip((1, 2, 4), batches)])
    [line] = per_rank_suspects(rows("batch_size"))
    assert line.startswith("batch_size=64 at every world size of group mlp (1, 2, 4): it is the GLOBAL batch"), line
    assert "pass global_batch=64 * dist.world_size" in line and "pass global_batch=64 to say so" in line
    assert per_rank_suspects(rows("global_batch")) == []  # said: the same global batch split over more ranks
    assert per_rank_suspects(rows("batch_size", (64, 128, 256))) == []  # per-rank x ranks: what it asks for
    md = report.markdown(rows("global_batch"))
    assert re.search(r"\| global batch +\|", md) and re.search(r"\| mlp +\| ddp +\| 4 +\| yes +\| 64 +\|", md), md


def test_a_history_that_cannot_fill_here_says_so_and_names_the_revision_lane():
    d = dict(_measurement("u", 1.0), revision=None, unstable="IQR 110% of the median (limit 60%)")
    d["verdict"] = {"status": "unstable", "x": None, "n_history": 4}
    [line] = messages.noisy_lines([d])
    assert line == ("t.py::test_u::u: unstable (IQR 110% of the median (limit 60%)): not saved, so its history (4 of 5 "
                    "launches) does not grow on this runner while its launches come out so; for a gate on this runner "
                    "use --mgpu-against")
    d["verdict"]["n_history"] = 5  # a full history: the gate decides from it on stable launches
    assert messages.noisy_lines([d]) == []
    d["verdict"]["n_history"] = 0  # no history, none being recorded: nothing to say
    assert messages.noisy_lines([d]) == []
    assert len(messages.noisy_lines([dict(d, saving=True)])) == 1  # recording the first launch: said
    learning = dict(_measurement("l", 1.0), revision=None, history_median_s=0.01)
    learning["verdict"] = {"status": "learning", "x": 0.1, "n_history": 1, "center": 0.0, "spread": 0.01}
    assert "a single launch has no spread between launches, so it can see no slowdown at all" in messages.describe(learning)
