"""pytest hooks and fixtures of pytest-mgpu, and nothing else: each hook calls into a module."""
from __future__ import annotations

import time

import pytest

from . import markers
from .devices import DevicePlan
from .dist import Dist
from .session import MgpuSession, TestRecord
from .settings import ENV_FALLBACK, SettingsError, resolve, validate_timeout

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
    _external_addoption(parser)


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
    from .timing.plugin import TimingPlugin

    TimingPlugin.configure(config, session)
    _external_configure(config, session)


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
    return f"mgpu: fallback={s.fallback}, timeout={s.timeout_s:g}s, seed={s.seed}"


# -- planning -------------------------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    try:
        world_size = markers.world_size_of(m.name for m in item.iter_markers())
    except markers.MarkerError as exc:
        problem = f"{item.nodeid}: {exc}"
    else:
        problem = None
    if problem:  # outside the except block: pytest would print the MarkerError too, as its context
        pytest.fail(problem, pytrace=False)
    if world_size is None:
        return
    plan = _session(item.config).plan(world_size)
    item.stash[PLAN_KEY] = plan
    if plan.skip_reason:
        raise pytest.skip.Exception(plan.skip_reason, _use_item_location=True)  # report the test, not us
    item.user_properties.append(("mgpu_plan", plan.describe()))
    item.user_properties.append(("mgpu_emulated", plan.emulated))


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
    if plan.skip_reason or plan.device_type == "cuda" or not hasattr(launcher, "prewarm"):
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
    )
    try:
        yield handle
    finally:
        if lease is not None:
            lease.release()
        item.user_properties.append(("mgpu_calls", len(handle.calls)))
        item.user_properties.append(("mgpu_startup_s", [round(c.startup_s, 4) for c in handle.calls if c.ok]))


def _test_timeout(item, session: MgpuSession):
    """The test's limit per dist call: its ``mgpu_timeout`` marker, else --mgpu-timeout / ini."""
    marker = item.get_closest_marker(markers.TIMEOUT)
    if marker is None:
        return session.settings.timeout_s, session.settings.timeout_source
    where = f"@pytest.mark.{markers.TIMEOUT}"
    if len(marker.args) != 1 or marker.kwargs:
        pytest.fail(f"{item.nodeid}: {where} takes one number of seconds, e.g. {where}(60)", pytrace=False)
    try:
        seconds = validate_timeout(marker.args[0], where, text_ok=False)
    except SettingsError as exc:
        pytest.fail(f"{item.nodeid}: {exc}", pytrace=False)
    return seconds, f"{where}({marker.args[0]!r})"


# -- reporting ------------------------------------------------------------------------------------
class _Recorder:
    """Collects each distributed test's call records from its teardown report (also from xdist
    workers, whose reports carry user_properties to the controller)."""

    def __init__(self, session: MgpuSession):
        self.session = session
        self.skipped = set()

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skipped.add(report.nodeid)  # a skipped test did not run distributed
        if report.when != "teardown":
            return
        props = dict(report.user_properties)
        if "mgpu_calls" not in props or report.nodeid in self.skipped:
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


# -- external launchers ---------------------------------------------------------------------------
# pytest itself runs in every rank that torchrun or srun started: join that job instead of spawning
# ranks, agree with the other ranks on what ran and how it ended, and let rank 0 report.
EXTERNAL_KEY = pytest.StashKey["_ExternalHooks"]()


def _external_addoption(parser):
    from .launch.external import ENV_MODE, MODES

    group = parser.getgroup("mgpu")
    group.addoption("--mgpu-external", dest="mgpu_external", choices=MODES, default=None,
                    help="join the job when pytest runs in ranks started by torchrun or srun: auto "
                    "(default: when RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT or an srun step's "
                    f"SLURM_PROCID, SLURM_NTASKS are set), on, off. Also env {ENV_MODE}.")
    group.addoption("--mgpu-rank-logs", dest="mgpu_rank_logs", metavar="DIR", default=None,
                    help="under torchrun/srun, where ranks other than 0 write their pytest output "
                    "(default: <tmp>/pytest-mgpu-<job>/rankN.log); rank 0 reports for all")


def _external_configure(config, session: MgpuSession):
    import os

    from .launch.external import ENV_MODE, ExternalError, ExternalSession, detect

    try:
        world = detect(os.environ, config.getoption("mgpu_external") or os.environ.get(ENV_MODE) or "auto")
    except ExternalError as exc:
        raise pytest.UsageError(str(exc)) from None
    if world is None or ExternalSession.current is not None:  # not launched, or a nested in-process run
        return
    if (getattr(config.option, "numprocesses", None) or getattr(config.option, "dist", "no") not in (None, "no")
            or getattr(config.option, "tx", None) or os.environ.get("PYTEST_XDIST_WORKER")):
        raise pytest.UsageError(
            f"pytest-xdist (-n/--dist) cannot run inside a {world.launcher} job: the launcher already "
            "started one pytest per rank, and every rank must run the same tests in the same order. "
            "Drop -n/--dist here (or use xdist without torchrun/srun: then pytest-mgpu starts the ranks)."
        )
    try:
        ext = ExternalSession.join(world, session.settings.timeout_s)
    except ExternalError as exc:
        raise pytest.UsageError(str(exc)) from None
    session.external = ext
    session.is_primary = world.rank == 0
    if world.rank != 0:  # report files are rank 0's: every rank would write the same path
        for name in ("xmlpath", "report_log"):
            if getattr(config.option, name, None):
                setattr(config.option, name, None)
    hooks = _ExternalHooks(config, ext)
    config.stash[EXTERNAL_KEY] = hooks
    config.pluginmanager.register(hooks, "mgpu-external")


class _ExternalHooks:
    """Per-session hooks of a rank in a launched job."""

    def __init__(self, config, ext):
        self.config = config
        self.ext = ext
        self.rank = ext.rank
        self.log_path = None
        self._log = None
        self._real_tw = None
        self.interrupted = False

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session):
        if self.rank != 0:
            self._quiet()

    def _quiet(self):
        """Ranks other than 0 write their pytest output to a file: one report per job, from rank 0."""
        import os
        import re
        import tempfile

        from _pytest.config import create_terminal_writer

        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        job = re.sub(r"[^A-Za-z0-9_.-]", "_", self.ext.world.job_id)
        folder = (self.config.getoption("mgpu_rank_logs")
                  or os.path.join(tempfile.gettempdir(), f"pytest-mgpu-{job}"))
        os.makedirs(folder, exist_ok=True)
        self.log_path = os.path.join(folder, f"rank{self.rank}.log")
        self._log = open(self.log_path, "w", buffering=1)
        self._real_tw = tr._tw
        tr._tw = create_terminal_writer(self.config, self._log)

    def _loud(self, note: str = ""):
        """Back to the terminal: at the end, or for the rank that reports when rank 0 was lost."""
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None and self._real_tw is not None:
            tr._tw, self._real_tw = self._real_tw, None
            if note:
                tr.write_line(note)

    def pytest_report_header(self, config):
        w = self.ext.world
        return (f"mgpu: {w.describe()}; {self.ext.device.backend} on {self.ext.device.device_type}; "
                "rank 0 reports for every rank")

    def pytest_collection_finish(self, session):
        problem = self.ext.check_collection([i.nodeid for i in session.items], session.testsfailed)
        if problem:
            pytest.exit(problem, returncode=pytest.ExitCode.USAGE_ERROR)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        record = _phase_record(report)
        if report.failed and self.rank != 0 and _failed_here(call, self.rank):
            crash = (record.crash.strip().splitlines() or [""])[0][:300]
            _say(f"[mgpu rank {self.rank}] FAILED {report.nodeid} ({report.when}): {crash}"
                 + (f"  (this rank's output: {self.log_path})" if self.log_path else "") + "\n")
        verdict = self.ext.agree(item.nodeid, report.when, record)
        _apply_verdict(report, verdict)
        if self.ext.broken:
            item.session.shouldstop = f"the {self.ext.world.launcher} job ends: {self.ext.broken}"
            if self.rank != 0 and self.ext.control.reporter() == self.rank:
                self._loud(f"[mgpu rank {self.rank}] rank 0 was lost: rank {self.rank} reports from here "
                           f"(its earlier output: {self.log_path})")
        return report

    def pytest_sessionfinish(self, session, exitstatus):
        self.interrupted = exitstatus == pytest.ExitCode.INTERRUPTED and not self.ext.broken

    def pytest_unconfigure(self, config):
        self.ext.close(interrupted=self.interrupted)
        if self._log is not None:
            self._loud()
            self._log.close()


def _failed_here(call, rank: int) -> bool:
    """A RankFailure is raised on every rank; it happened on the ranks it names first."""
    from .launch.errors import RankFailure

    exc = call.excinfo.value if call.excinfo is not None else None
    return not isinstance(exc, RankFailure) or rank in [p.rank for p in exc.primary()]


def _phase_record(report):
    from .launch.external import TEXT_LIMIT, PhaseRecord

    text = crash = output = ""
    skip = None
    if report.failed:
        text = str(report.longrepr)
        if len(text) > TEXT_LIMIT:
            text = "...\n" + text[-TEXT_LIMIT:]
        crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "") or (
            text.strip().splitlines() or [""])[-1]
        output = "".join(f"\n--- {title} ---\n{content}" for title, content in report.sections
                         if content and title.startswith("Captured"))[-TEXT_LIMIT:]
    elif report.skipped and isinstance(report.longrepr, tuple):
        skip = tuple(report.longrepr)
    return PhaseRecord(report.outcome, text, crash, skip, getattr(report, "wasxfail", None), output)


def _apply_verdict(report, verdict):
    if verdict.outcome != report.outcome:
        report.longrepr = verdict.message if verdict.outcome == "failed" else verdict.skip
        report.outcome = verdict.outcome
        if verdict.wasxfail:
            report.wasxfail = verdict.wasxfail
    elif verdict.outcome == "skipped" and verdict.skip is not None:
        report.longrepr = verdict.skip  # the one reason every rank gives
    for section in verdict.sections:
        report.sections.append(section)


def _say(text: str):
    import sys

    stream = sys.__stderr__ or sys.stderr
    stream.write(text)
    stream.flush()
