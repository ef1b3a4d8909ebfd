"""The project's pytest configuration file, found as pytest finds it, for ``python -m pytest_mgpu``
(which runs outside pytest): from a folder upwards, the first of ``pytest.ini``, ``.pytest.ini``,
``pyproject.toml`` with a ``[tool.pytest.ini_options]`` (or ``[tool.pytest]``) table, ``tox.ini``
with a ``[pytest]`` section and ``setup.cfg`` with a ``[tool:pytest]`` section. Its folder is the
rootdir that relative ini paths (``mgpu_baselines``) are taken from.
"""
from __future__ import annotations

import configparser
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Union

IniValue = Union[str, bool, list]


@dataclass(frozen=True)
class ProjectIni:
    """One configuration file and the pytest options it sets (values as pytest's ``getini`` reads a
    "string" option: text; TOML booleans and lists kept)."""

    path: Path
    section: str  # "[pytest]", "[tool.pytest.ini_options]", ...
    values: Dict[str, IniValue] = field(default_factory=dict)

    @property
    def rootdir(self) -> Path:
        return self.path.parent

    def get(self, name: str) -> Optional[IniValue]:
        return self.values.get(name)

    def describe(self) -> str:
        return f"{self.path} ({self.section})"


def find_ini(start: Optional[Path] = None) -> Optional[ProjectIni]:
    """The file pytest would read started in ``start`` (default: the current folder); None if none."""
    here = Path.cwd() if start is None else Path(start)
    for folder in (here.resolve(), *here.resolve().parents):
        for name in ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg"):
            path = folder / name
            if path.is_file():
                found = read_ini(path)
                if found is not None:
                    return found
    return None


def read_ini(path: Path) -> Optional[ProjectIni]:
    """``path``'s pytest options, or None where it holds none (a ``pyproject.toml`` without a pytest
    table). A ``pytest.ini`` always counts, as for pytest, even an empty one."""
    if path.suffix == ".toml":
        return _read_toml(path)
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path, encoding="utf-8")
    section = "tool:pytest" if path.name == "setup.cfg" else "pytest"
    if not parser.has_section(section):
        return ProjectIni(path, "no [pytest] section") if path.name.endswith("pytest.ini") else None
    return ProjectIni(path, f"[{section}]", dict(parser.items(section)))


def _read_toml(path: Path) -> Optional[ProjectIni]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - pytest itself depends on tomli there
        import tomli as tomllib  # type: ignore[import-not-found]
    with open(path, "rb") as f:
        data = tomllib.load(f)
    table = data.get("tool", {}).get("pytest")
    if not isinstance(table, dict):
        return None
    if isinstance(table.get("ini_options"), dict):
        return ProjectIni(path, "[tool.pytest.ini_options]", {k: _text(v) for k, v in table["ini_options"].items()})
    return ProjectIni(path, "[tool.pytest]", {k: _text(v) for k, v in table.items()})


def _text(value: object) -> IniValue:
    if isinstance(value, (bool, list)):
        return value
    return str(value)
