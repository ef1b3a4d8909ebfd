"""The structure of a call, judged against baselines/structure.json, in real pytest sessions: recorded
then checked, real regressions (DDP buckets, FSDP2 resharding, a block left unwrapped) on real gloo
ranks at 2 and 4 and on the simulated tier, another torch's golden, the off switch, the tolerance,
a missing golden."""
import json
import re

import pytest

from pytest_mgpu.timing.structure.golden import FORMAT
from tests import xdist_together as together

pytestmark = pytest.mark.simulate

MODULE = """
import pytest, torch
from pytest_mgpu import simulate, world_sizes
from pytest_mgpu.simulate import step

CAP, RESHARD, WRAP_ALL, WIDTH = {cap}, {reshard}, {wrap_all}, {width}

def ddp_step():
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
    ddp = torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=CAP)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(8, 32)
    def one():
        opt.zero_grad(); ddp(x).sum().backward(); opt.step()
    return one

def fsdp_step():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)])
    for i, block in enumerate(m):
        if WRAP_ALL or i != 1:
            fully_shard(block, mesh=mesh, reshard_after_forward=RESHARD)
    fully_shard(m, mesh=mesh, reshard_after_forward=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(4, WIDTH)
    def one():
        opt.zero_grad(); m(x).sum().backward(); opt.step()
    return one

def fsdp_sim():
    one = fsdp_step()
    with step("train"):
        one()
"""
BASE = dict(cap=25, reshard=True, wrap_all=True, width=64)


def write(pytester, tests: str, **knobs):
    pytester.makepyfile(test_it=MODULE.format(**dict(BASE, **knobs)) + tests)


def run(pytester, *args):
    return pytester.runpytest("--mgpu-fallback=cpu", "-p", "no:cacheprovider", *args)


def golden(pytester) -> dict:
    return json.loads((pytester.path / "baselines" / "structure.json").read_text())


SIM = """
def test_sim():
    simulate(fsdp_sim, world_size=16, rank=3)
"""
DDP = """
@world_sizes(2, 4)
def test_ddp(dist):
    dist.benchmark(ddp_step, warmup=0, repeat=1, name="ddp")
"""
FSDP = """
@world_sizes(2, 4)
def test_fsdp(dist):
    dist.benchmark(fsdp_step, warmup=0, repeat=1, name="fsdp")
"""


def count_change(text: str, where: str, op: str, ranks: str):
    """(before, after) of ``op`` in the failure line of step ``where`` for ``ranks``; the line's shape
    is the interface: "structure changed in <where>: <op> A -> B (+N); bytes sent X -> Y (P%) [<call>, <ranks>]"."""
    pattern = (rf"^structure changed in {re.escape(where)}: (?:.*; )?{op} (\d+) -> (\d+) \(([+-]\d+)\); "
               rf"bytes sent [\d.]+ [KMG]?i?B -> [\d.]+ [KMG]?i?B \([^)]*\).* \[{re.escape(ranks)}\]$")
    found = re.search(pattern, text, re.M)
    assert found, f"no line for {where}, {op}, {ranks} in:\n{text}"
    before, after, delta = map(int, found.groups())
    assert after - before == delta
    return before, after


def failure_text(result) -> str:
    """The failure messages as the FAILURES section prints them."""
    return "\n".join(line for line in result.outlines
                     if line.startswith(("structure changed", "If this change is intended")))


def test_simulated_recorded_then_checked_then_a_block_left_unwrapped_fails(pytester):
    write(pytester, SIM)
    unwanted = run(pytester)  # a project without goldens: not a word of structure
    unwanted.assert_outcomes(passed=1)
    assert "structure" not in unwanted.stdout.str() and "golden" not in unwanted.stdout.str()
    new = run(pytester, "--mgpu-structure=check")
    new.assert_outcomes(passed=1)
    new.stdout.fnmatch_lines(["*pytest-mgpu structure*", "test_it.py::test_sim  simulate#0 fsdp_sim  new",
                              "1 call(s) without a golden: not judged; record them with --mgpu-save-structure*"])
    assert not (pytester.path / "baselines" / "structure.json").exists()  # recorded only when asked
    run(pytester, "--mgpu-save-structure").assert_outcomes(passed=1)
    doc = golden(pytester)
    assert doc["format"] == FORMAT
    [(torch_version, section)] = doc["torch"].items()
    steps = section["test_it.py::test_sim"]["simulate#0 fsdp_sim"]["ranks"]["3"]
    assert [s["step"] for s in steps] == ["train"] and steps[0]["counts"]["all_gather_into_tensor"] > 0
    same = run(pytester, "--mgpu-report=r.json", "--mgpu-report=r.md")
    same.assert_outcomes(passed=1)
    same.stdout.fnmatch_lines(["test_it.py::test_sim  simulate#0 fsdp_sim  same"])
    report = json.loads((pytester.path / "r.json").read_text())
    assert [(v["test"], v["call"], v["status"]) for v in report["structure"]] == [
        ("test_it.py::test_sim", "simulate#0 fsdp_sim", "same")]
    markdown = (pytester.path / "r.md").read_text()
    assert "## pytest-mgpu structure" in markdown and "| `test_it.py::test_sim` | simulate#0 fsdp_sim | same |" in markdown
    write(pytester, SIM, wrap_all=False)
    changed = run(pytester)
    changed.assert_outcomes(failed=1)
    text = failure_text(changed)
    print(text)
    before, after = count_change(text, "step 0 (train)", "all_gather_into_tensor", "simulate#0 fsdp_sim, rank 3 of 16")
    assert after == before - 1  # the unwrapped block's parameters join the root's all-gather
    assert re.search(r"; peak [\d.]+ KiB -> [\d.]+ KiB \(\+\d+%\)", text), text  # the root holds them unsharded
    assert text.endswith("If this change is intended, record it: --mgpu-save-structure")


def test_a_test_opts_out_and_each_kind_of_baseline_is_recorded_on_its_own(pytester):
    out = SIM.replace("def test_sim()", "@pytest.mark.mgpu_structure(False)\ndef test_out()")
    write(pytester, SIM + out + DDP)
    folder = pytester.path / "baselines"
    run(pytester, "--mgpu-save-timing", "-k", "not gpu4").assert_outcomes(passed=3)
    timing = {p.name: p.read_text() for p in folder.iterdir()}
    assert timing and "structure.json" not in timing  # timing only: no goldens
    run(pytester, "--mgpu-save-structure", "-k", "not gpu4").assert_outcomes(passed=3)
    assert {p.name: p.read_text() for p in folder.iterdir() if p.name != "structure.json"} == timing  # no timing
    assert sorted(next(iter(golden(pytester)["torch"].values()))) == ["test_it.py::test_ddp[gpu2]",
                                                                      "test_it.py::test_sim"]  # not test_out
    (folder / "structure.json").unlink()
    run(pytester, "--mgpu-save-baselines", "-k", "sim or out").assert_outcomes(passed=2)  # the old flag: both
    assert list(next(iter(golden(pytester)["torch"].values()))) == ["test_it.py::test_sim"]
    write(pytester, SIM.replace("def test_sim()", "@pytest.mark.mgpu_structure('no')\ndef test_out()"))
    bad = run(pytester)
    assert "@pytest.mark.mgpu_structure takes True or False" in bad.stdout.str() + bad.stderr.str()


def test_a_renamed_test_s_old_golden_is_named_when_recording(pytester):
    write(pytester, SIM)
    run(pytester, "--mgpu-save-baselines").assert_outcomes(passed=1)
    write(pytester, SIM.replace("def test_sim()", "def test_sim_renamed()"))
    again = run(pytester, "--mgpu-save-baselines", "-k", "nothing_matches or renamed")
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(["1 test(s) with a golden in structure.json were not collected from their file(s) "
                                "this session (renamed or removed?): test_it.py::test_sim; their goldens are kept*"])
    assert sorted(next(iter(golden(pytester)["torch"].values()))) == ["test_it.py::test_sim",
                                                                      "test_it.py::test_sim_renamed"]
    write(pytester, SIM.replace("def test_sim()", "def test_sim_renamed()") + SIM.replace("test_sim", "test_other"))
    partial = run(pytester, "--mgpu-save-baselines", "-k", "other")  # a deselected test is still collected
    partial.assert_outcomes(passed=1, deselected=1)
    partial.stdout.fnmatch_lines(["1 test(s) with a golden * (renamed or removed?): test_it.py::test_sim; *"])


def test_a_test_that_failed_for_another_reason_still_tells_its_structure_change(pytester):
    write(pytester, SIM)
    run(pytester, "--mgpu-save-baselines").assert_outcomes(passed=1)
    write(pytester, SIM.replace("rank=3)", "rank=3)\n    assert False, 'the test s own check'"), wrap_all=False)
    failed = run(pytester)
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*assert False*", "*- Captured pytest-mgpu structure call -*",
                                 "structure changed in step 0 (train): all_gather_into_tensor * -> *",
                                 "*= pytest-mgpu structure =*", "test_it.py::test_sim  simulate#0 fsdp_sim  changed"])
    recorded = golden(pytester)
    run(pytester, "--mgpu-save-baselines").assert_outcomes(failed=1)
    assert golden(pytester) == recorded  # a failed test is never recorded


def test_ddp_bucket_cap_on_real_ranks_at_2_and_4(pytester):
    write(pytester, DDP)
    run(pytester, "--mgpu-save-baselines").assert_outcomes(passed=2)
    section = next(iter(golden(pytester)["torch"].values()))
    for w in (2, 4):
        ranks = section[f"test_it.py::test_ddp[gpu{w}]"]["benchmark ddp"]["ranks"]
        assert sorted(ranks) == [str(r) for r in range(w)]
        assert [s["step"] for s in ranks["0"]] == ["setup", "step 0", "step 1"]
    run(pytester).assert_outcomes(passed=2)
    write(pytester, DDP, cap=0.001)  # one bucket per parameter instead of one for the model
    changed = run(pytester)
    changed.assert_outcomes(failed=2)
    text = failure_text(changed)
    print(text)
    for w in (2, 4):  # the steady step (step 1: DDP rebuilds its buckets after step 0) all-reduces more
        before, after = count_change(text, "step 1", "all_reduce", f"benchmark ddp, ranks 0-{w - 1} of {w}")
        assert after > before
    assert text.endswith("If this change is intended, record it: --mgpu-save-structure")


def test_fsdp2_reshard_flip_on_real_ranks_at_2_and_4(pytester):
    write(pytester, FSDP, reshard=False)
    run(pytester, "--mgpu-save-baselines").assert_outcomes(passed=2)
    run(pytester).assert_outcomes(passed=2)
    write(pytester, FSDP, reshard=True)  # blocks re-gathered in backward
    changed = run(pytester)
    changed.assert_outcomes(failed=2)
    text = failure_text(changed)
    print(text)
    for w in (2, 4):  # each block re-gathered in backward: one more all-gather per block and step
        for where in ("step 0", "step 1"):
            before, after = count_change(text, where, "all_gather_into_tensor", f"benchmark fsdp, ranks 0-{w - 1} of {w}")
            assert after == before + 4


def test_fsdp2_block_left_unwrapped_on_real_ranks(pytester):
    write(pytester, FSDP)
    run(pytester, "--mgpu-save-baselines").assert_outcomes(passed=2)
    write(pytester, FSDP, wrap_all=False)
    changed = run(pytester)
    changed.assert_outcomes(failed=2)
    text = failure_text(changed)
    print(text)
    for w in (2, 4):  # the unwrapped block's parameters join the root's all-gather: one fewer
        before, after = count_change(text, "step 0", "all_gather_into_tensor",
                                     f"benchmark fsdp, ranks 0-{w - 1} of {w}")
        assert after == before - 1


def test_another_torch_off_and_tolerance(pytester):
    write(pytester, SIM)
    run(pytester, "--mgpu-save-baselines").assert_outcomes(passed=1)
    write(pytester, SIM, width=66)  # the same collectives; shards padded to 5 rows of 66 instead of 4 of 64
    changed = run(pytester)
    changed.assert_outcomes(failed=1)
    line = failure_text(changed).splitlines()[0]
    assert line.startswith("structure changed in step 0 (train): collectives the same; bytes sent"), line
    moved = max(int(p) for p in re.findall(r"\(\+(\d+)%\)", line))  # the larger of bytes' and peak's change
    run(pytester, f"--mgpu-structure-tolerance={moved - 1}").assert_outcomes(failed=1)
    run(pytester, f"--mgpu-structure-tolerance={moved + 1}%").assert_outcomes(passed=1)
    off = run(pytester, "--mgpu-structure=off")
    off.assert_outcomes(passed=1)
    assert "pytest-mgpu structure" not in off.stdout.str()
    path = pytester.path / "baselines" / "structure.json"
    doc = golden(pytester)
    [(version, section)] = doc["torch"].items()
    doc["torch"] = {"0.0.1": section}
    path.write_text(json.dumps(doc))
    other = run(pytester)
    other.assert_outcomes(passed=1)
    other.stdout.fnmatch_lines([f"test_it.py::test_sim  simulate#0 fsdp_sim  other torch: recorded under torch 0.0.1, "
                                f"this is {version}: not judged; record again"])


def test_a_damaged_golden_file_stops_the_run_saying_what_to_do(pytester):
    write(pytester, SIM)
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "structure.json").write_text("{not json")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*structure.json: cannot be read as JSON*record again with --mgpu-save-structure*"])


XDIST = together.register("test_structure_xdist.py", MODULE.format(**dict(BASE, cap=0.001)) + SIM + DDP,
                          recorded_first=MODULE.format(**BASE) + SIM + DDP)  # in the shared xdist session


def test_under_xdist_workers_judge_and_the_controller_reports(xdist_together):
    run = xdist_together
    rc, recorded = run.recorded[XDIST]  # recorded without xdist, then judged in the shared session
    assert rc == 0 and "3 passed" in recorded, recorded
    assert run.rc == pytest.ExitCode.TESTS_FAILED, run.out
    assert run.outcomes(XDIST) == {"test_sim": "passed", "test_ddp[gpu2]": "failed", "test_ddp[gpu4]": "failed"}, run.out
    section = run.out.split("pytest-mgpu structure", 1)[1]  # the controller's, from the workers' verdicts
    for line in (f"{XDIST}::test_sim  simulate#0 fsdp_sim  same", f"{XDIST}::test_ddp[gpu2]  benchmark ddp  changed",
                 f"{XDIST}::test_ddp[gpu4]  benchmark ddp  changed"):
        assert line in section, run.out
    for w in (2, 4):
        assert "If this change is intended, record it: --mgpu-save-structure" in run.case(XDIST, f"test_ddp[gpu{w}]").text
    assert run.left == []
