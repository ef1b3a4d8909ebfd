"""Root conftest: pytest-mgpu itself loads through its pytest11 entry point, not from here.

Only project-wide collection rules live here, among them the docs tester: ``python -m pytest
README.md docs/`` collects every ```python block of README.md and of the pages under docs/ with
Sybil (docs/design/docs-tester.md says why Sybil, and how a page runs). Each page's blocks are
copied, in order, into one test file, as a reader would copy them; a block that defines tests runs
them with ``pytest --mgpu-fallback=cpu`` on the file as it stands after that block. Output-only
blocks are fenced ```text or ```console and are not run.
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

collect_ignore = ["benchmarks", "build"]

ROOT = Path(__file__).resolve().parent
PAGE_TIMEOUT_S = 600  # one block's tests; a hang fails the block instead of the whole run
_sybil_hook = None


def pytest_collect_file(file_path, parent):
    """README.md and docs/**/*.md: their Python blocks (Sybil, imported only when a page is collected,
    so that a run of suites/ or tests/ needs no docs tester installed)."""
    global _sybil_hook
    if file_path.suffix != ".md" or not (file_path == ROOT / "README.md" or ROOT / "docs" in file_path.parents):
        return None
    if _sybil_hook is None:
        from sybil import Sybil
        from sybil.evaluators.python import PythonEvaluator
        from sybil.parsers.markdown import CodeBlockParser, SkipParser

        class PageBlocks(CodeBlockParser):
            language = "python"

            def evaluate(self, example):
                PythonEvaluator()(example)  # here first: a module-level error names the block's own line
                return run_block(example.namespace, Path(example.path), str(example.parsed))

        _sybil_hook = Sybil(parsers=[SkipParser(), PageBlocks()], patterns=["*.md"],
                            teardown=_remove_page).pytest()
    return _sybil_hook(file_path, parent)


def run_block(namespace: dict, page: Path, source: str):
    """Append the block to the page's test file and run the tests it defines, in a fresh pytest (the
    ranks import the functions they run from that file). Returns pytest's output when they fail (Sybil
    reports it at the block's line), None when they pass or the block defines none."""
    if "page_dir" not in namespace:
        namespace["page_dir"] = tempfile.mkdtemp(prefix="mgpu-docs-")
        namespace["blocks"] = []
    namespace["blocks"].append(source)
    slug = re.sub(r"\W+", "_", page.relative_to(ROOT).with_suffix("").as_posix().removeprefix("docs/")).lower()
    path = Path(namespace["page_dir"]) / f"test_{slug}.py"
    path.write_text("\n\n".join(namespace["blocks"]), encoding="utf-8")
    tests = [node.name for node in ast.parse(source).body
             if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name.lower().startswith("test")]
    if not tests:
        return None
    args = [f"{path.name}::{name}" for name in tests]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_CORE_"))}
    cmd = [sys.executable, "-m", "pytest", *args, "--mgpu-fallback=cpu", "-p", "no:cacheprovider", "-q"]
    try:
        done = subprocess.run(cmd, cwd=path.parent, env=env, capture_output=True, text=True,
                              timeout=PAGE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return f"`{' '.join(cmd[2:])}` ran past {PAGE_TIMEOUT_S} s:\n{exc.stdout or ''}"
    if done.returncode != 0:
        return (f"`pytest {' '.join(args)} --mgpu-fallback=cpu` on the page's blocks so far "
                f"(exit {done.returncode}):\n{done.stdout[-6000:]}{done.stderr[-2000:]}")
    return None


def _remove_page(namespace: dict) -> None:
    if "page_dir" in namespace:
        shutil.rmtree(namespace["page_dir"], ignore_errors=True)
