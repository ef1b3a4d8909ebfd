"""Timing truths: ``python -m pytest_mgpu compare`` and the in-pytest verdict are decided
by one function on the same data, an unstable measurement is never faster or slower, and a baseline
file of an older fingerprint is named as stale instead of ignored."""
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_mgpu.settings import TimingSettings
from pytest_mgpu.timing import compare, messages, rule
from pytest_mgpu.timing.load import Busy, RunnerLoad, busy_others
from pytest_mgpu.timing.load import probe as load_probe
from pytest_mgpu.timing.baselines import FORMAT, STRUCTURE_FILE, BaselineFile, BaselineStore, Launch, NewLaunch
from pytest_mgpu.timing.fingerprint import Fingerprint, fingerprint
from pytest_mgpu.timing.measure import Measurement, TaskSpec
from pytest_mgpu.timing.reference import REFERENCE_HASH
from pytest_mgpu.timing.state import TimingState

FP = Fingerprint("Test CPU", 2, "gloo", "2.14.1", None, True, "GenuineIntel 6/1/1", "AVX2")
REF = 0.01  # reference median of every synthetic launch


def _task(name):
    return TaskSpec(name=name, label=f"t.py::test_{name}[gpu2]", fn="t:step", strategy="ddp", group=name,
                    world_size=2, processes=2, backend="gloo", device_type="cpu", emulated=True)


def _measurement(name, x, unstable="", again_x=None, seed=0):
    rng = random.Random(seed)
    med = REF * math.exp(x)
    samples = sorted(med * (1 + rng.uniform(-0.02, 0.02)) for _ in range(9))
    samples[4] = med  # the median is exactly REF * e^x
    m = Measurement(_task(name), samples, [samples, samples], 2, reference_samples=[REF] * 9,
                    reference_hash=REFERENCE_HASH, unstable=unstable)
    if again_x is not None:
        m.remeasure = lambda: _measurement(name, again_x, seed=seed + 1)
    return m


def _store(tmp_path, histories):
    store = BaselineStore(tmp_path / "baselines")
    for name, xs in histories.items():
        key = _task(name).key
        for x in xs:
            med = REF * math.exp(x)
            store.save(FP, {key: NewLaunch(Launch("t", med, med / 50, 9, None, "0.1.0", REF, REFERENCE_HASH, x),
                                           [med] * 9, {"strategy": "ddp", "group": name, "world_size": 2})})
    return store


def _hist(n, seed, sd=0.02):
    rng = random.Random(seed)
    return [rng.gauss(0.0, sd) for _ in range(n)]


CASES = {  # name: (history, x, unstable, x of the re-measurement)
    "none": ([], 0.3, "", None),
    "learning": (_hist(1, 1), math.log(1.159), "", None),
    "learning4": (_hist(4, 2), math.log(0.7), "", None),
    "same": (_hist(8, 3, sd=0.005), 0.01, "", None),
    "noisy": (_hist(8, 10, sd=0.15), 0.05, "", None),
    "slower_confirmed": (_hist(8, 4), math.log(1.5), "", math.log(1.45)),
    "slower_unconfirmed": (_hist(8, 5, sd=0.005), math.log(1.5), "", 0.0),
    "faster": (_hist(8, 6), math.log(0.6), "", None),
    "unstable_slow": (_hist(8, 7), math.log(2.0), "IQR 80% of the median (limit 60%)", None),
    "unstable_fast": (_hist(8, 8), math.log(0.5), "samples drifted from 1 ms to 3 ms within the run", None),
}


def test_compare_and_pytest_give_the_same_verdict_on_the_same_data(tmp_path):
    """What pytest wrote in its JSON report, judged again by compare against the same baseline file,
    gives the same status, change, history size and re-measurement: one function decides both."""
    store = _store(tmp_path, {name: c[0] for name, c in CASES.items()})
    path = store.path_for(FP)
    state = TimingState(TimingSettings(baselines_dir=tmp_path / "baselines"), lambda device_type: FP)
    judged = state.judge([_measurement(name, x, u, again, seed=i)
                          for i, (name, (_, x, u, again)) in enumerate(CASES.items())])
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"format": "pytest-mgpu timing report 2", "rows": [], "measurements": judged}))
    old, new = compare.load(path), compare.load(report)
    seen = set()
    for d in judged:
        ours = rule.HistoryVerdict.from_dict(d["verdict"])
        theirs = rule.HistoryVerdict.from_dict(compare.judge_pair(old, new, d["key"], 0.10)["verdict"])
        assert theirs == ours, d["key"]
        seen.add(ours.status)
    assert seen == {rule.Status.NEW, rule.Status.LEARNING, rule.Status.SAME, rule.Status.SLOWER,
                    rule.Status.UNCONFIRMED, rule.Status.FASTER, rule.Status.UNSTABLE, rule.Status.NOISY}


def test_only_a_judged_slowdown_warns_and_the_report_says_what_the_others_are(tmp_path):
    """Under --mgpu-gate=warn only the confirmed slowdown of a history that could see it warns; a
    learning row (+16%, and +300% against one launch), a noisy and an unstable slow one do not, and
    the lines under the table say what each is."""
    cases = dict(CASES, learning_far=(_hist(2, 9), math.log(4.0), "", None))
    _store(tmp_path, {name: c[0] for name, c in cases.items()})
    state = TimingState(TimingSettings(baselines_dir=tmp_path / "baselines", gate="warn"), lambda device_type: FP)
    judged = state.judge([_measurement(name, x, u, again, seed=i)
                          for i, (name, (_, x, u, again)) in enumerate(cases.items())])
    fails, warns = state.problems(judged)
    assert fails == [] and [w.split(" ", 1)[0] for w in warns] == [_task("slower_confirmed").key], warns
    lines = messages.noisy_lines(judged)
    far = next(line for line in lines if line.startswith(_task("learning_far").key))
    assert "learning (2 of 5 launches): +" in far and "not judged and not warned" in far, far
    assert any(line.startswith(f"{_task('learning').key}: learning (1 of 5") for line in lines), lines
    assert any(line.startswith(f"{_task('noisy').key}: noisy:") for line in lines), lines


def test_a_noisy_launch_says_why_and_is_never_saved_to_its_history(tmp_path):
    """A wide history judges a launch noisy: the words name the spread, the smallest slowdown it can
    see, the runner's load (as the probe read it) and the revision lane; a save appends the tight
    measurement's launch and not the noisy one's, and compare reads no launch from it either."""
    store = _store(tmp_path, {"wide": _hist(8, 10, sd=0.15), "tight": _hist(8, 3, sd=0.005),
                              "wide2": _hist(8, 11, sd=0.2)})
    load = RunnerLoad(3.7, 2, (Busy(4242, "python", 0.98), Busy(4243, "python", 0.9)), others=1.9)
    reads = []
    state = TimingState(TimingSettings(baselines_dir=tmp_path / "baselines"), lambda device_type: FP,
                        load_probe=lambda: reads.append(1) or load)
    judged = state.judge([_measurement("wide", 0.05), _measurement("tight", 0.0, seed=1),
                          _measurement("wide2", 0.0, seed=2)])
    wide, tight, wide2 = judged
    assert len(reads) == 1 and wide2["runner_load"] == wide["runner_load"]  # read once per test
    assert wide["verdict"]["status"] == "noisy" and tight["verdict"]["status"] == "same"
    assert "runner_load" not in tight  # the load is read for a noisy verdict only
    text = messages.describe(wide)
    detectable = rule.HistoryVerdict.from_dict(wide["verdict"]).detectable
    assert text.startswith(f"history spread {math.expm1(wide['verdict']['spread']) * 100:.0f}%: only slowdowns "
                           f"above +{detectable * 100:.0f}% can be seen here"), text
    assert ("runner loaded: other processes used 1.9 of the ranks' 2 core(s) (pid 4242 python 98%, pid 4243 python "
            "90%); load average 3.7 on 2 core(s); for a gate on this runner use --mgpu-against") in text, text
    assert "not saved" in text
    assert messages.status_cell(wide) == "noisy" and state.problems(judged) == ([], [])
    for d in judged:
        state.collect(f"t.py::test_{d['task']['name']}", "passed", state.properties([d]))
    lines = state.save_baselines(None, "0.1.0")
    assert "baselines: 2 noisy measurement(s) not saved (their history could not judge them)" in lines, lines
    doc = json.loads(store.path_for(FP).read_text())["entries"]
    assert len(doc[_task("wide").key]["launches"]) == 8 and len(doc[_task("tight").key]["launches"]) == 9
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"format": "pytest-mgpu timing report 2", "rows": [], "measurements": judged}))
    assert set(compare.load(report).launches) == {_task("tight").key}


def test_a_short_quiet_history_grows_into_a_gate_a_loaded_runner_s_launch_does_not(tmp_path):
    """Five launches within 3% see only +20%: noisy. More launches at that spread would see +10%, so
    on a quiet runner the launch is saved (else such a history never grows); under load it is not."""
    tight = [0.0, 0.03, -0.03, 0.02, -0.02]
    for loaded in (False, True):
        folder = tmp_path / ("loaded" if loaded else "quiet")
        store = _store(folder, {"short": tight})
        load = RunnerLoad(6.0, 2) if loaded else RunnerLoad(0.5, 2)
        state = TimingState(TimingSettings(baselines_dir=folder / "baselines"), lambda device_type: FP,
                            load_probe=lambda: load)
        [d] = state.judge([_measurement("short", 0.01)])
        v = rule.HistoryVerdict.from_dict(d["verdict"])
        assert v.status == rule.Status.NOISY and v.needed is not None and 5 < v.needed <= rule.HISTORY
        line = messages.noisy_lines([d])[0]
        if loaded:
            assert "runner loaded: load average 6.0" in line and line.endswith("use --mgpu-against"), line
        else:
            assert f"at this spread {v.needed} launches see +10%: record more with --mgpu-save-timing" in line
        state.collect("t.py::test_short", "passed", state.properties([d]))
        lines = state.save_baselines(None, "0.1.0")
        launches = json.loads(store.path_for(FP).read_text())["entries"][_task("short").key]["launches"]
        assert len(launches) == (5 if loaded else 6), lines
        assert any("noisy measurement(s) not saved" in ln for ln in lines) == loaded, lines


@pytest.mark.parametrize("x, status", [(-0.4, "faster"), (0.4, "slower")])
def test_a_new_speed_recorded_on_purpose_restarts_its_history(tmp_path, x, status):
    """Appended to eight launches of the old speed, one launch of the new would only widen the history
    (the next run: noisy). Recorded, it starts the history again; a slowdown is recorded with the gate
    set to warn (failing, the test would not be saved), as its message says."""
    store = _store(tmp_path, {"shift": _hist(8, 3, sd=0.01), "steady": _hist(8, 4, sd=0.01)})
    state = TimingState(TimingSettings(baselines_dir=tmp_path / "baselines", gate="warn"), lambda device_type: FP)
    shift, steady = state.judge([_measurement("shift", x), _measurement("steady", 0.0, seed=1)])
    assert shift["verdict"]["status"] == status and steady["verdict"]["status"] == "same"
    advice = messages.describe(shift)
    assert "(its history starts again from this launch)" in advice, advice
    assert status == "faster" or "record it as the new speed: --mgpu-save-timing --mgpu-gate=warn" in advice
    state.collect("t.py::test_shift", "passed", state.properties([shift, steady]))
    lines = state.save_baselines(None, "0.1.0")
    doc = json.loads(store.path_for(FP).read_text())["entries"]
    assert len(doc[_task("shift").key]["launches"]) == 1 and len(doc[_task("steady").key]["launches"]) == 9
    assert any("1 of them at a new speed" in line and _task("shift").key in line for line in lines), lines
    assert "baselines: 2 measurement(s) recorded in" in lines[0], lines  # not "appended": one restarted
    assert shift["saving"] is False  # in a run that records it, its advice is not to record it again:
    assert messages.describe(dict(shift, saving=True)).endswith(
        "This run records it as the new speed (--mgpu-save-timing): its history starts again from it")


def test_a_wide_history_on_a_quiet_runner_may_mix_two_speeds_and_says_what_to_do(tmp_path):
    _store(tmp_path, {"mixed": [0.7, 0.0, 0.02, -0.01, 0.01]})  # one launch left of an old speed
    state = TimingState(TimingSettings(baselines_dir=tmp_path / "baselines"), lambda device_type: FP,
                        load_probe=lambda: RunnerLoad(0.4, 2))
    [d] = state.judge([_measurement("mixed", 0.0)])
    assert d["verdict"]["status"] == "noisy" and d["runner_load"] == ""
    line = messages.noisy_lines([d])[0]
    assert ("the runner was not loaded: if the step's speed changed on purpose, its history mixes the two speeds: "
            "delete its entry from the baseline file and record again") in line, line


def test_the_load_is_named_only_where_it_explains_noise():
    assert RunnerLoad(1.2, 2, (Busy(7, "sshd", 0.12),), others=0.3).describe() == ""
    assert RunnerLoad(4.4, 2).describe() == "runner loaded: load average 4.4 on 2 core(s)"
    assert RunnerLoad(1.0, 2, others=0.6).describe() == "runner loaded: other processes used 0.6 of the ranks' 2 core(s)"
    me, rank, burner, idle = 2**30, 2**30 + 1, 2**30 + 2, 2**30 + 3  # pids no process has
    before = {me: (1, "pytest", 0), rank: (me, "python", 0), burner: (1, "python", 0), idle: (1, "sshd", 0)}
    after = {me: (1, "pytest", 10), rank: (me, "python", 50), burner: (1, "python", 49), idle: (1, "sshd", 1)}
    got = busy_others(before, after, 0.5, 100, frozenset({0, 1}), me)
    assert got == [Busy(burner, "python", 0.98), Busy(idle, "sshd", 0.02)]  # never this process tree
    now = load_probe()
    assert now is None or (now.cores >= 1 and all(b.pid != os.getpid() for b in now.busy))


@pytest.mark.parametrize("x", [math.log(0.3), math.log(3.0)])
def test_an_unstable_measurement_is_never_faster_or_slower(x):
    v = rule.decide(x, _hist(20, 9), 0.10, unstable="IQR 90% of the median (limit 60%)", x_again=x)
    assert v.status == rule.Status.UNSTABLE and not v.flagged


def test_a_format_1_file_with_an_older_key_is_named_stale(tmp_path):
    """A committed file of format 1 (keyed "AMD EPYC" without the CPU's generation) was
    silently ignored: every run said "no baseline". Now the run and ``python -m pytest_mgpu`` name it."""
    old_fp = {"device": FP.device, "device_count": 2, "backend": "gloo", "torch": "2.14.1+cu130", "cuda": None,
              "emulated": True}
    d = tmp_path / "baselines"
    d.mkdir()
    stale = d / "cpu-test-cpu-2x-gloo-torch2.14.1-00000000.json"
    stale.write_text(json.dumps({"format": "pytest-mgpu baselines 1", "key": "x", "fingerprint": old_fp,
                                 "updated": "2026-11-22T12:13:21Z", "entries": {}}))
    other = dict(old_fp, device="Another CPU")
    (d / "cpu-another-2x.json").write_text(json.dumps({"format": "pytest-mgpu baselines 1", "key": "y",
                                                        "fingerprint": other, "updated": "", "entries": {}}))
    store = BaselineStore(d)
    assert [f.path for f in store.stale_for(FP)] == [stale]
    assert "is stale" in store.describe_match(FP) and stale.name in store.describe_match(FP)
    state = TimingState(TimingSettings(baselines_dir=d), lambda device_type: FP)
    state.collect("t.py::test_a", "passed", state.properties(state.judge([_measurement("a", 0.0)])))
    notes = "\n".join(state.fingerprint_notes())
    assert f"{stale.name} is stale" in notes, notes
    assert "cpu-another-2x.json is another machine's (2 x Another CPU" in notes  # named, and why it judges nothing


COMMITTED = Path(__file__).resolve().parent.parent / "baselines"


def test_every_committed_baseline_is_named_by_its_own_key_in_the_current_format():
    """Each committed file loads in the current format and its name is the key of the fingerprint it
    holds, so the machine it describes finds it. Nothing here depends on which CPU runs the test."""
    files = sorted(p for p in COMMITTED.glob("*.json") if p.name != STRUCTURE_FILE)  # structure goldens: no hardware
    assert files, f"no baseline files in {COMMITTED}"
    for path in files:
        f = BaselineFile.read(path)
        assert f.format == FORMAT, f"{path.name}: format {f.format!r}, not {FORMAT!r}"
        key = f.fingerprint.key()
        assert path.name == f"{key}.json", f"{path.name} holds the fingerprint of {key}"
        assert json.loads(path.read_text())["key"] == key, path.name
        assert f.entries, f"{path.name} has no measurements"


def test_this_machine_uses_its_own_committed_file_when_there_is_one():
    """The running machine's fingerprint picks its exact file when one is committed; otherwise no
    file, or one of the same hardware with other software, named as such (never another CPU's)."""
    fp = fingerprint("cpu")
    store = BaselineStore(COMMITTED)
    found, source = store.file_for(fp)
    own = COMMITTED / f"{fp.key()}.json"
    if own.is_file():
        assert found is not None and found.path == own and source == own.name
    elif found is not None:
        assert found.fingerprint.same_hardware(fp) and "same hardware" in source, source


def test_a_measurement_of_the_revision_lane_is_judged_by_its_pairs_never_by_the_history_or_saved(tmp_path):
    """Under --mgpu-against the lane's head turns are the measurement: a history that would call it
    slower is not consulted, and a save leaves its history as it was."""
    store = _store(tmp_path, {"lane": _hist(8, 3, sd=0.005)})
    state = TimingState(TimingSettings(baselines_dir=tmp_path / "baselines"), lambda device_type: FP)
    m = _measurement("lane", math.log(1.5))
    m.lane_only, m.reference_samples, m.reference_hash = True, [], ""
    (d,) = state.judge([m])
    assert d["verdict"]["status"] == "new" and d["lane_only"] and state.problems([d]) == ([], [])
    state.collect("t.py::test_lane", "passed", state.properties([d]))
    lines = state.save_baselines(None, "0.1.0")
    assert any("1 measurement(s) of the revision lane not saved" in line for line in lines), lines
    doc = json.loads(store.path_for(FP).read_text())["entries"]
    assert len(doc[_task("lane").key]["launches"]) == 8
    report = tmp_path / "report.json"  # compare agrees, and reads no launch from it
    report.write_text(json.dumps({"format": "pytest-mgpu timing report 2", "rows": [], "measurements": [d]}))
    new = compare.load(report)
    assert not new.launches and compare.judge_pair(compare.load(store.path_for(FP)), new, d["key"], 0.10)[
        "verdict"]["status"] == "new"
    plain = tmp_path / "plain.json"  # the lane's report as OLD: its rows are no launches, and it says so
    plain.write_text(json.dumps({"format": "pytest-mgpu timing report 2", "rows": [],
                                 "measurements": [dict(d, lane_only=False)]}))
    out = subprocess.run([sys.executable, "-m", "pytest_mgpu", "compare", str(report), str(plain)],
                         capture_output=True, text=True, timeout=120).stdout
    assert "1 of OLD's were measured by its revision lane: no history launch, so NEW's are new there" in out, out
