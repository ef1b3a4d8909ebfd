"""``baselines/structure.json``: the project's one file of structure goldens, not keyed by hardware
(counts and bytes depend on the code, the plan and torch, never on the CPU or the load)::

    {"format": "pytest-mgpu structure 1",
     "torch": {"2.14.1": {"<test node id>": {"<call>": {"kind", "world_size", "ranks": {...}}}}}}

Sections per torch version (without a local build tag such as ``+cpu``) and device kind: CPU ranks'
goldens under ``"2.14.1"``, CUDA ranks' under ``"2.14.1 cuda"`` (their peaks and, where DTensor syncs
its RNG state, their collectives differ). A golden recorded under another version is not judged. Saving replaces, in this torch's section, the calls of each test that
ran and passed, and keeps everything else; the file is written whole and renamed into place.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, Optional, Tuple

from ..baselines import STRUCTURE_FILE
from ..files import replace_atomically
from .figures import CallStructure

FORMAT = "pytest-mgpu structure 1"
FILE_NAME = STRUCTURE_FILE


class GoldenError(ValueError):
    """The file cannot be used; the message names it and says what to do."""


def torch_version() -> str:
    import torch

    return str(torch.__version__).split("+", 1)[0]


def read(path: Path) -> dict:
    """The file's sections (``{}`` when it does not exist yet)."""
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GoldenError(f"{path}: cannot be read as JSON ({exc}); restore it from git, or delete it and "
                          "record again with --mgpu-save-structure") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("torch"), dict):
        raise GoldenError(f"{path}: not a pytest-mgpu structure file (format {FORMAT!r}); restore it from git, "
                          "or delete it and record again with --mgpu-save-structure")
    return doc["torch"]


def section(torch: str, device: str) -> str:
    """The section of ``torch``'s goldens for calls on ``device`` ranks ("" for a simulated rank)."""
    return torch if device in ("", "cpu") else f"{torch} {device}"


class Goldens:
    """The goldens of one file, looked up for this torch version."""

    def __init__(self, path: Path, torch: str, sections: dict):
        self.path, self.torch, self.sections = path, torch, sections

    def find(self, test: str, call: str, device: str = "") -> Tuple[Optional[CallStructure], Optional[str]]:
        """This torch's golden of ``call`` on ``device`` ranks (else on another device kind, which the
        caller says is not judged), else the newest other torch version that has one there."""
        mine = section(self.torch, device)
        for key in [mine] + sorted(k for k in self.sections if k.split(" ")[0] == self.torch and k != mine):
            own = self.sections.get(key, {}).get(test, {}).get(call)
            if own is not None:
                return CallStructure.from_dict(call, own), None
        kind = mine[len(self.torch):]
        others = sorted((v.split(" ")[0] for v, tests in self.sections.items()
                         if v[len(v.split(" ")[0]):] == kind and call in tests.get(test, {})), reverse=True)
        return None, (others[0] if others else None)

    def tests(self) -> Dict[str, dict]:
        """Every test with a golden under this torch, whatever its ranks' device."""
        found: Dict[str, dict] = {}
        for key, tests in self.sections.items():
            if key.split(" ")[0] == self.torch:
                found.update(tests)
        return found


def save(path: Path, torch: str, recorded: Dict[str, Dict[str, CallStructure]]) -> int:
    """Write ``recorded`` (test -> call -> structure) into ``torch``'s sections, one per device kind
    of the calls' ranks; the calls written."""
    sections = read(path)
    for test, calls in recorded.items():
        by_section: Dict[str, dict] = {}
        for name, s in sorted(calls.items()):
            by_section.setdefault(section(torch, s.device), {})[name] = s.to_dict()
        for key, written in by_section.items():
            sections.setdefault(key, {})[test] = written
    doc = {"format": FORMAT, "torch": {v: dict(sorted(t.items())) for v, t in sorted(sections.items())}}
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, _one_line_steps(json.dumps(doc, indent=1)) + "\n")
    return sum(len(c) for c in recorded.values())


_STEP = re.compile(r'\{\s*"step"(?:[^{}]|\{[^{}]*\})*\}')


def _one_line_steps(text: str) -> str:
    """Each step on one line: a change reads as one changed line in a diff."""
    return _STEP.sub(lambda m: json.dumps(json.loads(m.group(0))), text)
