"""assert_parity's structure: every rank's collectives per training step, recorded and judged like a
benchmark's, the record's own gathers left out. Real pytest sessions on gloo ranks at 2 and 4."""
import json
import re

MODULE = """
import torch
from pytest_mgpu import world_sizes

CAP, RESHARD = {cap}, {reshard}

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])

def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 32, generator=g), torch.randint(0, 32, (8,), generator=g)

@world_sizes(2, 4)
def test_ddp(dist):
    dist.assert_parity("ddp", model, batch, steps=2, bucket_cap_mb=CAP)

@world_sizes(2)
def test_fsdp(dist):
    dist.assert_parity("fsdp", model, batch, steps=2, reshard_after_forward=RESHARD)
"""


def write(pytester, cap=25, reshard=True):
    pytester.makepyfile(test_it=MODULE.format(cap=cap, reshard=reshard))


def run(pytester, *args):
    return pytester.runpytest("--mgpu-fallback=cpu", "-p", "no:cacheprovider", *args)


def test_parity_calls_are_recorded_checked_and_a_changed_plan_fails(pytester):
    write(pytester)
    run(pytester, "--mgpu-save-baselines").assert_outcomes(passed=3)
    section = next(iter(json.loads((pytester.path / "baselines" / "structure.json").read_text())["torch"].values()))
    fsdp = section["test_it.py::test_fsdp[gpu2]"]["parity#0 fsdp"]
    assert fsdp["kind"] == "parity" and sorted(fsdp["ranks"]) == ["0", "1"]
    # 4 blocks and the root: all-gathers and reduce-scatters per block; the one all-reduce is the loss's
    # mean for the report; the gathers that record gradients and parameters are not counted
    assert fsdp["ranks"]["0"][0]["counts"] == {"all_gather_into_tensor": 8, "all_reduce": 1,
                                               "reduce_scatter_tensor": 4}, fsdp["ranks"]["0"][0]
    checked = run(pytester)
    checked.assert_outcomes(passed=3)
    assert "test_it.py::test_ddp[gpu4]  parity#0 ddp  same" in checked.stdout.str()
    write(pytester, cap=0.001, reshard=False)  # a bucket per parameter; blocks kept gathered after forward
    changed = run(pytester)
    changed.assert_outcomes(failed=3)
    text = "\n".join(line for line in changed.outlines if line.startswith("structure changed"))
    print(text)
    for w in (2, 4):
        line = re.search(rf"^structure changed in step 1: .*all_reduce (\d+) -> (\d+).*\[parity#0 ddp, ranks 0-{w - 1} of {w}\]$",
                         text, re.M)
        assert line and int(line.group(2)) > int(line.group(1)), text
    assert re.search(r"^structure changed in step 0: all_gather_into_tensor 8 -> 4 \(-4\).*\[parity#0 fsdp, ranks 0-1 of 2\]$",
                     text, re.M), text


def test_a_golden_of_another_device_type_is_not_judged(pytester):
    """Goldens recorded on CPU ranks say nothing of CUDA ranks (DTensor's RNG broadcast, a peak): the
    call is 'other device', never a failure, even where the counts would differ."""
    write(pytester)
    run(pytester, "--mgpu-save-baselines", "-k", "fsdp").assert_outcomes(passed=1)
    path = pytester.path / "baselines" / "structure.json"
    doc = json.loads(path.read_text())
    call = next(iter(doc["torch"].values()))["test_it.py::test_fsdp[gpu2]"]["parity#0 fsdp"]
    assert call["device"] == "cpu"
    call["device"] = "cuda"
    call["ranks"]["0"][0]["counts"]["broadcast"] = 1  # as a CUDA rank would have it
    path.write_text(json.dumps(doc))
    result = run(pytester, "-k", "fsdp")
    result.assert_outcomes(passed=1)
    assert ("test_it.py::test_fsdp[gpu2]  parity#0 fsdp  other device: recorded on cuda ranks, these are cpu: "
            "not judged; record it on these") in result.stdout.str()
