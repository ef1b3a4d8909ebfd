"""The test body in every rank (``world_sizes(..., body="ranks")``): the test function itself runs in
each of the test's ranks, with the default process group up, instead of in the pytest process.

The function travels by value (cloudpickle keeps its code object, so the ``assert`` statements that
pytest rewrote when it collected the module explain themselves in the ranks too); its fixture values
travel pickled, each refused by name when it cannot. A failing rank is reported as ``dist.run``
reports one: ``RankFailure``, naming the rank, with its traceback.
"""
from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from .launch.byvalue import BadCallError


class BodyError(BadCallError):
    """A test whose body runs in the ranks asked for something that cannot reach them."""


def rank_body(test: Callable[..., Any], funcargs: Mapping[str, Any], nodeid: str) -> Callable[[], Any]:
    """What each rank calls: a by-value copy of ``test`` (a plain function or a test class's method)
    with its arguments bound from ``funcargs``. ``BodyError`` names a fixture that cannot travel."""
    fn: Any = test
    bound: Optional[object] = None
    if isinstance(test, types.MethodType):
        fn, bound = test.__func__, test.__self__
    names = [p.name for p in inspect.signature(test).parameters.values()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if "dist" in names:
        raise BodyError(
            f"{nodeid}: a test whose body runs in the ranks cannot take the `dist` fixture: it is "
            "inside a rank already. Use torch.distributed directly (the default group is up) and "
            "pytest_mgpu.rank_device() / rank_context() for this rank's device; or drop body=\"ranks\" "
            "and call dist.run from the test.")
    kwargs = {name: funcargs[name] for name in names if name in funcargs}
    _check_fixtures(kwargs, nodeid)
    copy = _detached(fn)
    if bound is not None:
        return functools.partial(copy, bound, **kwargs)
    return functools.partial(copy, **kwargs)


def _detached(fn: types.FunctionType) -> types.FunctionType:
    """A copy of ``fn`` that its module does not name, so it is pickled by value (code object, closure,
    defaults), without its marks (``pytestmark``: pytest objects stay in the pytest process)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    copy.__module__ = fn.__module__
    return copy


def _check_fixtures(kwargs: Dict[str, Any], nodeid: str) -> None:
    import cloudpickle

    for name, value in kwargs.items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            raise BodyError(
                f"{nodeid}: the fixture `{name}` ({type(value).__module__}.{type(value).__qualname__}) "
                f"cannot be sent to the ranks ({type(exc).__name__}: {exc}). A test whose body runs in "
                "the ranks takes fixtures that pickle (tmp_path, parametrize values, plain data); build "
                "the rest inside the test, or drop body=\"ranks\" and call dist.run from the test."
            ) from None


SKIPPED = ("raised Skipped: ", "raised _pytest.outcomes.Skipped: ")


def skip_reason(summaries: Sequence[str]) -> Optional[str]:
    """The reason when every failing rank called ``pytest.skip`` (the test skips, as it would in one
    process); None when any rank failed otherwise."""
    if not summaries or not all(s.startswith(SKIPPED) for s in summaries):
        return None
    return summaries[0].split(": ", 1)[1]
