"""The simulated tier's side of the pytest plugin, as its own plugin object.

``pytest_mgpu.plugin`` registers the ``simulate`` marker (``markers.marker_help``) and calls
``SimulatePlugin.configure`` from ``pytest_configure``. Here: ``simulate()`` calls inherit the
running test's limits and seed (``context``); a session with ``simulate``-marked tests has the
forkserver preload what a simulated rank imports (FSDP2, tensor parallel, the fake process group:
1.7 s per simulation otherwise); and the session ends with a table of the simulations it ran, carried
from xdist workers in ``report.user_properties`` as the timing rows are. Public pytest API only.
"""
from __future__ import annotations

import json
from typing import List

import pytest

from .. import markers
from . import context
from .report import summary_table

PROPERTY = "mgpu_simulations"


class SimulatePlugin:
    def __init__(self, config, session):
        self.config, self.session = config, session
        settings = session.settings
        self.defaults = context.CallDefaults(
            timeout_s=settings.timeout_s, timeout_source=settings.timeout_source, seed=settings.seed,
            invocation_dir=str(config.invocation_params.dir),
            launcher=None if session.external is not None else lambda: session.launcher_for(True))
        self.rows: List[dict] = []

    @classmethod
    def configure(cls, config, session) -> "SimulatePlugin":
        plugin = cls(config, session)
        context.push(plugin.defaults)
        config.pluginmanager.register(plugin, "mgpu-simulate")
        return plugin

    def pytest_unconfigure(self, config):
        context.pop(self.defaults)

    def pytest_collection_finish(self, session):
        if any(item.get_closest_marker(markers.SIMULATE) for item in session.items):
            from ..launch.spawn import preload_also
            from .inrank import PRELOAD

            preload_also(PRELOAD)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's, which arms the timer
    def pytest_runtest_protocol(self, item, nextitem):
        try:
            found, problem = markers.marker_timeout(item), ""
        except markers.MarkerError as exc:
            found, problem = None, f"{item.nodeid}: {exc}"  # said by simulate() when it needs the limit
        seconds, source = found or (self.defaults.timeout_s, self.defaults.timeout_source)
        test = self.defaults.for_test(item.nodeid, seconds, source, problem)
        context.push(test)
        try:
            yield
        finally:
            context.pop(test)

    @pytest.hookimpl(optionalhook=True, tryfirst=True)  # firstresult: before pytest-timeout's own
    def pytest_timeout_set_timer(self, item, settings):
        """pytest-timeout arms its timer: a simulation is cut before it fires, as a dist call is; a
        simulate-marked test's forkserver starts first (2-4 s: not the test's time)."""
        if settings.timeout and settings.timeout > 0:
            import time

            test = context.current()
            if test is self.defaults:
                return None
            if item.get_closest_marker(markers.SIMULATE):
                from .runner import warm_up

                warm_up(test)
            where = "@pytest.mark.timeout" if item.get_closest_marker("timeout") else "--timeout / ini timeout"
            test.outer_deadline = time.monotonic() + settings.timeout
            test.outer_source = f"pytest-timeout's limit of {settings.timeout:g}s ({where})"
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item):
        done = context.current().done
        if done:
            rows = [dict(sim.summary_row(), test=item.nodeid) for sim in done]
            item.user_properties.append((PROPERTY, json.dumps(rows)))
            done.clear()

    def pytest_runtest_logreport(self, report):
        if report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == PROPERTY:
                self.rows.extend(json.loads(value))

    def pytest_terminal_summary(self, terminalreporter):
        if self.rows and self.session.is_primary:
            terminalreporter.section("pytest-mgpu simulations")
            for line in summary_table(self.rows).splitlines():
                terminalreporter.write_line(line)
