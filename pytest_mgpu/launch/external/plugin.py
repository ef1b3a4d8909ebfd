"""The torchrun/srun side of the pytest plugin, as its own plugin object (as xdist registers ``DSession``).

pytest itself runs in every rank that torchrun or srun started: join that job instead of spawning
ranks, agree with the other ranks on what ran and how it ended, and let rank 0 report.
``pytest_mgpu.plugin`` calls ``addoption`` from ``pytest_addoption`` and ``ExternalPlugin.configure``
from ``pytest_configure``; the object is registered only in a rank of a launched job, so that a plain
pytest run carries none of these hooks.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from typing import TYPE_CHECKING, Optional, TextIO

import pytest

from ..errors import RankFailure
from .agree import TEXT_LIMIT, PhaseRecord, Verdict
from ...settings import EXTERNAL_OPTIONS, add_options
from .detect import ENV_MODE, ExternalError, detect
from ...workers import under_xdist
from .session import ExternalSession

if TYPE_CHECKING:
    from _pytest._io import TerminalWriter

EXTERNAL_KEY = pytest.StashKey["ExternalPlugin"]()


def addoption(parser) -> None:
    add_options(parser, parser.getgroup("mgpu"), EXTERNAL_OPTIONS)


class ExternalPlugin:
    """Per-session hooks of a rank in a launched job."""

    def __init__(self, config, ext: ExternalSession):
        self.config = config
        self.ext = ext
        self.rank = ext.rank
        self.log_path: Optional[str] = None
        self._log: Optional[TextIO] = None
        self._real_tw: Optional[TerminalWriter] = None
        self.interrupted = False

    @classmethod
    def configure(cls, config, session) -> None:
        """Join the job if this pytest is a rank of one, and register the hooks; else do nothing.

        ``session`` is the core's ``MgpuSession`` (untyped here: the launch package does not reach
        back up to the plugin's state); it learns the job (``external``) and whether it reports."""
        try:
            world = detect(os.environ, config.getoption("mgpu_external") or os.environ.get(ENV_MODE) or "auto")
        except ExternalError as exc:
            raise pytest.UsageError(str(exc)) from None
        if world is None or ExternalSession.current is not None:  # not launched, or a nested in-process run
            return
        if under_xdist(config):
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
        hooks = cls(config, ext)
        config.stash[EXTERNAL_KEY] = hooks
        config.pluginmanager.register(hooks, "mgpu-external")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session):
        if self.rank != 0:
            self._quiet()

    def _quiet(self):
        """Ranks other than 0 write their pytest output to a file: one report per job, from rank 0."""
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
    exc = call.excinfo.value if call.excinfo is not None else None
    return not isinstance(exc, RankFailure) or rank in [p.rank for p in exc.primary()]


def _phase_record(report) -> PhaseRecord:
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


def _apply_verdict(report, verdict: Verdict) -> None:
    if verdict.outcome != report.outcome:
        report.longrepr = verdict.message if verdict.outcome == "failed" else verdict.skip
        report.outcome = verdict.outcome
        if verdict.wasxfail:
            report.wasxfail = verdict.wasxfail
    elif verdict.outcome == "skipped" and verdict.skip is not None:
        report.longrepr = verdict.skip  # the one reason every rank gives
    for section in verdict.sections:
        report.sections.append(section)


def _say(text: str) -> None:
    stream = sys.__stderr__ or sys.stderr
    stream.write(text)
    stream.flush()
