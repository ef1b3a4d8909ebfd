"""compat: a torch API taken away turns its feature off, with the one-line reason, at the session's start."""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist

from pytest_mgpu import compat


@pytest.fixture(autouse=True)
def fresh_probes():
    """Each test probes again, and leaves no result probed under its monkeypatches to later tests."""
    compat.refresh()
    yield
    compat.refresh()


def test_every_feature_has_a_reason_exactly_when_off():
    found = compat.features(refresh=True)
    assert list(found) == [c.name for c in compat.CHECKS]
    for feature in found.values():
        assert bool(feature.reason) is (not feature.available), feature
        assert "\n" not in feature.reason


def test_without_the_flight_recorder_dump_its_feature_is_off(monkeypatch):
    c10d = torch._C._distributed_c10d
    if not hasattr(c10d, "_dump_fr_trace"):
        pytest.skip("this torch has no _dump_fr_trace to take away")
    monkeypatch.delattr(c10d, "_dump_fr_trace")
    assert not compat.available("flight_recorder")
    assert compat.reason("flight_recorder") == (
        f"torch {torch.__version__} has no torch._C._distributed_c10d._dump_fr_trace: "
        "a hung or failed rank's collectives are not named (its stack still is)")
    assert compat.available("simulate")  # the others are untouched


def test_without_store_clone_torchrun_mode_is_off(monkeypatch):
    store_types = [t for t in dist.PrefixStore.__mro__ if "clone" in vars(t)]
    for t in store_types:
        monkeypatch.delattr(t, "clone")
    assert not hasattr(dist.PrefixStore, "clone")
    with pytest.raises(compat.FeatureUnavailable) as info:
        compat.require("external_launch")
    assert str(info.value) == (
        f"pytest-mgpu external_launch is off: torch {torch.__version__} has no torch.distributed."
        "PrefixStore.clone: pytest under torchrun/srun cannot start its control plane")


def test_schedules_without_scale_grads_turn_pipeline_parity_off(monkeypatch):
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    def old_init(self, stage, n_microbatches, loss_fn=None):  # torch 2.6's parameters, less the later ones
        raise AssertionError("never called")

    assert "scale_grads" in inspect.signature(PipelineScheduleSingle.__init__).parameters
    monkeypatch.setattr(PipelineScheduleSingle, "__init__", old_init)
    assert compat.reason("pipeline_parity").endswith(
        "has no PipelineScheduleSingle(scale_grads=...): pipeline parity would read gradients summed over "
        "micro-batches")


def test_cpu_stream_without_record_event_turns_fsdp2_on_cpu_off(monkeypatch):
    if not hasattr(torch.cpu.Stream, "record_event"):
        pytest.skip("this torch has no torch.cpu.Stream.record_event to take away")
    monkeypatch.delattr(torch.cpu.Stream, "record_event")
    assert compat.features()["fsdp2_cpu"].line() == (
        f"fsdp2_cpu: off: torch {torch.__version__} has no torch.cpu.Stream.record_event: "
        "FSDP2 (fully_shard) on CPU ranks fails inside torch")


def test_a_probe_that_raises_turns_its_feature_off_and_breaks_nothing(monkeypatch):
    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(compat, "CHECKS", [compat.Check("flight_recorder", broken, "x", "launch/flight.py")])
    feature = compat.features(refresh=True)["flight_recorder"]
    assert not feature.available
    assert "probe raised RuntimeError: boom" in feature.reason


def test_an_unknown_feature_is_named():
    with pytest.raises(KeyError, match="no such pytest-mgpu feature: 'nope'"):
        compat.available("nope")


def test_session_start_names_the_feature_that_is_off(pytester, monkeypatch):
    pytester.makepyfile("def test_one():\n    pass\n")
    monkeypatch.delattr(torch._C._distributed_c10d, "_dump_fr_trace", raising=False)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "mgpu: fallback=*",
        f"mgpu: flight_recorder off: torch {torch.__version__} has no torch._C._distributed_c10d._dump_fr_trace: *",
    ])


def test_session_start_says_nothing_more_when_all_is_on(pytester, monkeypatch):
    monkeypatch.setattr(compat, "CHECKS", [compat.Check("flight_recorder", lambda: None, "x", "launch/flight.py")])
    pytester.makepyfile("def test_one():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert not [line for line in result.outlines if " off: " in line]


def test_default_device_after_set_default_device_none_as_torch_2_8_raised(monkeypatch):
    """torch <= 2.8: get_default_device() raised AttributeError after set_default_device(None)."""
    torch.set_default_device(None)

    def old_get_default_device():
        return torch._GLOBAL_DEVICE_CONTEXT.device_context.device  # None.device, as torch 2.8 read it

    monkeypatch.setattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None, raising=False)
    monkeypatch.setattr(torch, "get_default_device", old_get_default_device)
    assert compat.default_device() == torch.device("cpu")


def test_torchrun_mode_without_store_clone_stops_before_the_rendezvous(monkeypatch):
    from pytest_mgpu.launch.external.detect import ExternalError, LaunchedWorld
    from pytest_mgpu.launch.external.session import ExternalSession

    for t in [t for t in dist.PrefixStore.__mro__ if "clone" in vars(t)]:
        monkeypatch.delattr(t, "clone")
    world = LaunchedWorld(0, 2, 0, 2, 0, "127.0.0.1", 1, "torchrun", "job")  # port 1: never reached
    with pytest.raises(ExternalError) as info:
        ExternalSession.join(world, timeout_s=1.0)
    assert str(info.value).startswith(
        f"rank 0 of 2 (node 0, local rank 0), started by torchrun: torch {torch.__version__} has no "
        "torch.distributed.PrefixStore.clone: pytest under torchrun/srun cannot start its control plane. Run ")


def test_a_feature_that_is_off_skips_its_parity_and_its_recorder(monkeypatch):
    from pytest_mgpu.launch.flight import RECORDER_ENV, recorder_env
    from pytest_mgpu.parity import registry

    assert RECORDER_ENV in recorder_env({})
    c10d = torch._C._distributed_c10d
    if hasattr(c10d, "_dump_fr_trace"):
        monkeypatch.delattr(c10d, "_dump_fr_trace")
        compat.refresh()
        assert recorder_env({}) == {}  # ranks do not record what cannot be dumped
    monkeypatch.setattr(compat, "available", lambda name: name != "fsdp2_cpu")
    monkeypatch.setattr(compat, "reason", lambda name: f"{name} off here")
    spec, opts = registry.resolve("fsdp", {})
    assert registry.unavailable(spec, opts, "cpu", 2) == "fsdp2_cpu off here"
    assert registry.unavailable(spec, opts, "cuda", 2) is None
