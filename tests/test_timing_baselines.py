"""Hardware fingerprints and baseline files: launch histories, format-1 migration, damaged files,
atomic concurrent writes."""
import json
import multiprocessing as mp
import os

import pytest

from pytest_mgpu.timing.baselines import (FORMAT, FORMAT_1, HISTORY, BaselineError, BaselineFile, BaselineStore,
                                          Launch, NewLaunch, check_writable)
from pytest_mgpu.timing.fingerprint import Fingerprint, fingerprint

FP = Fingerprint("NVIDIA H100 80GB HBM3", 8, "nccl", "2.14.1+cu130", "13.0", False)


def _new(median, x=0.5, n=5):
    return NewLaunch(Launch("t", median, 0.001, n, "abc123", "0.1.0", median / 2, "h1", x), [median] * n,
                     {"strategy": "ddp", "group": "g", "world_size": 8})


def test_fingerprint_key_is_readable_stable_and_file_name_safe():
    key = FP.key()
    assert key.startswith("nvidia-h100-80gb-hbm3-8x-nccl-torch2.14.1-")
    assert key == Fingerprint.from_dict(FP.to_dict()).key()
    assert all(c.isalnum() or c in "-." for c in key)
    upgraded = Fingerprint(FP.device, 8, "nccl", "2.15.0+cu130", "13.0", False)
    assert upgraded.key() != key and upgraded.same_hardware(FP)
    assert upgraded.software_diff(FP) == "torch 2.14.1+cu130 -> 2.15.0+cu130"
    assert not Fingerprint(FP.device, 4, "nccl", FP.torch, "13.0", False).same_hardware(FP)


def test_cpu_generations_do_not_share_a_key():
    """The same model name ("AMD EPYC") on other CPU generations or ISA levels: other files."""
    base = Fingerprint("AMD EPYC", 2, "gloo", "2.14.1", None, True, "AuthenticAMD 25/1/1", "AVX2")
    other_gen = Fingerprint("AMD EPYC", 2, "gloo", "2.14.1", None, True, "AuthenticAMD 25/17/1", "AVX512")
    assert base.key() != other_gen.key() and not base.same_hardware(other_gen)
    assert "avx2" in base.key() and "avx512" in other_gen.key()
    old = Fingerprint("AMD EPYC", 2, "gloo", "2.14.1", None, True)  # a format-1 file's fingerprint
    assert not old.same_hardware(base)


def test_this_machine_cpu_fingerprint():
    fp = fingerprint("cpu")
    assert fp.emulated and fp.backend == "gloo" and fp.cuda is None and fp.device_count >= 1
    assert fp.key().startswith("cpu-")
    if os.path.exists("/proc/cpuinfo"):
        assert fp.cpu_id and fp.isa


def test_launches_append_to_a_history(tmp_path):
    store = BaselineStore(tmp_path)
    path = store.save(FP, {"t.py::a::ddp": _new(0.1, x=0.1)})
    assert path.name == f"{FP.key()}.json"
    store.save(FP, {"t.py::a::ddp": _new(0.2, x=0.2), "t.py::b::ddp": _new(0.3)})
    entry = BaselineStore(tmp_path).lookup(FP, "t.py::a::ddp").entry
    assert [ln.median_s for ln in entry.launches] == [0.1, 0.2]
    assert entry.history("h1") == [0.1, 0.2] and entry.history("other workload") == []
    assert entry.latest_samples_s == [0.2] * 5 and entry.launches[-1].commit == "abc123"
    doc = json.loads(path.read_text())
    assert doc["format"] == FORMAT and doc["key"] == FP.key()
    assert "samples_s" not in json.dumps(doc["entries"]["t.py::a::ddp"]["launches"])  # latest launch only
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_history_keeps_the_last_launches(tmp_path):
    store = BaselineStore(tmp_path)
    for i in range(HISTORY + 5):
        store.save(FP, {"k": _new(0.1 + i, x=float(i))})
    entry = BaselineStore(tmp_path).lookup(FP, "k").entry
    assert len(entry.launches) == HISTORY and entry.launches[-1].x == HISTORY + 4


def _format1(path, fp=FP):
    doc = {"format": FORMAT_1, "key": fp.key(), "fingerprint": fp.to_dict(), "updated": "2026-01-01T00:00:00Z",
           "entries": {"t.py::a::ddp": {"median_s": 0.25, "iqr_s": 0.01, "n": 3, "samples_s": [0.24, 0.25, 0.26],
                                        "strategy": "ddp", "group": "g", "world_size": 8,
                                        "recorded": "2026-01-01T00:00:00Z"}}}
    path.write_text(json.dumps(doc))
    return doc


def test_format1_is_read_and_migrated_never_lost(tmp_path):
    path = tmp_path / f"{FP.key()}.json"
    original = _format1(path)
    entry = BaselineStore(tmp_path).lookup(FP, "t.py::a::ddp").entry
    assert len(entry.launches) == 1 and entry.launches[0].median_s == 0.25 and entry.launches[0].x is None
    assert entry.latest_samples_s == [0.24, 0.25, 0.26] and entry.history("h1") == []
    BaselineStore(tmp_path).save(FP, {"t.py::a::ddp": _new(0.3), "t.py::b::ddp": _new(0.4)})
    doc = json.loads(path.read_text())
    assert doc["format"] == FORMAT
    launches = doc["entries"]["t.py::a::ddp"]["launches"]
    assert [ln["median_s"] for ln in launches] == [0.25, 0.3]  # the old launch is kept in the history
    assert json.loads((tmp_path / (path.name + ".v1")).read_text()) == original  # and the old file beside it


DAMAGED = {
    "truncated": ('{"format": "pytest-mgpu baselines 2", "entr', "not valid JSON"),
    "random bytes": (bytes(range(256)) * 4, "not text"),
    "a list": ("[1, 2, 3]", "holds a JSON list"),
    "missing keys": ('{"format": "pytest-mgpu baselines 1"}', "'fingerprint' or 'entries' is missing"),
    "samples null": (None, "samples_s is null"),
    "foreign": ('{"hello": 1}', "not a pytest-mgpu baseline file"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGED))
def test_damaged_file_is_reported_measured_as_none_and_repaired(tmp_path, kind):
    content, words = DAMAGED[kind]
    path = tmp_path / f"{FP.key()}.json"
    if content is None:
        doc = _format1(path)
        doc["entries"]["t.py::a::ddp"]["samples_s"] = None
        path.write_text(json.dumps(doc))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(BaselineError, match=words):
        BaselineFile.read(path)
    store = BaselineStore(tmp_path)
    assert store.lookup(FP, "t.py::a::ddp") is None  # no exception: as if there were no baseline
    assert words in store.unreadable(FP) and str(path) in store.unreadable(FP)
    assert list(store.problems) == [str(path)]  # once
    damaged = path.read_bytes()
    store.save(FP, {"t.py::a::ddp": _new(0.3)})
    assert (tmp_path / (path.name + ".corrupt")).read_bytes() == damaged  # kept aside
    assert BaselineStore(tmp_path).lookup(FP, "t.py::a::ddp").entry.launches[0].median_s == 0.3
    assert BaselineStore(tmp_path).unreadable(FP) is None


def test_stray_json_in_the_folder_is_reported_and_skipped(tmp_path):
    (tmp_path / "notes.json").write_text("[1, 2, 3]")
    store = BaselineStore(tmp_path)
    assert store.file_for(Fingerprint("x", 1, "gloo", "1", None, True)) == (None, "")
    assert "holds a JSON list" in store.problems[str(tmp_path / "notes.json")]
    store.save(FP, {"k": _new(0.3)})
    assert BaselineStore(tmp_path).lookup(FP, "k") is not None


def test_unwritable_locations_are_named(tmp_path):
    assert check_writable(tmp_path / "new" / "dir", []) is None
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert "is a file, not a directory" in check_writable(afile, [])
    assert "is a file, not a directory" in check_writable(afile / "below", [])
    adir = tmp_path / "x.json"
    adir.mkdir()
    assert "not a writable file" in check_writable(tmp_path, [adir])


def _writer(directory, worker, count):
    store = BaselineStore(directory)
    for i in range(count):
        store.save(FP, {f"w{worker}::{i}": _new(0.001 * (i + 1)), "shared": _new(0.5, x=float(worker))})


def test_concurrent_writers_lose_nothing(tmp_path):
    ctx = mp.get_context("fork")  # the children only touch files
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 6)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    doc = json.loads((tmp_path / f"{FP.key()}.json").read_text())
    assert sorted(k for k in doc["entries"] if k != "shared") == sorted(f"w{w}::{i}" for w in range(4) for i in range(6))
    assert len(doc["entries"]["shared"]["launches"]) == 24  # every writer's every launch
    # nothing left beside it to commit (no lock, no temporary file), and readable by all
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{FP.key()}.json"]
    assert (tmp_path / f"{FP.key()}.json").stat().st_mode & 0o777 == 0o644


def test_the_structure_goldens_are_readable_by_all_and_not_taken_for_timings(tmp_path):
    from pytest_mgpu.timing.baselines import BaselineError, BaselineFile
    from pytest_mgpu.timing.structure import golden

    path = tmp_path / "structure.json"
    golden.save(path, "2.14.1", {})
    assert path.stat().st_mode & 0o777 == 0o644 and sorted(p.name for p in tmp_path.iterdir()) == ["structure.json"]
    with pytest.raises(BaselineError, match="holds structure goldens .* not timings: pytest judges them"):
        BaselineFile.read(path)
