"""Hardware fingerprints and baseline files: readable JSON, merges, atomic concurrent writes."""
import json
import multiprocessing as mp

import pytest

from pytest_mgpu.environment import Fingerprint, fingerprint
from pytest_mgpu.timing.baselines import BaselineStore

FP = Fingerprint("NVIDIA H100 80GB HBM3", 8, "nccl", "2.14.1+cu130", "13.0", False)


def _entry(median, n=5):
    return {"median_s": median, "iqr_s": 0.001, "n": n, "samples_s": [median] * n, "recorded": "t"}


def test_fingerprint_key_is_readable_stable_and_file_name_safe():
    key = FP.key()
    assert key.startswith("nvidia-h100-80gb-hbm3-8x-nccl-torch2.14.1-")
    assert key == Fingerprint.from_dict(FP.to_dict()).key()
    assert all(c.isalnum() or c in "-." for c in key)
    upgraded = Fingerprint(FP.device, 8, "nccl", "2.15.0+cu130", "13.0", False)
    assert upgraded.key() != key and upgraded.same_hardware(FP)
    assert upgraded.software_diff(FP) == "torch 2.14.1+cu130 -> 2.15.0+cu130"
    assert not Fingerprint(FP.device, 4, "nccl", FP.torch, "13.0", False).same_hardware(FP)


def test_this_machine_cpu_fingerprint():
    fp = fingerprint("cpu")
    assert fp.emulated and fp.backend == "gloo" and fp.cuda is None and fp.device_count >= 1
    assert fp.key().startswith("cpu-")


def test_save_then_lookup_and_merge(tmp_path):
    store = BaselineStore(tmp_path)
    path = store.save(FP, {"t.py::a::ddp": _entry(0.1)})
    assert path.name == f"{FP.key()}.json"
    store.save(FP, {"t.py::b::ddp": _entry(0.2)})  # merged, not replaced
    fresh = BaselineStore(tmp_path)
    assert fresh.lookup(FP, "t.py::a::ddp").entry["median_s"] == 0.1
    assert fresh.lookup(FP, "t.py::b::ddp").samples == [0.2] * 5
    assert fresh.lookup(FP, "t.py::c::ddp") is None
    text = path.read_text()
    doc = json.loads(text)
    assert doc["fingerprint"]["device"] == FP.device and doc["key"] == FP.key()
    assert '"samples_s": [0.1, 0.1, 0.1, 0.1, 0.1]' in text  # one line per sample list
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_other_software_on_same_hardware_is_the_fallback_baseline(tmp_path):
    BaselineStore(tmp_path).save(FP, {"t.py::a::ddp": _entry(0.1)})
    upgraded = Fingerprint(FP.device, 8, "nccl", "2.15.0+cu130", "13.0", False)
    found = BaselineStore(tmp_path).lookup(upgraded, "t.py::a::ddp")
    assert found is not None and "same hardware, torch 2.14.1+cu130 -> 2.15.0+cu130" in found.source
    other_hw = Fingerprint("NVIDIA A100", 8, "nccl", FP.torch, "13.0", False)
    assert BaselineStore(tmp_path).lookup(other_hw, "t.py::a::ddp") is None


def test_foreign_and_damaged_files(tmp_path):
    (tmp_path / "notes.json").write_text('{"hello": 1}')
    (tmp_path / f"{FP.key()}.json").write_text("{ half a fi")
    store = BaselineStore(tmp_path)
    assert store.file_for(Fingerprint("x", 1, "gloo", "1", None, True)) == (None, "")
    store.save(FP, {"k": _entry(0.3)})  # a damaged file of our own is replaced
    assert BaselineStore(tmp_path).lookup(FP, "k").entry["median_s"] == 0.3
    with pytest.raises(ValueError, match="not a pytest-mgpu baseline file"):
        from pytest_mgpu.timing.baselines import BaselineFile

        BaselineFile.read(tmp_path / "notes.json")


def _writer(directory, worker, count):
    store = BaselineStore(directory)
    for i in range(count):
        store.save(FP, {f"w{worker}::{i}": _entry(0.001 * (i + 1))})


def test_concurrent_writers_lose_nothing(tmp_path):
    ctx = mp.get_context("fork")  # the children only touch files
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    doc = json.loads((tmp_path / f"{FP.key()}.json").read_text())
    assert sorted(doc["entries"]) == sorted(f"w{w}::{i}" for w in range(4) for i in range(15))
