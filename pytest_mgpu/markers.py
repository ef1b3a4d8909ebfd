"""The ``gpuN`` markers, and the helper that parametrizes one test over several world sizes."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable, List, Literal, Optional, Tuple, get_args

if TYPE_CHECKING:
    import pytest

WORLD_SIZES = (1, 2, 4, 8, 16)
MARKERS = {f"gpu{n}": n for n in WORLD_SIZES}
_GPU_NAME = re.compile(r"\bgpu(\d+)\b")
KNOWN = ", ".join(MARKERS)


class MarkerError(ValueError):
    """The gpuN markers on a test do not say one clear world size."""


ISOLATE = "mgpu_isolate"
TIMEOUT = "mgpu_timeout"
SIMULATE = "simulate"
BENCHMARK = "mgpu_benchmark"
STRUCTURE = "mgpu_structure"
BODY_IN_RANKS = "mgpu_body_in_ranks"
# Where a test's body runs: in the pytest process ("test", calling dist.run), or in every rank.
Body = Literal["test", "ranks"]


def marker_help() -> List[str]:
    return [
        f"gpu{n}: the test needs {n} device(s); runs on {n} rank(s) through the `dist` fixture"
        for n in WORLD_SIZES
    ] + [f"{ISOLATE}: give this test fresh rank processes instead of warm (reused) ones",
         f"{TIMEOUT}(seconds): this test's limit per dist call (dist.run(timeout=) beats it; it beats "
         "--mgpu-timeout and ini mgpu_timeout)",
         f"{SIMULATE}: a test of the simulated tier (pytest_mgpu.simulate: fake process groups of any "
         "world size, no devices); `-m simulate` selects these tests, `-m 'not simulate'` keeps them out",
         f"{BENCHMARK}: a timing test (dist.benchmark); given to every test that calls dist.benchmark in its own "
         f"body. `-m {BENCHMARK}` or --mgpu-benchmarks=only selects these, --mgpu-benchmarks=skip leaves them out",
         f"{STRUCTURE}(False): this test's calls are neither judged against nor recorded as structure goldens",
         f"{BODY_IN_RANKS}: the test function itself runs in every rank (set by world_sizes(..., body=\"ranks\"))"]


def marker_timeout(item) -> Optional[Tuple[float, str]]:
    """The limit of the test's ``mgpu_timeout`` marker and where it came from; None without one;
    ``MarkerError`` when it is malformed. Read alike for ``dist`` and ``simulate`` calls."""
    marker = item.get_closest_marker(TIMEOUT)
    if marker is None:
        return None
    where = f"@pytest.mark.{TIMEOUT}"
    if len(marker.args) != 1 or marker.kwargs:
        raise MarkerError(f"{where} takes one number of seconds, e.g. {where}(60)")
    from .settings import SettingsError, validate_timeout

    try:
        seconds = validate_timeout(marker.args[0], where, text_ok=False)
    except SettingsError as exc:
        raise MarkerError(str(exc)) from None
    return seconds, f"{where}({marker.args[0]!r})"


def _mark(n: int):
    import pytest

    if n not in MARKERS.values():
        raise MarkerError(
            f"world size {n!r} has no marker: pytest-mgpu knows {', '.join(map(str, WORLD_SIZES))} "
            f"(markers {', '.join('gpu%d' % n for n in WORLD_SIZES)})"
        )
    return getattr(pytest.mark, f"gpu{n}")


def world_sizes(*sizes: int, body: Body = "test") -> Any:
    """Parametrize a test that uses ``dist`` over world sizes: ``@world_sizes(1, 2, 4)`` makes three
    tests, ids ``[gpu1]``, ``[gpu2]``, ``[gpu4]``, each carrying its ``gpuN`` marker, so ``-m gpu2``
    selects the 2-rank one.

    Args:
        *sizes: The world sizes, each from 1 to 16, none twice.
        body: Where the test function runs. ``"test"``: in the pytest process, calling ``dist.run``
            with the functions the ranks run. ``"ranks"``: the test function itself runs in each
            rank, with the default process group up (it takes no ``dist``; its fixtures must pickle,
            e.g. ``tmp_path`` and parametrize values); a failing ``assert`` names its rank.

    Returns:
        ``pytest.mark.parametrize`` of the ``dist`` fixture; with ``body="ranks"`` a decorator that
        also marks the test ``mgpu_body_in_ranks``.
    """
    import pytest

    if not sizes:
        raise MarkerError("world_sizes() needs at least one world size, e.g. world_sizes(1, 2, 4)")
    if len(set(sizes)) != len(sizes):
        raise MarkerError(f"world_sizes{sizes} repeats a world size")
    if body not in get_args(Body):
        raise MarkerError(f"world_sizes(body={body!r}): body is \"test\" (the default: the test calls dist.run) "
                          "or \"ranks\" (the test function itself runs in every rank)")
    params = [pytest.param(n, marks=_mark(n), id=f"gpu{n}") for n in sizes]
    sized = pytest.mark.parametrize("dist", params, indirect=True)
    if body == "test":
        return sized
    marks = (sized, pytest.mark.usefixtures("dist"), getattr(pytest.mark, BODY_IN_RANKS))

    def in_ranks(test):
        for mark in marks:
            test = mark(test)
        return test

    return in_ranks


def unknown_sizes(text: str, registered: Iterable[str] = ()) -> List[str]:
    """The ``gpuN`` names in ``text`` (marker names, a ``-m`` expression) that are not a known size
    (nor a marker the project registered itself): ``gpu3`` would otherwise read as "no gpuN marker",
    and ``-m gpu3`` deselect every test silently."""
    known = set(MARKERS) | set(registered)
    return sorted({m.group(0) for m in _GPU_NAME.finditer(text) if m.group(0) not in known})


def unknown_size_error(text: str, where: str, registered: Iterable[str] = ()) -> Optional[str]:
    unknown = unknown_sizes(text, registered)
    if not unknown:
        return None
    return (f"{where}: {', '.join(unknown)} is not a world size pytest-mgpu knows; its markers are "
            f"{KNOWN}")


def world_size_of(marker_names: Iterable[str]) -> Optional[int]:
    """The world size that a test's markers ask for; None if none; MarkerError if they conflict."""
    found = sorted({MARKERS[m] for m in marker_names if m in MARKERS})
    if not found:
        return None
    if len(found) > 1:
        raise MarkerError(
            "conflicting markers " + ", ".join(f"gpu{n}" for n in found)
            + ": a test runs at one world size. Keep one marker, or use "
            "pytest_mgpu.world_sizes(...) to run the test once per size"
        )
    return found[0]
