"""The structure verdict and its message, without ranks: what a person reads when a step changed,
the tolerance, ranks that changed alike, steps added, the golden file's round trip."""
import json

import pytest

from pytest_mgpu.settings import SettingsError
from pytest_mgpu.timing.structure.settings import resolve_structure
from pytest_mgpu.timing.structure import golden
from pytest_mgpu.timing.structure.figures import CallStructure, StepStructure
from pytest_mgpu.timing.structure.judge import RECORD, Verdict, compare
from pytest_mgpu.timing.units import fmt_size

MIB = 2**20


def call(ag: int, sent: int, peak, ranks=(0,), name="train", world=8) -> CallStructure:
    step = StepStructure(name, {"all_gather_into_tensor": ag, "reduce_scatter_tensor": 4},
                         {"all_gather_into_tensor": sent, "reduce_scatter_tensor": 0}, peak)
    return CallStructure("simulate#0 fsdp_step", "simulate", world, {r: [step] for r in ranks})


def test_a_changed_step_reads_at_a_glance():
    peak = int(7.52 * MIB)
    v = compare("t.py::test_a", call(5, int(14.5 * MIB), peak), call(10, 29 * MIB, peak), 0.0)
    assert v.status == "changed" and v.fails
    assert v.message() == (
        "structure changed in step 0 (train): all_gather_into_tensor 5 -> 10 (+5); bytes sent 14.5 MiB -> "
        "29.0 MiB (+100%); peak 7.52 MiB -> 7.52 MiB (same) [simulate#0 fsdp_step, rank 0 of 8]\n" + RECORD)
    assert RECORD == "If this change is intended, record it: --mgpu-save-structure"
    [numbers] = Verdict.from_dict(json.loads(json.dumps(v.to_dict()))).changes  # what the JSON report carries
    assert numbers["step"] == "step 0 (train)" and numbers["ranks"] == [0]
    assert numbers["counts"]["all_gather_into_tensor"] == [5, 10] and numbers["sent_total"] == [int(14.5 * MIB), 29 * MIB]


def test_equal_is_same_and_bytes_move_within_the_tolerance_only():
    assert compare("t", call(5, 1000, 100), call(5, 1000, 100), 0.0).status == "same"
    moved = call(5, 1049, 100)
    assert compare("t", call(5, 1000, 100), moved, 0.0).status == "changed"
    assert compare("t", call(5, 1000, 100), moved, 0.05).status == "same"
    assert compare("t", call(5, 1000, 100), call(6, 1000, 100), 0.5).status == "changed"  # counts: always exact


def test_a_change_too_small_for_a_percentage_says_its_bytes():
    [line] = compare("t", call(1, 74854, None), call(2, 74858, None), 0.0).lines
    assert "all_gather_into_tensor 1 -> 2 (+1); bytes sent 73.1 KiB -> 73.1 KiB (+4 B)" in line, line


def test_peak_is_judged_only_where_both_sides_measured_it():
    cuda_golden, cpu_run = call(5, 1000, 4 * MIB), call(5, 1000, None)
    assert compare("t", cuda_golden, cpu_run, 0.0).status == "same"
    assert compare("t", call(5, 1000, MIB), call(5, 1000, 2 * MIB), 0.0).lines[0].count("peak 1.00 MiB -> 2.00 MiB (+100%)")


def test_ranks_that_changed_alike_share_a_line_and_a_new_step_is_named():
    old, new = call(4, 100, None, ranks=(0, 1, 2, 3), world=4), call(8, 200, None, ranks=(0, 1, 2, 3), world=4)
    [line] = compare("t", old, new, 0.0).lines
    assert line.endswith("[simulate#0 fsdp_step, ranks 0-3 of 4]")
    longer = call(4, 100, None)
    longer.ranks[0].append(StepStructure("step 1", {"all_reduce": 1}, {"all_reduce": 8}))
    lines = compare("t", call(4, 100, None), longer, 0.0).lines
    assert lines == ["structure changed: 1 steps -> 2 steps (train, step 1) [simulate#0 fsdp_step, rank 0 of 8]"]


def test_sizes_keep_three_digits():
    assert [fmt_size(n) for n in (512, 1536, 29 * MIB, int(7.52 * MIB), 100 * MIB)] == [
        "512 B", "1.50 KiB", "29.0 MiB", "7.52 MiB", "100 MiB"]


def test_the_file_round_trips_with_sections_per_torch(tmp_path):
    path = tmp_path / "structure.json"
    golden.save(path, "2.14.1", {"t.py::a": {"simulate#0 f": call(5, 10, 3)}})
    golden.save(path, "2.15.0", {"t.py::a": {"simulate#0 f": call(6, 10, 3)}})
    sections = golden.read(path)
    assert sorted(sections) == ["2.14.1", "2.15.0"]
    found, other = golden.Goldens(path, "2.14.1", sections).find("t.py::a", "simulate#0 f")
    assert other is None and found is not None and found.ranks[0][0].counts["all_gather_into_tensor"] == 5
    assert golden.Goldens(path, "2.16.0", sections).find("t.py::a", "simulate#0 f") == (None, "2.15.0")
    assert json.loads(path.read_text())["format"] == golden.FORMAT


def test_cpu_and_cuda_ranks_keep_goldens_side_by_side_in_one_torch(tmp_path):
    """A GPU runner records its CUDA goldens beside the CPU runners' of the same torch, never over them."""
    import dataclasses

    path = tmp_path / "structure.json"
    cpu = dataclasses.replace(call(5, 10, 3), device="cpu")
    cuda = dataclasses.replace(call(5, 10, 7), device="cuda")
    golden.save(path, "2.11.0", {"t.py::a[gpu1]": {cpu.call: cpu}})
    golden.save(path, "2.11.0", {"t.py::a[gpu1]": {cuda.call: cuda}})
    sections = golden.read(path)
    assert sorted(sections) == ["2.11.0", "2.11.0 cuda"]
    goldens = golden.Goldens(path, "2.11.0", sections)
    assert goldens.find("t.py::a[gpu1]", cpu.call, "cpu")[0].device == "cpu"
    assert goldens.find("t.py::a[gpu1]", cuda.call, "cuda")[0].device == "cuda"
    assert list(goldens.tests()) == ["t.py::a[gpu1]"]
    del sections["2.11.0"]  # only CUDA's: a CPU rank finds it, and the plugin says "other device"
    assert golden.Goldens(path, "2.11.0", sections).find("t.py::a[gpu1]", cpu.call, "cpu")[0].device == "cuda"
    assert golden.Goldens(path, "2.12.0", sections).find("t.py::a[gpu1]", cuda.call, "cuda") == (None, "2.11.0")
    assert golden.Goldens(path, "2.12.0", sections).find("t.py::a[gpu1]", cpu.call, "cpu") == (None, None)


def test_options_resolve_and_refuse_with_their_source():
    s = resolve_structure(lambda name: None, lambda name: None, {})
    assert (s.mode, s.tolerance, s.save) == ("auto", 0.0, False)
    env = {"PYTEST_MGPU_STRUCTURE": "off", "PYTEST_MGPU_STRUCTURE_TOLERANCE": "5%"}
    s = resolve_structure(lambda name: None, lambda name: None, env)
    assert (s.mode, s.tolerance) == ("off", 0.05)
    with pytest.raises(SettingsError, match="ini mgpu_structure_tolerance takes a percentage"):
        resolve_structure(lambda name: None, lambda name: "lots" if name == "mgpu_structure_tolerance" else None, {})
    with pytest.raises(SettingsError, match="--mgpu-structure must be one of auto, check, off"):
        resolve_structure(lambda name: "maybe" if name == "mgpu_structure" else None, lambda name: None, {})
    for flag, saves in (("mgpu_save_structure", True), ("mgpu_save_baselines", True), ("mgpu_save_timing", False)):
        assert resolve_structure(lambda name: True if name == flag else None, lambda name: None, {}).save is saves, flag
