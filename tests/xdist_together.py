"""One pytest-xdist session (a controller and two workers) for every test that needs one: each test
module registers its part (a file of cases) when it is imported, and the session-scoped fixture
``xdist_together`` (tests/conftest.py) writes all the parts registered into one folder and runs them
in one ``pytest -n 2`` subprocess. Each test then reads its own part of that session's report: its
cases' outcomes, failure texts and properties in the junit XML, the warnings the summary lists for
its file, the timing report's rows of its tests. Run alone, a test module's session has its part only.
"""
from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Literal, Optional

Outcome = Literal["passed", "failed", "skipped", "error"]

# The options of the session: each part's claims hold under all of them (no part may need another).
ARGS = ("-n", "2", "--mgpu-fallback=cpu", "-p", "no:randomly", "--junitxml=junit.xml", "--mgpu-report=r.json")


@dataclasses.dataclass(frozen=True)
class Part:
    """A file of cases for the shared session. ``recorded_first``: another text of the file, run
    first alone with ``--mgpu-save-baselines`` (its baselines then judge ``text``)."""
    file: str
    text: str
    recorded_first: Optional[str] = None


PARTS: dict[str, Part] = {}


def register(file: str, text: str, recorded_first: Optional[str] = None) -> str:
    """Adds a part to the session (call it at a test module's import); returns ``file``."""
    PARTS[file] = Part(file, text, recorded_first)
    return file


@dataclasses.dataclass(frozen=True)
class Case:
    """One test case of the session, from the junit XML."""
    outcome: Outcome
    text: str  # the failure's message and text ("" for one that passed)
    properties: dict[str, str]


@dataclasses.dataclass
class Together:
    """The shared session, ended: its exit code and output, its junit cases by node id, its timing
    report, the processes it left (after a bounded wait for them to be reaped), and for each part
    recorded first, how that recording ended (exit code, output)."""
    path: Path
    rc: int
    out: str
    cases: dict[str, Case]
    report: dict
    left: list[int]
    recorded: dict[str, tuple[int, str]]

    def outcomes(self, file: str) -> dict[str, Outcome]:
        """The outcome of each case of ``file``, by its name (``test_x[gpu2]``)."""
        return {nodeid.split("::", 1)[1]: c.outcome for nodeid, c in self.cases.items()
                if nodeid.split("::", 1)[0] == file}

    def case(self, file: str, name: str) -> Case:
        return self.cases[f"{file}::{name}"]

    def warned(self, file: str) -> Counter:
        """The warnings of the summary raised in tests of ``file``: a count per first line of their
        message (pytest lists a message's tests, or a count per file when it has ten or more)."""
        found: Counter = Counter()
        section = self.out.split(" warnings summary ", 1)[1].split("\n-- Docs:", 1)[0] if (
            " warnings summary " in self.out) else ""
        held: Counter = Counter()
        for line in section.splitlines()[1:]:
            per_file = re.fullmatch(r"(\S+\.py): (\d+) warnings?", line)
            if per_file:
                held[per_file[1]] += int(per_file[2])
            elif line and not line.startswith(" ") and "::" in line:
                held[line.split("::", 1)[0]] += 1
            elif line.startswith("  ") and not line.startswith("    ") and held:
                message = re.sub(r"^.*?:\d+: ", "", line.strip())  # the warning's place left out
                found[message] += held[file]
                held = Counter()
        return +found


def junit_cases(path: Path) -> dict[str, Case]:
    """Each test case of a junit XML file, by node id (file::name); none if there is no file."""
    cases: dict[str, Case] = {}
    if not path.exists():
        return cases
    for c in ET.parse(path).getroot().iter("testcase"):
        nodeid = f"{c.get('classname', '').replace('.', '/')}.py::{c.get('name')}"
        outcome: Outcome = "passed"
        text = ""
        for kind in ("failure", "error", "skipped"):
            found = c.find(kind)
            if found is not None:
                outcome = "failed" if kind == "failure" else kind  # type: ignore[assignment]
                text = f"{found.get('message', '')}\n{found.text or ''}"
                break
        props = {p.get("name", ""): p.get("value", "") for p in c.iter("property")}
        cases[nodeid] = Case(outcome, text, props)
    return cases


def read_report(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}
