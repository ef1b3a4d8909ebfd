"""The structure side of the pytest plugin, as its own plugin object.

``pytest_mgpu.plugin`` calls ``StructurePlugin.configure`` from ``pytest_configure``. After a test's
call, where it ran (an xdist worker, or the only process), every ``simulate()`` call of the test (in
order: ``simulate#0 <fn>``, ``simulate#1 <fn>``...), every ``dist.benchmark`` (``benchmark <name>``),
``assert_parity`` (``parity#0 <strategy>``) and ``assert_same_training`` (``same_training#0 <fn>``)
is judged against its golden (``judge``); a change fails the test (a test that failed already has
the change told in a report section). Verdicts, and under ``--mgpu-save-structure`` (or
``--mgpu-save-baselines``) the structures, travel to the controller in ``report.user_properties``
(JSON text), which saves them (tests that passed only) and reports. Public pytest API only.

Only where wanted: under the default ``--mgpu-structure=auto`` a project without the goldens file
gets no verdict, no report section and no line; a test marked ``mgpu_structure(False)`` is neither
judged nor recorded.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Set

import pytest

from ...markers import STRUCTURE
from ...settings import SettingsError, resolve_timing
from ...simulate import context
from . import golden
from .figures import CallStructure, of_simulation
from .judge import Verdict, compare
from .settings import StructureSettings, resolve_structure

PROPERTY = "mgpu_structure"
MARKER = STRUCTURE  # @pytest.mark.mgpu_structure(False): this test's calls are neither judged nor recorded
SAVE_FLAG = "--mgpu-save-structure"


def wanted(item) -> bool:
    """False where the test opted out with ``@pytest.mark.mgpu_structure(False)``; a malformed
    marker is a usage error that says how to write it."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return True
    if len(marker.args) != 1 or marker.kwargs or not isinstance(marker.args[0], bool):
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARKER} takes True or False, e.g. "
                                f"@pytest.mark.{MARKER}(False) to leave this test's calls unjudged and unrecorded")
    return marker.args[0]


def calls_of(item) -> List[CallStructure]:
    """The structures of the test's calls: simulations, then benchmarks, then parity and same-training
    checks, each in the order they ran."""
    found = [of_simulation(sim, i) for i, sim in enumerate(context.current().done)]
    handle = getattr(item, "funcargs", {}).get("dist")
    for m in getattr(handle, "measurements", None) or []:
        if getattr(m, "structure", None) is not None:
            found.append(m.structure)
    found.extend(getattr(handle, "structures", None) or [])
    return found


class StructurePlugin:
    """Per-session structure hooks: judge after each test's call, save and report at the end."""

    def __init__(self, config, settings: StructureSettings, goldens: golden.Goldens, session, active: bool = True):
        self.config, self.settings, self.goldens, self.save = config, settings, goldens, settings.save
        self.active = active  # judging or recording: off, or auto without a goldens file, is not
        self.session = session  # the core's MgpuSession: whether this process reports
        self.verdicts: List[Verdict] = []
        self.recorded: Dict[str, Dict[str, CallStructure]] = {}
        self.lines: List[str] = []
        self.collected: Set[str] = set()  # test ids this process collected, deselected ones included

    @classmethod
    def configure(cls, config, session) -> "StructurePlugin":
        try:
            settings = resolve_structure(config.getoption, config.getini)
            timing = resolve_timing(config.getoption, config.getini, config.rootpath, config.invocation_params.dir)
        except SettingsError as exc:
            raise pytest.UsageError(str(exc)) from None
        path = Path(timing.baselines_dir) / golden.FILE_NAME
        try:
            sections = golden.read(path) if settings.mode != "off" else {}
        except golden.GoldenError as exc:
            raise pytest.UsageError(str(exc)) from None
        active = settings.save or (settings.mode == "check") or (settings.mode == "auto" and path.is_file())
        plugin = cls(config, settings, golden.Goldens(path, golden.torch_version(), sections), session, active)
        config.pluginmanager.register(plugin, "mgpu-structure")
        return plugin

    def judge(self, test: str, now: CallStructure) -> Verdict:
        """This call against its golden; under --mgpu-save-structure it is recorded instead."""
        if self.save:
            return Verdict(test, now.call, "recorded")
        old, other = self.goldens.find(test, now.call, now.device)
        if old is not None and old.device and now.device and old.device != now.device:
            return Verdict(test, now.call, "other device", [
                f"recorded on {old.device} ranks, these are {now.device}: not judged; record it on these"])
        if old is not None:
            return compare(test, old, now, self.settings.tolerance)
        if other is not None:
            return Verdict(test, now.call, "other torch", [
                f"recorded under torch {other}, this is {self.goldens.torch}: not judged; record again"])
        return Verdict(test, now.call, "new", [f"no golden yet: record it with {SAVE_FLAG}"])

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        try:
            result = yield
        except (Exception, pytest.fail.Exception):  # failed (a timing regression, an assert): the calls it
            changed = [v for v in self._verdicts(item, failed=True) if v.fails]  # finished are judged, not recorded
            if changed:
                item.add_report_section("call", "pytest-mgpu structure", "\n".join(v.message() for v in changed))
            raise
        changed = [v for v in self._verdicts(item) if v.fails]
        if changed:
            pytest.fail("\n".join(v.message() for v in changed), pytrace=False)
        return result

    def records(self, item) -> bool:
        """Whether this test's calls are judged or recorded at all; where not, the ``dist`` fixture
        keeps no structures and ``assert_same_training``'s ranks count no collectives."""
        return self.active and self.settings.mode != "off" and wanted(item)

    def _verdicts(self, item, failed: bool = False) -> List[Verdict]:
        """The test's calls judged (or, recording, recorded), attached to its report."""
        judged = self.records(item) and not (failed and self.save)
        calls = calls_of(item) if judged else []
        if not calls:
            return []
        verdicts = [self.judge(item.nodeid, c) for c in calls]
        record = {c.call: c.to_dict() for c in calls} if self.save else None
        item.user_properties.append((PROPERTY, json.dumps({"verdicts": [v.to_dict() for v in verdicts],
                                                           "record": record})))
        return verdicts

    def pytest_runtest_logreport(self, report):
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name != PROPERTY:
                continue
            data = json.loads(value)
            self.verdicts += [Verdict.from_dict(d) for d in data["verdicts"]]
            if data.get("record") is not None and report.outcome == "passed":
                self.recorded[report.nodeid] = {c: CallStructure.from_dict(c, d) for c, d in data["record"].items()}

    def pytest_deselected(self, items) -> None:
        self.collected.update(i.nodeid for i in items)

    def pytest_collection_finish(self, session) -> None:
        self.collected.update(i.nodeid for i in session.items)

    def stale(self) -> List[str]:
        """Tests with a golden under this torch, in a file this session collected, that it did not
        collect: renamed or removed (their goldens are kept: a test may exist only on other machines)."""
        files = {t.split("::", 1)[0] for t in self.collected}
        tests = self.goldens.tests()
        return sorted(t for t in tests if t.split("::", 1)[0] in files and t not in self.collected)

    def report_rows(self) -> List[dict]:
        """The verdicts as plain data, for the Markdown and JSON reports (``timing.report``)."""
        return [v.to_dict() for v in self.verdicts]

    @pytest.hookimpl(tryfirst=True)  # before the timing plugin writes the reports that carry the verdicts
    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workerinput") or not self.session.is_primary or not self.recorded:
            return
        try:
            n = golden.save(self.goldens.path, self.goldens.torch, self.recorded)
            self.lines.append(f"structure of {n} call(s) recorded in {self.goldens.path} (torch {self.goldens.torch})")
            stale = self.stale()
            if stale:
                self.lines.append(
                    f"{len(stale)} test(s) with a golden in {self.goldens.path.name} were not collected from their "
                    f"file(s) this session (renamed or removed?): {', '.join(stale[:5])}"
                    f"{' ...' if len(stale) > 5 else ''}; their goldens are kept: delete them there if the tests are gone")
        except (OSError, golden.GoldenError) as exc:
            self.lines.append(f"structure NOT recorded: {exc}")
            if session.exitstatus == 0:
                session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def pytest_terminal_summary(self, terminalreporter):
        if not (self.verdicts or self.lines) or not self.session.is_primary:
            return
        terminalreporter.section("pytest-mgpu structure")
        for v in self.verdicts:
            why = f": {v.lines[0]}" if v.status in ("other torch", "other device") and v.lines else ""
            terminalreporter.write_line(f"{v.test}  {v.call}  {v.status}{why}")
        new = sum(v.status == "new" for v in self.verdicts)
        if new and not self.save:
            terminalreporter.write_line(f"{new} call(s) without a golden: not judged; record them with {SAVE_FLAG} "
                                        f"(into {self.goldens.path}; commit it), or opt a test out with "
                                        f"@pytest.mark.{MARKER}(False)")
        for line in self.lines:
            terminalreporter.write_line(line)
