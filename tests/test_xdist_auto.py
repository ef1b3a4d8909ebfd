"""``pytest -n auto`` on a GPU machine: one xdist worker per GPU lease; xdist decides without GPUs."""
import pytest

from pytest_mgpu import workers
from pytest_mgpu.devices import Hardware


@pytest.fixture
def machine(monkeypatch):
    """Pretend hardware: ``machine(gpus, cpus)``."""
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)

    def make(gpus: int, cpus: int = 64):
        monkeypatch.setattr(workers, "detect_hardware", lambda: Hardware(tuple(map(str, range(gpus))), cpu_count=cpus))
        monkeypatch.setattr(workers, "usable_cpus", lambda: cpus)

    return make


@pytest.mark.parametrize("gpus, cpus, markexpr, expected", [
    (8, 64, "", 8),  # one worker per GPU
    (8, 64, "gpu4", 2),  # every selected test needs 4: two leases at a time
    (8, 64, " gpu2 ", 4),
    (2, 64, "gpu4", 1),  # too few GPUs for the size: still one worker (its tests skip or emulate)
    (8, 64, "gpu2 or gpu4", 8),  # several sizes: per GPU
    (8, 4, "", 4),  # never more workers than cores
    (0, 64, "", None),  # no GPU: xdist's own default
])
def test_auto_workers(machine, gpus, cpus, markexpr, expected):
    machine(gpus, cpus)
    assert workers.auto_workers(markexpr) == expected


def test_the_users_number_wins(machine, monkeypatch):
    machine(8)
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert workers.auto_workers("") is None


def test_xdist_asks_the_plugin_first(pytester, machine):
    pytest.importorskip("xdist")
    machine(4)
    config = pytester.parseconfig("-n", "auto", "-m", "gpu2")
    assert config.hook.pytest_xdist_auto_num_workers(config=config) == 2
    machine(0, cpus=3)
    assert config.hook.pytest_xdist_auto_num_workers(config=config) not in (None, 0)  # xdist's answer
