"""pytest hooks and fixtures of pytest-mgpu, and nothing else: each hook calls into a module."""
from __future__ import annotations

import time
from typing import Optional, Set

import pytest

from . import markers
from .devices import DevicePlan
from .dist import Dist
from .session import MgpuSession, TestRecord
from .settings import SettingsError, resolve

SESSION_KEY = pytest.StashKey[MgpuSession]()
PLAN_KEY = pytest.StashKey[DevicePlan]()
OUTER_TIMEOUT_KEY = pytest.StashKey[float]()
OUTER_SOURCE_KEY = pytest.StashKey[str]()


def _session(config) -> MgpuSession:
    return config.stash[SESSION_KEY]


# -- configuration --------------------------------------------------------------------------------
def pytest_addoption(parser):
    group = parser.getgroup("mgpu", "pytest-mgpu (multi-GPU PyTorch tests)")
    from .settings import CORE_OPTIONS, add_options

    add_options(parser, group, CORE_OPTIONS)
    from .timing.plugin import addoption as timing_addoption

    timing_addoption(parser)
    from .launch.external.plugin import addoption as external_addoption

    external_addoption(parser)


def pytest_configure(config):
    own = [line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")]
    problem = markers.unknown_size_error(config.option.markexpr or "", f"-m {config.option.markexpr!r}", own)
    if problem:  # pytest would deselect every test and say nothing
        raise pytest.UsageError(problem)
    for line in markers.marker_help():
        config.addinivalue_line("markers", line)
    try:
        settings = resolve(config.getoption, config.getini)
    except SettingsError as exc:
        raise pytest.UsageError(str(exc)) from None
    session = MgpuSession(settings)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(_Recorder(session), "mgpu-recorder")
    from .timing.plugin import TimingPlugin

    TimingPlugin.configure(config, session)
    from .launch.external.plugin import ExternalPlugin

    ExternalPlugin.configure(config, session)
    from .requirement import Requirement, RequirePlugin

    RequirePlugin.configure(config, session, Requirement(settings.require_gpus, settings.require_source))
    from .simulate.plugin import SimulatePlugin

    SimulatePlugin.configure(config, session)
    from .timing.structure.plugin import StructurePlugin

    StructurePlugin.configure(config, session)


def pytest_unconfigure(config):
    if SESSION_KEY in config.stash:
        _session(config).close()


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # firstresult: before xdist's own (CPU cores)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per GPU lease, None without GPUs (xdist decides); see ``workers``."""
    from .workers import auto_workers

    return auto_workers(config.getoption("markexpr", "") or "")


def pytest_report_header(config):
    s = _session(config).settings
    from .compat import header_lines

    # a feature this torch cannot run is named here, one line each, before any test fails on it
    return [f"mgpu: fallback={s.fallback}, timeout={s.timeout_s:g}s, seed={s.seed}", *header_lines()]


# -- planning -------------------------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    names = [m.name for m in item.iter_markers()]
    problem: Optional[str]
    try:
        world_size = markers.world_size_of(names)
    except markers.MarkerError as exc:
        world_size, problem = None, f"{item.nodeid}: {exc}"
    else:
        problem = None
    if problem is None and world_size is None and "dist" in getattr(item, "fixturenames", ()):
        problem = markers.unknown_size_error(" ".join(names), item.nodeid)
    if problem:  # outside the except block: pytest would print the MarkerError too, as its context
        pytest.fail(problem, pytrace=False)
    if world_size is None:
        return
    plan = _session(item.config).plan(world_size)
    item.stash[PLAN_KEY] = plan
    if plan.skip_reason:
        item.user_properties.append(("mgpu_skipped", (world_size, _skip_fix(item.config, world_size))))
        raise pytest.skip.Exception(plan.skip_reason, _use_item_location=True)  # report the test, not us
    item.user_properties.append(("mgpu_plan", plan.describe()))
    item.user_properties.append(("mgpu_world_size", plan.world_size))
    item.user_properties.append(("mgpu_emulated", plan.emulated))
    if plan.shared_gpus:
        item.user_properties.append(("mgpu_shared", plan.shared_gpus))


def _skip_fix(config, world_size: int) -> str:
    """The one option that runs a skipped distributed test here (for the summary's line)."""
    settings = _session(config).settings
    if settings.fallback == "skip":
        return "run them on gloo CPU ranks with --mgpu-fallback=cpu"
    return f"emulating them exceeds --mgpu-max-cpu-ranks={settings.max_cpu_ranks}; raise it to run them"


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout is about to arm its timer. Start the test's warm ranks first (a cold 8-rank pool
    takes seconds: not the test's time), then note when the timer fires, so that the call is cut early
    enough for our report (ranks, stacks) to come first."""
    if not (settings.timeout and settings.timeout > 0):
        return None
    _prewarm(item)
    item.stash[OUTER_TIMEOUT_KEY] = time.monotonic() + settings.timeout
    where = "@pytest.mark.timeout" if item.get_closest_marker("timeout") else "--timeout / ini timeout"
    item.stash[OUTER_SOURCE_KEY] = f"pytest-timeout's limit of {settings.timeout:g}s ({where})"
    handle = getattr(item, "funcargs", {}).get("dist")  # func_only: the fixture already exists
    if isinstance(handle, Dist):
        handle.deadline, handle.deadline_source = item.stash[OUTER_TIMEOUT_KEY], item.stash[OUTER_SOURCE_KEY]
    return None


def _prewarm(item) -> None:
    if "dist" not in getattr(item, "fixturenames", ()):
        return
    try:
        world_size = markers.world_size_of(m.name for m in item.iter_markers())
    except markers.MarkerError:
        return
    if world_size is None:
        return
    session = _session(item.config)
    plan = session.plan(world_size)
    launcher = session.launcher_for(item.get_closest_marker(markers.ISOLATE) is not None)
    if plan.skip_reason or plan.device_type == "cuda":
        return  # GPU ranks need the test's device lease first: the call's cut covers their start
    launcher.prewarm(Dist(plan=plan, launcher=launcher, seed=session.settings.seed).spec(world_size))


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
    timeout_s, timeout_source = _test_timeout(item, session)
    structure = request.config.pluginmanager.get_plugin("mgpu-structure")
    handle = Dist(
        plan=plan,
        launcher=session.launcher_for(item.get_closest_marker(markers.ISOLATE) is not None),
        label=item.nodeid,
        timeout_s=timeout_s,
        timeout_source=timeout_source,
        seed=session.settings.seed,
        device_ids=lease.ids if lease else (),
        deadline=item.stash.get(OUTER_TIMEOUT_KEY, None),
        deadline_source=item.stash.get(OUTER_SOURCE_KEY, ""),
        invocation_dir=str(request.config.invocation_params.dir),
        structures=[] if structure is None or structure.records(item) else None,
    )
    try:
        yield handle
    finally:
        if lease is not None:
            lease.release()
        item.user_properties.append(("mgpu_calls", len(handle.calls)))
        item.user_properties.append(("mgpu_startup_s", [round(c.startup_s, 4) for c in handle.calls if c.ok and not c.lane]))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """``world_sizes(..., body="ranks")``: the test function runs in each of its ranks, not here."""
    if pyfuncitem.get_closest_marker(markers.BODY_IN_RANKS) is None:
        return None
    __tracebackhide__ = True
    from .body import BodyError, rank_body, skip_reason
    from .launch.errors import RankFailure

    handle = pyfuncitem.funcargs["dist"]
    skipped: Optional[str] = None
    try:
        handle.run(rank_body(pyfuncitem.obj, pyfuncitem.funcargs, pyfuncitem.nodeid))
    except (BodyError, RankFailure) as exc:  # the ranks' tracebacks are the story, not our frames
        failure = str(exc)
        if isinstance(exc, RankFailure):
            skipped = skip_reason([p.summary for p in exc.problems])
    else:
        return True
    if skipped is not None:
        pytest.skip(skipped)
    pytest.fail(failure, pytrace=False)  # outside the except block: no chained exception


def _test_timeout(item, session: MgpuSession):
    """The test's limit per dist call: its ``mgpu_timeout`` marker, else --mgpu-timeout / ini."""
    problem: Optional[str]
    try:
        found = markers.marker_timeout(item)
    except markers.MarkerError as exc:
        found, problem = None, f"{item.nodeid}: {exc}"
    else:
        problem = None
    if problem:  # outside the except block: pytest would print the MarkerError too, as its context
        pytest.fail(problem, pytrace=False)
    return found or (session.settings.timeout_s, session.settings.timeout_source)


# -- reporting ------------------------------------------------------------------------------------
class _Recorder:
    """Collects each distributed test's call records from its teardown report (also from xdist
    workers, whose reports carry user_properties to the controller)."""

    def __init__(self, session: MgpuSession):
        self.session = session
        self.skipped: Set[str] = set()

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skipped.add(report.nodeid)  # a skipped test did not run distributed
            skipped = dict(report.user_properties).get("mgpu_skipped")
            if skipped:
                self.session.skipped[report.nodeid] = (int(skipped[0]), str(skipped[1]))
        if report.when != "teardown":
            return
        props = dict(report.user_properties)
        if "mgpu_calls" not in props or report.nodeid in self.skipped:
            return
        self.session.records[report.nodeid] = TestRecord(
            nodeid=report.nodeid,
            plan=str(props.get("mgpu_plan", "")),
            emulated=bool(props.get("mgpu_emulated", False)),
            world_size=int(props.get("mgpu_world_size", 0)),
            shared=bool(props.get("mgpu_shared")),
            calls=int(props["mgpu_calls"]),
            startup_s=list(props.get("mgpu_startup_s", [])),
        )


def pytest_report_teststatus(report, config):
    if report.when == "call" and report.passed:
        props = dict(report.user_properties)
        if props.get("mgpu_emulated"):
            where = "ranks sharing a GPU" if props.get("mgpu_shared") else "cpu"
            return "passed", ".", (f"PASSED (emulated on {where})", {"green": True})
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = _session(config).summary_lines()
    if lines:
        terminalreporter.section("pytest-mgpu")
        for line in lines:
            terminalreporter.write_line(line)
