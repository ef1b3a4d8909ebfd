"""``assert_same_training``'s optimizer options, judged after its tensors (``judge.options``): a run
that passed on its tensors fails where an option differs."""
from __future__ import annotations

from typing import Any, Callable

from .judge.options import OptionsRule, check_rule, differences
from .report import ParityError
from .training import assert_same_training


def same_training(dist, fn, reference_fn, *args, optimizer_options: Any = "same", **kwargs) -> Any:
    """``assert_same_training`` with the optimizers' options judged by ``optimizer_options``."""
    __tracebackhide__ = True
    rule = check_rule(optimizer_options)

    def call() -> Any:
        __tracebackhide__ = True
        return assert_same_training(dist, fn, reference_fn, *args, **kwargs)

    return judged(call, rule)


def judged(call: Callable[[], Any], rule: OptionsRule) -> Any:
    """``call()`` (an ``assert_same_training``), then the options: a report that passed on its tensors
    fails where an option differs (``ParityError``, its message led by the option); a failure's message
    is built again with them (its first line names them too), where it is the report's own."""
    __tracebackhide__ = True
    try:
        report = call()
    except ParityError as exc:
        failed = exc.report
        if failed is None:
            raise
        failed.option_differences = differences(failed.facts, rule)
        head = str(exc).split("\n", 1)[0]
        if failed.option_differences and " diverges from one device at step " in head:  # its own message
            raise ParityError(failed.failure_message(), failed) from None
        raise
    report.option_differences = differences(report.facts, rule)
    if report.option_differences:
        raise ParityError(report.failure_message(), report)
    return report
