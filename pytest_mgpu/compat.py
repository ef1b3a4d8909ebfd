"""Which of the plugin's features this torch (and this Python) can run, and why not where one cannot.

The plugin leans on a few private or recent APIs of torch and of CPython's multiprocessing. Where one
is missing, the feature that needs it is off, and the session says so in one line at its start
(``pytest_report_header``) instead of failing later in a rank with torch's own words.

Each probe looks for the API itself (an attribute, a parameter, an importable module), never at
``torch.__version__``: a patched or nightly build answers for what it has. Probes start no process
group and no thread; most read attributes of modules torch has already imported (about 1 ms for all).
Two import a module that costs 0.5-3 s on a 2-core machine (``Check.imports``): the session's start
leaves those out unless already imported, and the runner that uses the feature asks for it where it
imports that module anyway. Results are cached per process; ``features(refresh=True)`` probes again,
as tests do after monkeypatching an API away.

Which torch versions have which API, and why older ones fail beyond what a probe can see (a gloo
``ReduceOp.AVG`` that sums on torch 2.8): docs/design/torch-range.md. Where each check is called:

- ``flight_recorder``: ``launch.flight.recorder_env`` (ranks do not record what cannot be dumped).
- ``external_launch``: ``launch.external.session`` before the rendezvous (torchrun/srun mode).
- ``fsdp2_cpu``, ``pipeline_parity``: ``parity.registry.unavailable`` (``assert_parity`` skips with
  the reason).
- ``warm_pool``, ``forkserver_cleanup``, ``simulate``, ``parity_watch``, ``fsdp1_names``: reported in
  the session's header; on in every torch measured from the floor up.
- ``default_device``: what warm ranks restore between calls (older torch raised after
  ``set_default_device(None)``).

Torch-free to import: torch is imported by ``features`` only.
"""
from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

# A probe returns None when the API is there, else what is missing (a short noun phrase).
Probe = Callable[[], Optional[str]]


@dataclass(frozen=True)
class Feature:
    """One feature of the plugin and whether this torch can run it."""

    name: str
    available: bool
    reason: str = ""  # one line when not available: what is missing and what that turns off
    used_by: str = ""  # the module that needs it

    def line(self) -> str:
        return f"{self.name}: {'on' if self.available else 'off: ' + self.reason}"


def _attr(dotted: str) -> Optional[str]:
    """None when ``module.path:attr.attr`` resolves, else the missing name."""
    module, _, attrs = dotted.partition(":")
    try:
        obj = importlib.import_module(module)
    except Exception:  # ImportError, and anything an optional submodule raises while importing
        return f"{module} (not importable)"
    for part in attrs.split(".") if attrs else []:
        if not hasattr(obj, part):
            return f"{module}.{attrs}"
        obj = getattr(obj, part)
    return None


def _flight_recorder() -> Optional[str]:
    # torch's flight recorder for every backend (gloo included); 2.6 has only the NCCL one
    return _attr("torch._C._distributed_c10d:_dump_fr_trace")


def _external_launch() -> Optional[str]:
    # the control plane's monitor thread needs its own store object: PrefixStore.clone()
    return _attr("torch.distributed:PrefixStore.clone")


def _fsdp2_cpu() -> Optional[str]:
    # fully_shard (public FSDP2) records events on the device's stream; on CPU ranks that is torch.cpu.Stream.
    # fully_shard itself is public from torch 2.6 (the floor): not imported here (0.5-3 s)
    return _attr("torch.cpu:Stream.record_event")


def _pipeline_parity() -> Optional[str]:
    # without scale_grads the schedules leave gradients summed over micro-batches (2x with 2 of them);
    # the same releases also hang in Schedule1F1B on gloo
    missing = _attr("torch.distributed.pipelining.schedules:PipelineScheduleSingle")
    if missing:
        return missing
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    try:
        params = inspect.signature(PipelineScheduleSingle.__init__).parameters
    except (TypeError, ValueError):
        return "PipelineScheduleSingle(scale_grads=...) (signature unreadable)"
    return None if "scale_grads" in params else "PipelineScheduleSingle(scale_grads=...)"


def _simulate() -> Optional[str]:
    return _attr("torch.testing._internal.distributed.fake_pg:FakeStore")


def _warm_pool() -> Optional[str]:
    return (_attr("torch.distributed.distributed_c10d:_get_default_group")
            or _attr("torch.distributed.distributed_c10d:_world.pg_map"))


def _parity_watch() -> Optional[str]:
    return _attr("torch._C:_current_autograd_node")


def _fsdp1_names() -> Optional[str]:
    return _attr("torch.distributed.fsdp._common_utils:clean_tensor_name")


def _forkserver_cleanup() -> Optional[str]:
    from multiprocessing import forkserver, resource_tracker

    for obj, names, where in ((forkserver._forkserver, ("_lock", "_forkserver_address"), "forkserver._forkserver"),
                              (resource_tracker._resource_tracker, ("_lock",), "resource_tracker._resource_tracker")):
        for name in names:
            if not hasattr(obj, name):
                return f"multiprocessing.{where}.{name} (Python {sys.version.split()[0]})"
    return None


@dataclass(frozen=True)
class Check:
    """How one feature is probed: ``probe``, what turns off without it, where it is used, and the module
    the probe imports when that import costs time (None: cheap, torch's import only)."""

    name: str
    probe: Probe
    effect: str
    used_by: str
    imports: Optional[str] = None


# the order is the report's
CHECKS: List[Check] = [
    Check("flight_recorder", _flight_recorder,
          "a hung or failed rank's collectives are not named (its stack still is)", "launch/flight.py"),
    Check("external_launch", _external_launch,
          "pytest under torchrun/srun cannot start its control plane", "launch/external/session.py"),
    Check("fsdp2_cpu", _fsdp2_cpu,
          "FSDP2 (fully_shard) on CPU ranks fails inside torch", "parity/runners/data_parallel.py"),
    Check("pipeline_parity", _pipeline_parity,
          "pipeline parity would read gradients summed over micro-batches", "parity/runners/staged.py",
          imports="torch.distributed.pipelining"),
    Check("simulate", _simulate, "the simulated tier (fake process groups) cannot run", "simulate/inrank.py"),
    Check("warm_pool", _warm_pool, "warm ranks cannot tell a test's own default group from theirs",
          "launch/worker.py"),
    Check("parity_watch", _parity_watch, "parity cannot find the loss a backward starts from", "parity/watch.py"),
    Check("fsdp1_names", _fsdp1_names, "FSDP1 parameter names are not cleaned", "parity/runners/data_parallel.py",
          imports="torch.distributed.fsdp"),
    Check("forkserver_cleanup", _forkserver_cleanup, "the forkserver may outlive pytest by about 1 s",
          "launch/spawn.py"),
]


def default_device():
    """``torch.get_default_device()``, also after ``torch.set_default_device(None)`` on torch 2.9 and
    older, where it raised AttributeError (``_GLOBAL_DEVICE_CONTEXT.device_context`` is None there,
    which means no default-device mode: the cpu, as torch's own else branch answers)."""
    import torch

    try:
        return torch.get_default_device()
    except AttributeError:
        context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", False)
        if context is None:
            return torch.device("cpu")
        raise


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except Exception:
        return "(torch not importable)"


_CACHE: Dict[str, Feature] = {}


def _probe(check: Check) -> Feature:
    if check.name in _CACHE:
        return _CACHE[check.name]
    try:
        missing = check.probe()
    except Exception as exc:  # a probe must never break the session
        missing = f"a readable API (probe raised {type(exc).__name__}: {exc})"
    feature = (Feature(check.name, True, "", check.used_by) if missing is None else
               Feature(check.name, False, f"torch {_torch_version()} has no {missing}: {check.effect}",
                       check.used_by))
    _CACHE[check.name] = feature
    return feature


def _check(name: str) -> Check:
    for check in CHECKS:
        if check.name == name:
            return check
    raise KeyError(f"no such pytest-mgpu feature: {name!r} (known: {', '.join(c.name for c in CHECKS)})")


def refresh() -> None:
    """Forget what was probed: the next question probes again (tests, after monkeypatching an API)."""
    _CACHE.clear()


def features(refresh: bool = False, cheap_only: bool = False) -> Dict[str, Feature]:
    """Every feature by name, each available or not with its one-line reason (cached per process).

    ``cheap_only``: leave out the features whose probe would import a module not yet imported
    (``Check.imports``), as the session's start does; ``refresh``: probe again (tests)."""
    if refresh:
        _CACHE.clear()  # the parameter shadows the function refresh()
    return {c.name: _probe(c) for c in CHECKS
            if not cheap_only or c.imports is None or c.imports in sys.modules or c.name in _CACHE}


def available(name: str) -> bool:
    """Whether feature ``name`` can run here; call it where the feature starts (a runner that imports
    ``Check.imports`` anyway pays nothing more)."""
    return _probe(_check(name)).available


def reason(name: str) -> str:
    """Why feature ``name`` is off ("" when it is on)."""
    return _probe(_check(name)).reason


def require(name: str) -> None:
    """Raise ``FeatureUnavailable`` with the one-line reason when feature ``name`` is off."""
    feature = _probe(_check(name))
    if not feature.available:
        raise FeatureUnavailable(f"pytest-mgpu {feature.name} is off: {feature.reason}")


class FeatureUnavailable(RuntimeError):
    """A feature this torch cannot run was asked for; the message is its one-line reason."""


def unavailable(cheap_only: bool = False) -> List[Feature]:
    """The features that are off, in the report's order."""
    return [f for f in features(cheap_only=cheap_only).values() if not f.available]


def header_lines() -> List[str]:
    """The session's start lines (``pytest_report_header``): nothing when every feature is on, else one
    line per feature that is off. Probes only what costs no import (about 1 ms)."""
    return [f"mgpu: {f.name} off: {f.reason}" for f in unavailable(cheap_only=True)]
