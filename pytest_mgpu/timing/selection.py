"""Which tests time: ``--mgpu-benchmarks=only|skip`` and the ``mgpu_benchmark`` marker, as
pytest-benchmark's ``--benchmark-only`` / ``--benchmark-skip`` select the tests that use its fixture.

``dist.benchmark`` is a method of the ``dist`` fixture, so no fixture name tells a timing test apart.
A test is one where it carries ``@pytest.mark.mgpu_benchmark``, or where its own body (nested
functions included) calls ``.benchmark`` and it takes ``dist``: read from the function's compiled code,
never run. A test that times through a helper of its own needs the marker.
"""
from __future__ import annotations

from types import CodeType
from typing import List, Tuple

from ..markers import BENCHMARK


def calls_benchmark(code: CodeType) -> bool:
    """Whether ``code`` (or a function or lambda defined in it) reads an attribute named ``benchmark``."""
    if "benchmark" in code.co_names:
        return True
    return any(isinstance(c, CodeType) and calls_benchmark(c) for c in code.co_consts)


def is_timing_test(item) -> bool:
    if item.get_closest_marker(BENCHMARK) is not None:
        return True
    code = getattr(getattr(item, "function", None), "__code__", None)
    return "dist" in getattr(item, "fixturenames", ()) and code is not None and calls_benchmark(code)


def mark_timing_tests(items) -> None:
    """Give every timing test the ``mgpu_benchmark`` marker, so that ``-m mgpu_benchmark`` selects it."""
    import pytest

    for item in items:
        if item.get_closest_marker(BENCHMARK) is None and is_timing_test(item):
            item.add_marker(getattr(pytest.mark, BENCHMARK))


def select(items, selection: str) -> Tuple[List, List]:
    """(kept, deselected) under ``--mgpu-benchmarks=selection``: ``only`` keeps the timing tests,
    ``skip`` the others, ``all`` every test."""
    if selection == "all":
        return list(items), []
    keep_timing = selection == "only"
    kept = [i for i in items if is_timing_test(i) == keep_timing]
    return kept, [i for i in items if is_timing_test(i) != keep_timing]
