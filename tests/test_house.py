"""The house rules that code review keeps forgetting: data flows one way (no import circles, lazy
imports inside functions included), no private name is imported from another module, and no module
or function grows past what a reader holds at once (~400 and ~60 lines).

    python tests/test_house.py        # prints the import graph and the module sizes
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_mgpu"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(importer: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports() -> Dict[str, Set[Tuple[str, str]]]:
    """module -> {(imported module, name)} for every import of the package's own modules, at any
    depth of the code (a lazy import inside a function still makes a circle)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: Dict[str, Set[Tuple[str, str]]] = {m: set() for m in modules}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("pytest_mgpu"):
                        graph[mod].add((alias.name, ""))
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(mod, path.name == "__init__.py", node)
                if not target.startswith("pytest_mgpu"):
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    graph[mod].add((sub, "") if sub in modules else (target, alias.name))
    return graph


def _edges(graph) -> Dict[str, Set[str]]:
    """Module-to-module edges; importing a package's __init__ is an edge to it only, so a module
    that imports its sibling through the package is not mistaken for a circle with the package."""
    return {m: {t for t, _ in targets if t in graph and t != m} for m, targets in graph.items()}


def cycles(graph) -> List[List[str]]:
    """Every elementary circle found by a depth-first search (one representative per circle)."""
    edges = _edges(graph)
    found, seen = [], set()

    def visit(node, stack, on_stack):
        for nxt in sorted(edges[node]):
            if nxt in on_stack:
                cycle = stack[stack.index(nxt):]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    found.append(cycle + [nxt])
            elif len(stack) < 12:
                visit(nxt, stack + [nxt], on_stack | {nxt})

    for start in sorted(edges):
        visit(start, [start], {start})
    return found


def test_no_import_circles():
    found = cycles(imports())
    assert not found, "import circles (data must flow one way):\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_private_name_is_imported_from_another_module():
    private = sorted(f"{mod} imports {name} from {target}" for mod, targets in imports().items()
                     for target, name in targets if name.startswith("_") and not name.startswith("__"))
    assert not private, "make these public where they are shared, or keep them in one module:\n" + "\n".join(private)


MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 65  # ~60 of code, plus a signature and a docstring that wrap


def too_long() -> List[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{_module_name(path)}: {len(text.splitlines())} lines (split it by role)")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    found.append(f"{_module_name(path)}.{node.name}: {n} lines")
    return found


def test_no_module_or_function_too_long():
    found = too_long()
    assert not found, (f"over {MAX_MODULE_LINES} lines a module, {MAX_FUNCTION_LINES} a function:\n"
                       + "\n".join(found))


def main() -> None:
    graph = imports()
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    for mod in sorted(graph):
        lines = len(paths[mod].read_text().splitlines())
        deps = sorted({t.replace("pytest_mgpu.", "") for t in _edges(graph)[mod]})
        print(f"{mod:40s} {lines:4d} lines  -> {', '.join(deps) or '-'}")
    found = cycles(graph)
    print(f"\n{len(found)} import circle(s)" + "".join(f"\n  {' -> '.join(c)}" for c in found))


if __name__ == "__main__":
    sys.exit(main())
