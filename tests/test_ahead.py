"""The lane of tests/ahead.py: the work a selected test needs runs in the background, in the tests'
order, once; the fixture takes its result, its error (a skip too) or does it itself; cleanup runs when
the fixture ends, or at the session's end for work no test took; nothing starts once it is closed."""
import threading
from types import SimpleNamespace

import pytest

from tests import ahead as A

GATE = threading.Event()
DONE: list = []


def _item(*fixtures):
    return SimpleNamespace(fixturenames=fixtures, module=SimpleNamespace(__name__=__name__))


@A.ahead("first_value")
def first_work(factory):
    DONE.append(("first", threading.current_thread().name))
    yield factory + 1
    DONE.append("first cleaned")


@A.ahead("second_value")
def second_work(factory):
    GATE.wait(30)
    DONE.append(("second", threading.current_thread().name))
    return factory * 10


@A.ahead("skipped_value")
def skipped_work(factory):
    pytest.skip("nothing to run here")


@A.ahead("unused_value")
def unused_work(factory):
    yield "never asked for"
    DONE.append("unused cleaned")


@pytest.fixture(autouse=True)
def fresh():
    DONE.clear()
    GATE.clear()
    for entry in list(A.REGISTERED.values()):
        if entry.fn.__module__ == __name__:
            A.REGISTERED[entry.fn] = A.Ahead(entry.fn, entry.fixture)


def test_work_runs_ahead_in_order_once_and_is_cleaned_up_when_taken():
    lane = A.Lane(3, [_item("second_value"), _item("first_value"), _item("other")])
    assert [e.fn for e in lane.queue] == [second_work, first_work]
    GATE.set()
    lane.thread.join(30)
    assert DONE == [("second", "tests-ahead"), ("first", "tests-ahead")]
    taken = lane.take(first_work)
    assert next(taken) == 4 and "first cleaned" not in DONE
    with pytest.raises(StopIteration):
        next(taken)
    assert DONE[-1] == "first cleaned"
    assert next(lane.take(second_work)) == 30
    lane.close(kill=lambda: None)
    assert DONE.count(("first", "tests-ahead")) == 1


def test_work_the_lane_has_not_reached_is_done_by_the_fixture():
    lane = A.Lane(3, [_item("second_value"), _item("first_value")])  # the lane waits in second_work
    assert next(lane.take(first_work)) == 4
    assert ("first", threading.current_thread().name) in DONE
    GATE.set()
    lane.thread.join(30)
    assert DONE.count(("first", threading.current_thread().name)) == 1 and ("first", "tests-ahead") not in DONE
    lane.close(kill=lambda: None)


def test_a_skip_reaches_the_fixture_and_unused_work_is_cleaned_at_the_end():
    lane = A.Lane(0, [_item("skipped_value"), _item("unused_value")])
    lane.thread.join(30)
    with pytest.raises(pytest.skip.Exception, match="nothing to run here"):
        next(lane.take(skipped_work))
    assert "unused cleaned" not in DONE
    lane.close(kill=lambda: None)
    assert DONE == ["unused cleaned"]


def test_nothing_starts_once_closed_and_running_work_is_killed():
    killed = []
    lane = A.Lane(1, [_item("second_value"), _item("first_value")])
    lane.close(kill=lambda: (killed.append(True), GATE.set()))
    assert killed == [True] and not lane.thread.is_alive()
    assert ("first", "tests-ahead") not in DONE


def test_off_or_not_selected_starts_nothing():
    assert not A.Lane(0, [_item("first_value")], enabled=False).queue
    assert not A.Lane(0, [SimpleNamespace(fixturenames=("first_value",),
                                          module=SimpleNamespace(__name__="another"))]).queue
