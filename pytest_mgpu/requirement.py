"""``--mgpu-require-gpus=N``: a GPU runner whose GPUs are gone fails instead of skipping to green.

Without it, a runner whose driver broke skips every ``gpuN`` test with a reason (or, under
``--mgpu-fallback=cpu``, emulates them on CPU ranks) and CI goes green: a silent false pass. With
it, the session fails when fewer than N GPUs are visible, or when any ``gpuK`` test with K <= N
did not get its K GPUs (skipped, or emulated on CPU ranks), naming the option, the GPUs found and
the tests. Tests needing more than N GPUs are not the runner's promise and stay as they are.

The check is plain Python (``unmet``); ``RequirePlugin`` is its pytest side, registered as its own
plugin object from ``pytest_configure`` only when the option is given, so nothing changes without it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import pytest


@dataclass(frozen=True)
class Requirement:
    """N GPUs, and where N came from (``--mgpu-require-gpus``, ``PYTEST_MGPU_REQUIRE_GPUS``, ini)."""

    gpus: int
    where: str

    def describe(self) -> str:
        return f"{self.where}={self.gpus}"


def why_no_gpu() -> str:
    """What torch says when it sees no GPU (a broken driver's message is the useful part)."""
    try:
        import torch

        if not torch.backends.cuda.is_built():
            return "this torch build has no CUDA"
        torch.cuda.init()
    except Exception as exc:  # the driver's own words: "Found no NVIDIA driver on your system..."
        return f"torch.cuda: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
    return "torch.cuda.device_count() is 0"


def _list(names: Sequence[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f", ... ({len(names) - most} more)" if len(names) > most else "")


def unmet(req: Requirement, visible: int, skipped: Dict[str, int], emulated: Dict[str, int],
          reason: str = "") -> Optional[str]:
    """The failure message, or None when the requirement holds. ``skipped``/``emulated``: nodeid ->
    world size of the distributed tests that did not get GPUs (skipped, or run on CPU ranks)."""
    short_skipped = sorted(n for n, k in skipped.items() if k <= req.gpus)
    short_emulated = sorted(n for n, k in emulated.items() if k <= req.gpus)
    if visible >= req.gpus and not short_skipped and not short_emulated:
        return None
    found = f"{visible} GPU(s) visible" + (f" ({reason})" if reason and visible == 0 else "")
    lines = [f"{req.describe()} not met: {found}, {req.gpus} required."]
    if short_skipped:
        lines.append(f"{len(short_skipped)} gpuK test(s) with K <= {req.gpus} skipped for lack of devices: "
                     f"{_list(short_skipped)}")
    if short_emulated:
        lines.append(f"{len(short_emulated)} gpuK test(s) with K <= {req.gpus} ran on emulated CPU ranks "
                     f"instead of GPUs: {_list(short_emulated)}")
    lines.append("This runner was expected to have the GPUs: check its driver and CUDA_VISIBLE_DEVICES "
                 "(`python -m pytest_mgpu` shows what torch sees), or drop the requirement where no GPU "
                 "is expected.")
    return "\n".join(lines)


class RequirePlugin:
    """Counts the tests that did not get their GPUs; fails the session where the requirement is unmet
    (as pytest-cov's --cov-fail-under does: one more failure after the test loop, and a summary line)."""

    def __init__(self, req: Requirement, session):
        self.req = req
        self.session = session  # the core's MgpuSession: hardware, skipped and emulated tests
        self.message: Optional[str] = None

    @classmethod
    def configure(cls, config, session, req: Requirement) -> None:
        if req.gpus > 0 and not hasattr(config, "workerinput"):  # xdist's controller judges, not its workers
            config.pluginmanager.register(cls(req, session), "mgpu-require-gpus")

    def _short(self) -> Tuple[Dict[str, int], Dict[str, int]]:
        skipped = {nodeid: size for nodeid, (size, _) in self.session.skipped.items()}
        emulated = {r.nodeid: r.world_size for r in self.session.records.values() if r.emulated}
        return skipped, emulated

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session):
        result = yield
        if not self.session.is_primary:
            return result
        visible = self.session.hardware.cuda_count
        skipped, emulated = self._short()
        reason = why_no_gpu() if visible < self.req.gpus and visible == 0 else ""
        self.message = unmet(self.req, visible, skipped, emulated, reason)
        if self.message:
            session.testsfailed += 1  # pytest's exit code: 1 (tests failed)
        return result

    def pytest_terminal_summary(self, terminalreporter):
        if self.message:
            terminalreporter.section("pytest-mgpu: GPUs required", red=True)
            for line in self.message.splitlines():
                terminalreporter.write_line(line, red=True)
            terminalreporter.write_line("")
