"""Root conftest: pytest-mgpu itself loads through its pytest11 entry point, not from here.

Only project-wide collection rules live here, among them the docs tester: ``python -m pytest
README.md docs/`` collects every ```python block of README.md and of the pages under docs/ with
Sybil (docs/design/docs-tester.md says why Sybil, and how a page runs). Each block runs alone, as a
reader who pastes it into a file of its own would run it, unless the line before its fence is
``<!-- continues -->``: then it continues the block before it, in the same file. One
``pytest --mgpu-fallback=cpu`` per page runs those files; each block that defines tests passes or
fails with them. Output-only blocks are fenced ```text or
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
                chunks = _chunks(example.document)
                index = next(i for i, chunk in enumerate(chunks) if any(r is example.region for r in chunk))
                page_namespace = example.namespace
                example.namespace = page_namespace.setdefault("chunk_namespaces", {}).setdefault(index, {})
                try:  # here first: a module-level error names the block's own line
                    PythonEvaluator()(example)
                finally:
                    example.namespace = page_namespace
                sources = [[str(region.parsed) for region in chunk] for chunk in chunks]
                return run_block(page_namespace, Path(example.path), sources, index, str(example.parsed))

        _sybil_hook = Sybil(parsers=[PageBlocks()], patterns=["*.md"],
                            teardown=_remove_page).pytest()
    return _sybil_hook(file_path, parent)


CONTINUES = "<!-- continues -->"


def _chunks(document) -> list:
    """The page's Python blocks grouped as a reader runs them: each block alone, unless the line
    before its fence is ``<!-- continues -->``: then it continues the block before it."""
    chunks: list = []
    for _, region in document.regions:
        before = document.text[:region.start].rstrip()
        if chunks and before.endswith(CONTINUES):
            chunks[-1].append(region)
        else:
            chunks.append([region])
    return chunks


def run_block(namespace: dict, page: Path, chunks: List[List[str]], index: int, source: str) -> Optional[str]:
    """The verdict on the tests this block defines: what pytest said of them (Sybil reports it at the
    block's line), or None when they passed or it defines none. The page runs once, at its first block
    with tests: each chunk of blocks (a block and the blocks that continue it) is a test file of its
    own, all in one folder, and one pytest runs them (the ranks import their functions from them)."""
    chunk = chunks[index]
    again = sorted(set(_defined(source)) & {name for block in chunk if block != source for name in _defined(block)})
    if again:
        return (f"another block that this one continues (or that continues it) defines {', '.join(again)} too: "
                "in the reader's file the last one wins; give each its own name")
    tests = [name for name in _defined(source) if name.lower().startswith("test")]
    if not tests:
        return None
    if "outcomes" not in namespace:
        namespace["page_dir"] = tempfile.mkdtemp(prefix="mgpu-docs-")
        namespace["outcomes"], namespace["output"] = _run_page(Path(namespace["page_dir"]), page, chunks)
    outcomes: Dict[Tuple[str, str], List[str]] = namespace["outcomes"]
    module = _module_name(page, index)
    missing = [name for name in tests if (module, name) not in outcomes]
    if missing:
        return f"pytest ran no {', '.join(missing)} (in {module}.py):\n{namespace['output']}"
    bad = [line for name in tests for line in outcomes[(module, name)]]
    return "\n\n".join(bad) or None


def _module_name(page: Path, index: int) -> str:
    slug = re.sub(r"\W+", "_", page.relative_to(ROOT).with_suffix("").as_posix().removeprefix("docs/")).lower()
    return f"test_{slug}_{index + 1}"


def _run_page(folder: Path, page: Path, chunks: List[List[str]]) -> Tuple[Dict[Tuple[str, str], List[str]], str]:
    """``pytest <the page's files> --mgpu-fallback=cpu`` in a clean environment, in ``folder``: per
    (module, test function), what went wrong with each of its cases (a failure, an error, a skip); and
    the output. Only chunks that define tests are written; a file that fails to import fails its own
    tests, not the others'."""
    names = []
    for i, chunk in enumerate(chunks):
        if any(name.lower().startswith("test") for block in chunk for name in _defined(block)):
            names.append(f"{_module_name(page, i)}.py")
            (folder / names[-1]).write_text("\n\n".join(chunk), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_CORE_"))}
    cmd = [sys.executable, "-m", "pytest", *names, "--mgpu-fallback=cpu", "-p", "no:cacheprovider",
           "--continue-on-collection-errors", "--junitxml=junit.xml", "-q"]
    shown = f"pytest {page.name}'s {len(names)} file(s) --mgpu-fallback=cpu"
    try:
        done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=PAGE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return {}, f"`{shown}` ran past {PAGE_TIMEOUT_S} s:\n{exc.stdout or ''}"
    output = f"`{shown}` (exit {done.returncode}):\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
    outcomes: Dict[Tuple[str, str], List[str]] = {}
    if not (folder / "junit.xml").is_file():
        return outcomes, output
    for case in ElementTree.parse(folder / "junit.xml").iter("testcase"):
        key = (case.get("classname", "").split(".")[0], case.get("name", "").split("[")[0])
        problems = outcomes.setdefault(key, [])
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
