"""Root conftest: pytest-mgpu itself loads through its pytest11 entry point, not from here.

Only project-wide collection rules live here, among them the docs tester: ``python -m pytest
README.md docs/`` collects every ```python block of README.md and of the pages under docs/ with
Sybil (docs/design/docs-tester.md says why Sybil, and how a page runs). Each page's blocks are
copied, in order, into one test file, as a reader would copy them, and ``pytest --mgpu-fallback=cpu``
runs that file once; each block that defines tests passes or fails with them. Output-only blocks are fenced ```text or
```console and are not run.
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from xml.etree import ElementTree

collect_ignore = ["benchmarks", "build"]

ROOT = Path(__file__).resolve().parent
PAGE_TIMEOUT_S = 600  # one page's tests; a hang fails its blocks instead of the whole run
_sybil_hook = None


def _asked_for(file_path: Path, config) -> bool:
    """The command line named this page, or a folder below the root that holds it (``docs/``)."""
    here = Path(config.invocation_params.dir)
    for arg in config.args:
        path = (here / arg.split("::", 1)[0]).resolve()
        if path == file_path or (path != ROOT and path in file_path.parents):
            return True
    return False


def pytest_collect_file(file_path, parent):
    """README.md and docs/**/*.md: their Python blocks (Sybil, imported only when a page is collected,
    so that a run of suites/ or tests/ needs no docs tester installed)."""
    global _sybil_hook
    if file_path.suffix != ".md" or not (file_path == ROOT / "README.md" or ROOT / "docs" in file_path.parents):
        return None
    if _sybil_hook is None:
        try:
            from sybil import Sybil
        except ImportError as exc:
            if not _asked_for(file_path, parent.config):
                return None  # pytest offers README.md to this hook for `pytest suites/` too: not asked, not run
            raise ImportError("the docs' Python blocks are run by Sybil: pip install -e '.[test]' (or "
                              "pip install sybil), then python -m pytest README.md docs/") from exc
        from sybil.evaluators.python import PythonEvaluator
        from sybil.parsers.markdown import CodeBlockParser

        class PageBlocks(CodeBlockParser):
            language = "python"

            def evaluate(self, example):
                PythonEvaluator()(example)  # here first: a module-level error names the block's own line
                blocks = [str(region.parsed) for _, region in example.document.regions]
                return run_block(example.namespace, Path(example.path), blocks, str(example.parsed))

        _sybil_hook = Sybil(parsers=[PageBlocks()], patterns=["*.md"],
                            teardown=_remove_page).pytest()
    return _sybil_hook(file_path, parent)


def run_block(namespace: dict, page: Path, blocks: List[str], source: str) -> Optional[str]:
    """The verdict on the tests this block defines: what pytest said of them (Sybil reports it at the
    block's line), or None when they passed or it defines none. The page runs once, at its first block
    with tests: all its blocks in order in one test file (the ranks import their functions from it)."""
    again = sorted(set(_defined(source)) & {name for block in blocks if block != source for name in _defined(block)})
    if again:
        return (f"another block of this page defines {', '.join(again)} too: in the reader's file the last "
                "one wins; give each its own name")
    tests = [name for name in _defined(source) if name.lower().startswith("test")]
    if not tests:
        return None
    if "outcomes" not in namespace:
        namespace["page_dir"] = tempfile.mkdtemp(prefix="mgpu-docs-")
        namespace["outcomes"], namespace["output"] = _run_page(Path(namespace["page_dir"]), page, blocks)
    outcomes: Dict[str, List[str]] = namespace["outcomes"]
    missing = [name for name in tests if name not in outcomes]
    if missing:
        return f"pytest ran no {', '.join(missing)}:\n{namespace['output']}"
    bad = [line for name in tests for line in outcomes[name]]
    return "\n\n".join(bad) or None


def _run_page(folder: Path, page: Path, blocks: List[str]) -> Tuple[Dict[str, List[str]], str]:
    """``pytest <page's file> --mgpu-fallback=cpu`` in a clean environment, in ``folder``: per test
    function, what went wrong with each of its cases (a failure, an error, a skip); and the output."""
    slug = re.sub(r"\W+", "_", page.relative_to(ROOT).with_suffix("").as_posix().removeprefix("docs/")).lower()
    path = folder / f"test_{slug}.py"
    path.write_text("\n\n".join(blocks), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_CORE_"))}
    cmd = [sys.executable, "-m", "pytest", path.name, "--mgpu-fallback=cpu", "-p", "no:cacheprovider",
           "--junitxml=junit.xml", "-q"]
    try:
        done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=PAGE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return {}, f"`{' '.join(cmd[2:])}` ran past {PAGE_TIMEOUT_S} s:\n{exc.stdout or ''}"
    output = f"`pytest {path.name} --mgpu-fallback=cpu` (exit {done.returncode}):\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
    outcomes: Dict[str, List[str]] = {}
    if not (folder / "junit.xml").is_file():
        return outcomes, output
    for case in ElementTree.parse(folder / "junit.xml").iter("testcase"):
        name = case.get("name", "").split("[")[0]
        problems = outcomes.setdefault(name, [])
        for child in case:
            if child.tag in ("failure", "error", "skipped"):  # a docs example that skips tests nothing
                problems.append(f"{case.get('name')}: {child.tag}: {child.get('message', '')}\n{child.text or ''}")
    return outcomes, output


def _defined(source: str) -> List[str]:
    """The functions and classes a block defines at the top level."""
    return [node.name for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def _remove_page(namespace: dict) -> None:
    if "page_dir" in namespace:
        shutil.rmtree(namespace["page_dir"], ignore_errors=True)
