"""The timing side of the pytest plugin, as its own plugin object (as xdist registers ``DSession``).

``pytest_mgpu.plugin`` calls ``addoption`` from ``pytest_addoption`` and ``TimingPlugin.configure``
from ``pytest_configure``. dist.benchmark measurements are judged where the test ran (an xdist
worker, or the only process), a flagged one re-measured there, and carried to the controller in
``report.user_properties`` (JSON text, also in junit XML), which reports and saves at the end.
Public pytest API only.
"""
from __future__ import annotations

import subprocess
import warnings
from pathlib import Path
from typing import List, Optional

import pytest

from .. import __version__
from ..settings import STRUCTURE_OPTIONS, TIMING_OPTIONS, SettingsError, add_options, resolve_timing
from .baselines import check_writable
from ..workers import under_xdist
from .messages import TimingRegressionWarning, noisy_lines, regression_headline
from .pairing import RevisionStatus
from .state import TimingState


class TimingNoiseWarning(UserWarning):
    """Timings taken where they cannot be trusted (tests sharing the cores under xdist)."""


def addoption(parser) -> None:
    add_options(parser, parser.getgroup("mgpu"), TIMING_OPTIONS + STRUCTURE_OPTIONS)


def git_commit(where: Path) -> Optional[str]:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=str(where), capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _revision_lane(config, options, session):
    """The revision lane of this session, after checking that REV exists where the tests live: a
    wrong REV stops the run at once instead of failing every benchmark."""
    from .revision import RevisionLane
    from .worktree import RevisionError

    if session.external is not None:
        raise pytest.UsageError(f"--mgpu-against={options.against} needs pytest-mgpu to start the ranks itself; "
                                "inside a torchrun/srun job the ranks are the pytest processes. Run it without "
                                "torchrun/srun (gloo CPU ranks or this machine's GPUs).")
    lane = RevisionLane(options.against, options.threshold)
    try:
        lane.worktrees.check(config.rootpath)
    except RevisionError as exc:
        raise pytest.UsageError(str(exc)) from None
    return lane


class TimingPlugin:
    """Per-session timing hooks: judge after each test's call, report and save at the end."""

    def __init__(self, config, state: TimingState, session, lane=None):
        self.config = config
        self.state = state
        self.session = session  # the core's MgpuSession: hardware, and whether this process reports
        self.lane = lane  # timing.revision.RevisionLane under --mgpu-against
        self.rows: list = []
        self.notes: List[str] = []
        self.lines: List[str] = []
        self.structure: List[dict] = []  # the structure verdicts (timing.structure), for the reports

    @classmethod
    def configure(cls, config, session) -> "TimingPlugin":
        from .fingerprint import fingerprint

        try:
            options = resolve_timing(config.getoption, config.getini, config.rootpath,
                                     config.invocation_params.dir)
        except SettingsError as exc:
            raise pytest.UsageError(str(exc)) from None
        shared = under_xdist(config)
        if options.save and shared and not hasattr(config, "workerinput"):
            raise pytest.UsageError(
                f"{options.save_flag} cannot be used with -n/--dist: tests running at once share the cores and time "
                "each other's load, so their timings must not become a baseline. Record timings without -n (structure "
                "goldens alone may be recorded under -n: --mgpu-save-structure).")
        if options.save and not hasattr(config, "workerinput"):
            problem = check_writable(options.baselines_dir, [])
            if problem:
                raise pytest.UsageError(f"{options.save_flag}: cannot write baselines: {problem}. Choose "
                                        "another folder with --mgpu-baselines=DIR, or fix its permissions.")

        def fingerprint_of(device_type: str):
            return fingerprint(device_type, session.hardware.cuda_names if device_type == "cuda" else None)

        lane = _revision_lane(config, options, session) if options.against else None
        plugin = cls(config, TimingState(options, fingerprint_of, shared_cores=shared), session, lane)
        config.pluginmanager.register(plugin, "mgpu-timing")
        return plugin

    @pytest.hookimpl(tryfirst=True)  # before -m reads the markers
    def pytest_collection_modifyitems(self, config, items):
        from .selection import mark_timing_tests, select

        mark_timing_tests(items)
        kept, deselected = select(items, self.state.options.benchmarks)
        if deselected:
            items[:] = kept
            config.hook.pytest_deselected(items=deselected)

    def pytest_unconfigure(self, config):
        if self.lane is not None:
            self.lane.close()  # its ranks, and the worktrees of REV

    def _judge(self, item):
        handle = getattr(item, "funcargs", {}).get("dist")
        measurements = list(getattr(handle, "measurements", None) or [])
        if not measurements:
            return []
        if self.state.shared_cores:
            warnings.warn(TimingNoiseWarning(
                "dist.benchmark under pytest-xdist: tests run at once and share the cores, so these timings "
                "include other tests' load; the gate only warns. Run timing tests without -n."))
        judged = self.state.judge(measurements)
        item.user_properties.extend(self.state.properties(judged))
        return judged

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        handle = getattr(item, "funcargs", {}).get("dist")
        if self.lane is not None and handle is not None:
            handle.against = self.lane.for_test(item.path)  # read by timing.measure.benchmark
        try:
            result = yield
        except BaseException:
            try:
                self._judge(item)  # a failed test's timings still reach the report
            except Exception:
                pass
            raise
        judged = self._judge(item)
        fails, warns = self.state.problems(judged)
        for message in warns:
            warnings.warn(TimingRegressionWarning(message))
        if fails:
            lane = next((f"{r['rev']}@{r['short']}" for d in judged if (r := d.get("revision"))
                         and r["verdict"]["status"] == RevisionStatus.SLOWER.value), "")
            pytest.fail(regression_headline(fails, lane) + "\n" + "\n".join(fails), pytrace=False)
        return result

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            self.state.collect(report.nodeid, report.outcome, report.user_properties)

    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workerinput") or not self.session.is_primary:
            return
        from . import report

        structure = self.config.pluginmanager.get_plugin("mgpu-structure")
        self.structure = structure.report_rows() if structure is not None else []
        if not self.state.records:
            if self.structure:  # structure verdicts without timings: the reports carry those alone
                self._write_reports(report, [], git_commit(self.config.rootpath))
            return

        found = [(rec.nodeid, rec.outcome, d) for rec, d in self.state.measurements()]
        self.rows = report.build_rows(found)
        self.notes = self.state.fingerprint_notes()  # before saving: what this run was judged by
        from .batches import per_rank_suspects
        from .messages import lane_notes

        self.notes += lane_notes(d for _, _, d in found) + per_rank_suspects(self.rows)
        if any(r.efficiency is not None and r.efficiency > 1.0 + 1e-9 for r in self.rows):
            self.notes.append("efficiency over 100% (!): more than linear scaling usually means the one-device "
                              "row was slowed (load, memory); re-run before trusting it")
        if self.state.shared_cores:
            self.notes.append("measured under pytest-xdist: tests shared the cores; the gate only warned")
        commit = git_commit(self.config.rootpath)
        if self.state.options.save:
            try:
                self.lines += self.state.save_baselines(commit, __version__)
            except OSError as exc:
                self.lines.append(f"baselines NOT saved: {exc}")
                session.exitstatus = pytest.ExitCode.INTERNAL_ERROR if session.exitstatus == 0 else session.exitstatus
        self._write_reports(report, found, commit)

    def _write_reports(self, report, found, commit) -> None:
        meta = {"plugin_version": __version__, "commit": commit,
                "fingerprints": sorted({d["fingerprint_key"] for _, _, d in found}),
                "fingerprint": next((d["fingerprint"] for _, _, d in found), None)}
        for path in self.state.options.report_paths:
            try:
                report.write(path, self.rows, found, self.notes, meta, self.structure)
                self.lines.append(f"report written to {path}")
            except OSError as exc:
                self.lines.append(f"report NOT written to {path}: {exc}")
        plot_dir = self.state.options.plot_dir
        if plot_dir is not None:
            from . import plots

            if plots.available():
                files = plots.draw(self.rows, plot_dir)
                self.lines.append(f"{len(files)} chart(s) drawn in {plot_dir}")
            else:
                self.lines.append("--mgpu-plot: matplotlib is not installed (pip install pytest-mgpu[plot])")

    def pytest_terminal_summary(self, terminalreporter):
        if not self.rows:
            return
        from .report import column_notes, lane_details, terminal_table

        terminalreporter.section("pytest-mgpu timing")
        for line in self.notes:
            terminalreporter.write_line(line)
        terminalreporter.write_line(terminal_table(self.rows))
        history = [r.measurement for r in self.rows if r.lane == "history"]
        for line in column_notes(self.rows) + lane_details(self.rows) + noisy_lines(history):
            terminalreporter.write_line(line)
        for line in self.lines:
            terminalreporter.write_line(line)
