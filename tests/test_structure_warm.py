"""The structure gate on unchanged code counts the same collectives in every launch, setup included,
whatever ran in the warm ranks before: a DDP step that builds its model on its first call and keeps
it in its module (so DDP's constructor, an all_gather and the broadcasts, runs in the setup of the
first launch a rank runs and in no later one unless the module starts fresh) is recorded in one test
order and checked in 5 launches of another, after a call that already built the model in the ranks."""
import json

import pytest

pytestmark = pytest.mark.simulate

MODULE = """
import os
import pytest, torch
from pytest_mgpu import world_sizes

MODEL = {}
WARMED = []


def ddp_step():
    # the step itself (its first call is the setup): the model is built once and kept in this module
    if not MODEL:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
        MODEL["ddp"] = torch.nn.parallel.DistributedDataParallel(m)
        MODEL["opt"] = torch.optim.SGD(MODEL["ddp"].parameters(), lr=0.01)
    MODEL["opt"].zero_grad()
    MODEL["ddp"](torch.ones(4, 16)).sum().backward()
    MODEL["opt"].step()


def build_only():
    ddp_step()  # another call in the same ranks builds the model first


@world_sizes(2)
@pytest.mark.parametrize("i", range(5))
def test_launch(dist, i):
    if os.environ.get("WARM_FIRST") and not WARMED:  # the first test of the session
        WARMED.append(i)
        dist.run(build_only)
    dist.benchmark(ddp_step, warmup=0, repeat=1, name="ddp")
"""
CONFTEST = """
import os

def pytest_collection_modifyitems(items):
    if os.environ.get("REVERSED"):
        items.reverse()
"""


def test_ddp_golden_holds_in_5_launches_in_another_test_order(pytester, monkeypatch):
    pytester.makepyfile(test_it=MODULE)
    pytester.makeconftest(CONFTEST)
    args = ("--mgpu-fallback=cpu", "-p", "no:cacheprovider")
    pytester.runpytest(*args, "--mgpu-save-structure").assert_outcomes(passed=5)
    section = next(iter(json.loads((pytester.path / "baselines" / "structure.json").read_text())["torch"].values()))
    setups = {test: calls["benchmark ddp"]["ranks"]["0"][0] for test, calls in section.items()}
    assert len(setups) == 5 and all(s["step"] == "setup" for s in setups.values())
    # every launch recorded DDP's constructor in its setup, the first in the session and the later ones alike
    assert all(s["counts"].get("all_gather") == 1 and s["counts"].get("broadcast", 0) >= 1 for s in setups.values())

    monkeypatch.setenv("REVERSED", "1")
    monkeypatch.setenv("WARM_FIRST", "1")
    result = pytester.runpytest(*args, "-v")
    assert "structure changed" not in result.stdout.str(), result.stdout.str()
    result.assert_outcomes(passed=5)


def test_a_launch_runs_its_function_from_a_fresh_copy_of_its_module(tmp_path, monkeypatch):
    """The mechanism, in one process: what an earlier call left in the module does not reach the
    launch, the rank's module is put back after it, and a module that cannot run twice is used as it is."""
    import sys

    from pytest_mgpu.launch.protocol import FnRef
    from pytest_mgpu.timing.fresh import fresh_function

    (tmp_path / "kept_state.py").write_text("STATE = []\n\ndef step():\n    STATE.append(1)\n    return len(STATE)\n")
    (tmp_path / "once_only.py").write_text(
        "import sys\nif getattr(sys, '_once_only_ran', False):\n    raise RuntimeError('already registered')\n"
        "sys._once_only_ran = True\nCALLS = []\n\ndef step():\n    CALLS.append(1)\n    return len(CALLS)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import kept_state
    import once_only

    monkeypatch.setattr(sys, "_once_only_ran", True, raising=False)
    assert kept_state.step() == 1 and once_only.step() == 1  # an earlier call in this "rank"
    with fresh_function(FnRef.of(kept_state.step)) as step:
        assert step() == 1 and step() == 2  # its own module state, from empty
        assert sys.modules["kept_state"] is not kept_state
    assert sys.modules["kept_state"] is kept_state and kept_state.STATE == [1]
    with fresh_function(FnRef.of(once_only.step)) as step:
        assert step() == 2  # the module could not run again: the rank's copy, as before
    assert sys.modules["once_only"] is once_only
    for name in ("kept_state", "once_only"):
        monkeypatch.delitem(sys.modules, name)
