"""Coverage inside ranks: what ``dist.run(fn)`` executes counts in ``pytest --cov`` like the rest.

pytest-cov (and ``coverage run``) measure the test process only. ``fn`` runs in rank processes forked
from the forkserver, and those end with ``os._exit``, so no atexit hook (coverage's own subprocess
support) ever saves their data: a test moved to ``dist.run`` lost its lines from the report.

Test process (``ranks_env``): when a ``coverage.Coverage`` is measuring this process
(``Coverage.current()``: pytest-cov's, ``coverage run``'s; not while pytest-cov pauses for
``no_cover``), its whole configuration travels to the ranks in one environment variable, the data file
made absolute. When nothing measures, nothing is added and ``coverage`` is not imported: it is looked up
in ``sys.modules`` only (pytest-cov imports it; coverage is no dependency of this plugin).

Ranks (``RankCoverage``): measure each call with the same configuration into their own parallel data
file (``data_suffix=True``: ``<data file>.<host>.pid<pid>.X<random>x``, next to the test process's),
saved before the outcome is sent, hence before every ``os._exit`` and, in warm ranks, after every call:
a discarded pool is SIGKILLed, so data saved only at the end would be lost. pytest-cov 7 combines every
``<data file>.*`` of that directory at the end of the session (``Central.finish`` /
``DistMaster.finish`` call ``Coverage.combine()``; a collocated xdist worker's files are combined by
the controller), so the ranks' files land in the report. Under ``coverage run``, use
``--parallel-mode`` and ``coverage combine``.

Cost, measured on the loaded 2-core CI machine with torch imported: a warm rank's stop and save take
3.3-3.8 ms per call (median of 50; SQLite connects and writes in coverage's ``save``), start 0.1 ms;
the tracer is stopped between calls, so the rank's own loop is not measured. A fresh rank also builds and
starts its ``Coverage`` (25 ms) and, unless the forkserver preloaded it (``preload``), imports coverage
(110 ms). ``benchmarks/launch/coverage_cost.py`` times whole calls with and without ``--cov``; there the
machine's load moved medians by more than the warm cost (20.7 ms per 2-rank call without --cov).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional

ENV = "PYTEST_MGPU_COVERAGE"
# Warnings that are true of a rank but not of the run: a rank that never imports a measured package,
# runs none of it, or found it imported before measuring began (the forkserver preloads the plugin).
QUIET = ("no-data-collected", "module-not-imported", "module-not-measured")


def measuring():
    """The ``coverage.Coverage`` measuring this process now, or None; never imports coverage."""
    module = sys.modules.get("coverage")
    current = getattr(getattr(module, "Coverage", None), "current", None)
    return current() if callable(current) else None


def preload() -> List[str]:
    """What the forkserver should import for the ranks: ``coverage`` when this process is measured.
    Importing it in every fresh rank took 110 ms of the 172 ms that --cov added to a fresh 2-rank call
    (``benchmarks/launch/coverage_cost.py``, before the preload)."""
    return ["coverage"] if measuring() is not None else []


def ranks_env(start_dir: str) -> Dict[str, str]:
    """The environment that makes ranks measure as this process does: ``{}`` when it does not.

    ``start_dir`` anchors a relative data file: the directory pytest (and so pytest-cov, or
    ``coverage run``) started in, not the current one, which a test may have changed."""
    cov = measuring()
    if cov is None:
        return {}
    config = cov.config
    data_file = os.path.join(start_dir or os.getcwd(), os.path.expanduser(config.data_file))
    settings: Dict[str, Any] = {"data_file": os.path.abspath(data_file)}
    if hasattr(config, "serialize"):  # coverage >= 7.10: every setting, exactly
        settings["config"] = config.serialize()
    else:  # older coverage: the file it read, and what pytest-cov passes on the command line
        settings.update(config_file=config.config_file or False, source=config.source, branch=config.branch,
                        include=config.run_include, omit=config.run_omit)
    return {ENV: json.dumps(settings)}


def _new_coverage(settings: dict):
    # imported by name: coverage is an optional package, and the type check must pass without it
    coverage: Any = importlib.import_module("coverage")

    if "config" in settings:
        cov = coverage.Coverage(config_file=":data:" + settings["config"], data_suffix=True)
    else:
        cov = coverage.Coverage(config_file=settings["config_file"], source=settings["source"],
                                branch=settings["branch"], include=settings["include"],
                                omit=settings["omit"], data_suffix=True)
    cov.set_option("run:data_file", settings["data_file"])
    quiet: List[str] = list(cov.get_option("run:disable_warnings") or [])  # a list of warning names
    cov.set_option("run:disable_warnings", quiet + [w for w in QUIET if w not in quiet])
    return cov


class RankCoverage:
    """One rank's measurement: ``resume`` before a call, ``pause`` (stop and save) after it.

    Does nothing unless the call's environment carries ``ENV``; a coverage problem is reported once on
    the rank's stderr (shown under the test) and never fails the call."""

    def __init__(self):
        self.cov = None
        self.settings: Optional[str] = None
        self.broken = False

    def resume(self, env: Mapping[str, str]) -> None:
        settings = env.get(ENV)
        if not settings or self.broken:
            return
        try:
            if self.cov is None or settings != self.settings:
                self.cov, self.settings = _new_coverage(json.loads(settings)), settings
            self.cov.start()
        except Exception as exc:
            self._give_up("start", exc)

    def pause(self) -> None:
        if self.cov is None:
            return
        try:
            self.cov.stop()
            self.cov.save()
        except Exception as exc:
            self._give_up("save", exc)

    def _give_up(self, what: str, exc: Exception) -> None:
        self.cov, self.broken = None, True
        sys.stderr.write(f"pytest-mgpu: coverage could not {what} in this rank, its lines are not "
                         f"measured: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
