"""pytest hooks and fixtures of pytest-mgpu, and nothing else: each hook calls into a module."""
from __future__ import annotations

import time

import pytest

from . import markers
from .devices import DevicePlan
from .dist import Dist
from .session import MgpuSession, TestRecord
from .settings import ENV_FALLBACK, SettingsError, resolve

SESSION_KEY = pytest.StashKey[MgpuSession]()
PLAN_KEY = pytest.StashKey[DevicePlan]()
OUTER_TIMEOUT_KEY = pytest.StashKey[float]()


def _session(config) -> MgpuSession:
    return config.stash[SESSION_KEY]


# -- configuration --------------------------------------------------------------------------------
def pytest_addoption(parser):
    group = parser.getgroup("mgpu", "pytest-mgpu (multi-GPU PyTorch tests)")
    group.addoption(
        "--mgpu-fallback",
        dest="mgpu_fallback",
        choices=("skip", "cpu"),
        default=None,
        help=f"what a gpuN test does with fewer than N GPUs: skip it (default) or run it on N gloo "
        f"CPU ranks (cpu). Also ini mgpu_fallback, env {ENV_FALLBACK}.",
    )
    group.addoption(
        "--mgpu-timeout",
        dest="mgpu_timeout",
        default=None,
        help="seconds one dist.run may take before its ranks are reported as hung and killed "
        "(default 300; ini mgpu_timeout; per call: dist.run(..., timeout=S)).",
    )
    group.addoption("--mgpu-seed", dest="mgpu_seed", default=None, help="seed of every rank (default 0)")
    group.addoption(
        "--mgpu-max-cpu-ranks",
        dest="mgpu_max_cpu_ranks",
        default=None,
        help="largest world size emulated on CPU; larger tests are skipped (default 8)",
    )
    parser.addini("mgpu_fallback", "skip or cpu: see --mgpu-fallback", default=None)
    parser.addini("mgpu_timeout", "seconds per dist.run call: see --mgpu-timeout", default=None)
    parser.addini("mgpu_seed", "seed of every rank", default=None)
    parser.addini("mgpu_max_cpu_ranks", "largest world size emulated on CPU", default=None)


def pytest_configure(config):
    for line in markers.marker_help():
        config.addinivalue_line("markers", line)
    try:
        settings = resolve(config.getoption, config.getini)
    except SettingsError as exc:
        raise pytest.UsageError(str(exc)) from None
    session = MgpuSession(settings)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(_Recorder(session), "mgpu-recorder")


def pytest_unconfigure(config):
    if SESSION_KEY in config.stash:
        _session(config).close()


def pytest_report_header(config):
    s = _session(config).settings
    return f"mgpu: fallback={s.fallback}, timeout={s.timeout_s:g}s, seed={s.seed}"


# -- planning -------------------------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    try:
        world_size = markers.world_size_of(m.name for m in item.iter_markers())
    except markers.MarkerError as exc:
        pytest.fail(f"{item.nodeid}: {exc}", pytrace=False)
    if world_size is None:
        return
    plan = _session(item.config).plan(world_size)
    item.stash[PLAN_KEY] = plan
    if plan.skip_reason:
        pytest.skip(plan.skip_reason)
    item.user_properties.append(("mgpu_plan", plan.describe()))
    item.user_properties.append(("mgpu_emulated", plan.emulated))


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout is about to arm its timer: keep ours inside it, so our report comes first."""
    if settings.timeout and settings.timeout > 0:
        item.stash[OUTER_TIMEOUT_KEY] = time.monotonic() + settings.timeout
    return None


# -- the fixture ----------------------------------------------------------------------------------
@pytest.fixture
def dist(request):
    """Runs functions on N real torch.distributed ranks (N from the test's gpuN marker)."""
    item = request.node
    plan = item.stash.get(PLAN_KEY, None)
    if plan is None:
        pytest.fail(
            f"{item.nodeid} uses the `dist` fixture but has no gpuN marker: add "
            "@pytest.mark.gpu2 (or gpu1/gpu4/gpu8), or parametrize with "
            "@pytest_mgpu.world_sizes(1, 2, 4)",
            pytrace=False,
        )
    session = _session(request.config)
    try:
        lease = session.lease(plan, session.settings.timeout_s)
    except TimeoutError as exc:
        pytest.fail(str(exc), pytrace=False)
    handle = Dist(
        plan=plan,
        launcher=session.launcher,
        label=item.nodeid,
        timeout_s=session.settings.timeout_s,
        seed=session.settings.seed,
        device_ids=lease.ids if lease else (),
        deadline=item.stash.get(OUTER_TIMEOUT_KEY, None),
    )
    try:
        yield handle
    finally:
        if lease is not None:
            lease.release()
        item.user_properties.append(("mgpu_calls", len(handle.calls)))
        item.user_properties.append(("mgpu_startup_s", [round(c.startup_s, 4) for c in handle.calls if c.ok]))


# -- reporting ------------------------------------------------------------------------------------
class _Recorder:
    """Collects each distributed test's call records from its teardown report (also from xdist
    workers, whose reports carry user_properties to the controller)."""

    def __init__(self, session: MgpuSession):
        self.session = session

    def pytest_runtest_logreport(self, report):
        if report.when != "teardown":
            return
        props = dict(report.user_properties)
        if "mgpu_calls" not in props:
            return
        self.session.records[report.nodeid] = TestRecord(
            nodeid=report.nodeid,
            plan=str(props.get("mgpu_plan", "")),
            emulated=bool(props.get("mgpu_emulated", False)),
            calls=int(props["mgpu_calls"]),
            startup_s=list(props.get("mgpu_startup_s", [])),
        )


def pytest_report_teststatus(report, config):
    if report.when == "call" and report.passed:
        props = dict(report.user_properties)
        if props.get("mgpu_emulated"):
            return "passed", ".", ("PASSED (emulated on cpu)", {"green": True})
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = _session(config).summary_lines()
    if lines:
        terminalreporter.section("pytest-mgpu")
        for line in lines:
            terminalreporter.write_line(line)
