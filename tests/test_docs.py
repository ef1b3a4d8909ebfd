"""The docs say what the code does: the options page lists every declared option, and product text
(the package, the docs, README) cites nothing a user cannot see."""
from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import re
from pathlib import Path
from typing import List

import pytest

from pytest_mgpu.settings import ALL_OPTIONS
from tests.ahead import ahead
from tests.conftest import SESSION_TOKEN, UNUSED_PLUGINS, base_env

ROOT = Path(__file__).resolve().parent.parent
OPTIONS_PAGE = ROOT / "docs" / "reference" / "options.md"
# The pattern of /work/shared/hooks/before-stop: issue numbers, internal notes, seed files, "the day".
LEAK = re.compile(r"[Ii]ssue ?#?[0-9]+|MEASURED\.md|[Ss]eed ?0[0-9]{2}|reference documents|of the day\b")


def _page_generator():
    spec = importlib.util.spec_from_file_location("options_page", ROOT / "tools" / "options_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_declared_option_is_on_the_options_page():
    page = OPTIONS_PAGE.read_text(encoding="utf-8")
    sections = {part.split("`", 1)[0]: part for part in page.split("\n### `")[1:]}
    missing = [opt.flag for opt in ALL_OPTIONS if opt.flag not in sections]
    assert not missing, (f"{OPTIONS_PAGE.relative_to(ROOT)} lacks {', '.join(missing)}: "
                         "run `python tools/options_page.py` (mkdocs build does it too)")
    for opt in ALL_OPTIONS:
        section = sections[opt.flag]
        assert (f"ini `{opt.dest}`" in section) == (opt.ini is not None), f"{opt.flag}: ini name wrong on the page"
        assert (f"`{opt.env}`" in section) if opt.env else True, f"{opt.flag}: environment variable missing"


def test_no_option_name_is_broken_on_the_options_page():
    """Each flag is a heading of its own: never a table cell, where browsers break it at its hyphens."""
    page = OPTIONS_PAGE.read_text(encoding="utf-8")
    assert "| `--" not in page
    assert all(f"### `{opt.flag}`" in page.splitlines() for opt in ALL_OPTIONS)


def test_the_options_page_is_what_the_generator_writes():
    assert OPTIONS_PAGE.read_text(encoding="utf-8") == _page_generator().render(), (
        "docs/reference/options.md is out of date with pytest_mgpu/settings.py: run `python tools/options_page.py`")


def _product_files():
    yield ROOT / "README.md"
    for folder, suffixes in (("pytest_mgpu", {".py", ".md", ".txt"}), ("docs", {".md", ".py"})):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in suffixes:
                yield path


def test_product_text_cites_nothing_users_cannot_see():
    leaks = []
    for path in _product_files():
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if LEAK.search(line):
                leaks.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not leaks, "say it for users, or move it to a docs/design page:\n" + "\n".join(leaks)


# -- the API reference: every keyword a public call reads is in its docstring ---------------------
API_PAGE = ROOT / "docs" / "reference" / "api.md"
PENDING: dict = {}  # documented ahead of a signature that will take them (none today)


def _public_calls():
    import pytest_mgpu
    from pytest_mgpu import Dist
    from pytest_mgpu.simulate import simulate, step

    calls = [getattr(Dist, name) for name in ("run", "run_on", "run_single", "spawn", "benchmark", "assert_parity",
                                              "assert_same_training", "assert_resumes")]
    calls += [simulate, step, pytest_mgpu.rank_device, pytest_mgpu.rank_context, pytest_mgpu.in_rank,
              pytest_mgpu.checkpoint_dir, pytest_mgpu.world_sizes, pytest_mgpu.Simulation.format]
    return calls


def _section(doc: str, title: str) -> List[str]:
    """The names a Google-style section (``Args:``, ``Attributes:``) lists."""
    lines = doc.splitlines()
    if f"{title}:" not in lines:
        return []
    names = []
    for line in lines[lines.index(f"{title}:") + 1:]:
        if line and not line.startswith(" "):
            break
        entry = re.match(r"^    (\*{0,2}\w+)(?: \([^)]*\))?:", line)
        if entry:
            names.append(entry.group(1))
    return names


def _keywords(fn) -> List[str]:
    names = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self":
            continue
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        names.append(prefix + p.name)
    return names


@pytest.mark.parametrize("fn", _public_calls(), ids=lambda fn: fn.__qualname__)
def test_every_keyword_of_a_public_call_is_in_its_docstring(fn):
    doc = inspect.getdoc(fn) or ""
    documented = _section(doc, "Args")
    missing = [name for name in _keywords(fn) if name not in documented]
    assert not missing, f"{fn.__qualname__}: its docstring's Args: section lacks {', '.join(missing)}"
    stale = set(documented) - set(_keywords(fn)) - PENDING.get(fn.__name__, set())
    assert not stale, f"{fn.__qualname__}: Args: lists {', '.join(sorted(stale))}, which its signature lacks"


@pytest.mark.parametrize("cls", ["Simulation", "ParityReport", "Measurement", "RankContext", "simulate.MemoryFigures",
                                 "simulate.StepFigures"])
def test_every_field_of_a_public_result_is_in_its_docstring(cls):
    import importlib

    module, _, name = f"pytest_mgpu.{cls}".rpartition(".")
    obj = getattr(importlib.import_module(module), name)  # pytest_mgpu.simulate: the package, not the function
    fields = [f.name for f in dataclasses.fields(obj)]
    assert sorted(_section(inspect.getdoc(obj) or "", "Attributes")) == sorted(fields), (
        f"{cls}: its docstring's Attributes: section must list its fields {fields}")


def test_every_strategy_option_is_in_assert_paritys_docstring():
    from pytest_mgpu import Dist
    from pytest_mgpu.parity.registry import COMMON, STRATEGIES

    doc = inspect.getdoc(Dist.assert_parity) or ""
    options = set(COMMON) | {name for s in STRATEGIES.values() for name in s.options}
    missing = sorted(name for name in options if f"``{name}=" not in doc)
    assert not missing, f"Dist.assert_parity's docstring lacks the strategy option(s) {', '.join(missing)}"
    assert all(f'"{name}"' in doc for name in STRATEGIES)


def test_the_api_page_names_public_paths_with_real_docstrings():
    import importlib

    for line in API_PAGE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("::: "):
            continue
        path = line[4:].strip()
        assert not any(part.startswith("_") for part in path.split(".")), f"{path}: a private path"
        module, _, name = path.rpartition(".")
        obj = getattr(importlib.import_module(module), name)
        doc = inspect.getdoc(obj) or ""
        assert doc and "::\n" not in doc + "\n" and not re.search(r"\bSee ``?(parity|pytest_mgpu)\.", doc), (
            f"{path}: its docstring must say what it does, in Markdown (no reST '::', no 'see module X')")


def test_every_fence_in_the_docs_names_its_language():
    """```python blocks run (pytest README.md docs/); output is fenced text or console, never bare."""
    bare = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        inside = False
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip().startswith("```"):
                if not inside and line.strip() == "```":
                    bare.append(f"{path.relative_to(ROOT).as_posix()}:{n}")
                inside = not inside
    assert not bare, "fence these as ```text (output) or ```python (code that runs):\n" + "\n".join(bare)


@ahead("collected")
def collections(tmp_path_factory):
    """`pytest --collect-only` of suites/ and of README.md where Sybil cannot be imported, both at once
    (run ahead of the test that reads them): (output, exit code) of each."""
    import subprocess
    import sys

    tmp_path = tmp_path_factory.mktemp("no-sybil")
    stub = tmp_path / "sybil"
    stub.mkdir()
    (stub / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = base_env()
    env = dict(env, PYTHONPATH=f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}")
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST_")}
    env["MGPU_TEST_TOKEN"] = f"{SESSION_TOKEN}-docs"  # ended with the session's lane, if still running

    def collect(*args):  # started at once: both pay the same start-up
        return subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                 *UNUSED_PLUGINS, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    started = [collect("suites/test_dp.py"), collect("README.md")]
    return [(p.communicate(timeout=300)[0], p.returncode) for p in started]


@pytest.fixture(scope="module")
def collected(lane):
    yield from lane.take(collections)


def test_the_suites_collect_where_the_docs_tester_is_not_installed(collected):
    """README's first command installs no test extra: pytest offers README.md to the root conftest's
    collection hook for `pytest suites/` too, which must then ask for no Sybil; named, a page says how
    to install it."""
    (suites, suites_rc), (page, page_rc) = collected
    assert suites_rc == 0, suites
    assert page_rc != 0 and "pip install -e '.[test]'" in page, page


# -- the docs tester: each block alone, unless marked as continuing the one before ------------------
def _root_conftest():
    spec = importlib.util.spec_from_file_location("docs_tester_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_block_is_a_file_of_its_own_unless_it_continues_the_one_before():
    from types import SimpleNamespace

    text = ("```python\nimport os\n```\n\ntext\n\n```python\nx = 1\n```\n\n<!-- continues -->\n"
            "```python\ny = x\n```\n\n```python\nz = 2\n```\n")
    starts = [i for i in range(len(text)) if text.startswith("```python", i)]
    regions = [SimpleNamespace(start=s) for s in starts]
    document = SimpleNamespace(text=text, regions=[(s, r) for s, r in zip(starts, regions)])
    chunks = _root_conftest()._chunks(document)
    assert [[regions.index(r) for r in chunk] for chunk in chunks] == [[0], [1, 2], [3]]


def test_a_block_that_lacks_its_imports_fails_alone(pytester):
    """A page whose second block uses a name only the first imports: it fails at that block, and
    passes once the block says it continues the first."""
    import shutil

    pytester.makefile(".md", page="```python\nimport math\n```\n\n```python\nassert math.pi > 3\n```\n")
    shutil.copy(ROOT / "conftest.py", pytester.path / "conftest.py")
    (pytester.path / "docs").mkdir()
    (pytester.path / "page.md").rename(pytester.path / "docs" / "page.md")
    result = pytester.runpytest_subprocess("docs/page.md", "-p", "no:mgpu", *UNUSED_PLUGINS)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*NameError: name 'math' is not defined*"])
    page = pytester.path / "docs" / "page.md"
    page.write_text(page.read_text().replace("\n\n```python\nassert", "\n\n<!-- continues -->\n```python\nassert"))
    pytester.runpytest_subprocess("docs/page.md", "-p", "no:mgpu", *UNUSED_PLUGINS).assert_outcomes(passed=2)
