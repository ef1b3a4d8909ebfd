"""What a warm call's cheap path must still give: each call's own output (also when it fails, and
when the call pointed its stdout elsewhere), the test process's environment and sys.path whatever the
call before changed, the same draws for the same seed, and a garbage-free start."""
import os
import random
import sys

import pytest

from pytest_mgpu import world_sizes
from pytest_mgpu.launch.errors import RankFailure


def _say(text):
    if text:
        print(text)
    return os.getpid()


def _say_then_raise():
    print("said before raising")
    raise ValueError("raised after printing")


@world_sizes(2)
def test_each_call_shows_its_own_output_only(dist, capsys):
    first = dist.run(_say, "first-call-line")
    assert "[rank 0] first-call-line" in capsys.readouterr().out
    assert dist.run(_say, "") == first  # the same warm ranks
    assert "first-call-line" not in capsys.readouterr().out, "an earlier call's output came back"
    dist.run(_say, "third-call-line")
    out = capsys.readouterr().out
    assert "[rank 1] third-call-line" in out and "first-call-line" not in out


@world_sizes(2)
def test_a_failed_warm_call_keeps_its_output(dist, capsys):
    dist.run(_say, "")  # warm ranks up: the failure below is a warm call's
    with pytest.raises(RankFailure) as info:
        dist.run(_say_then_raise)
    assert "said before raising" in info.value.logs[0]
    assert "[rank 1] said before raising" in capsys.readouterr().out


def _point_stdout_at(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, b"the call's own file\n")
    os.dup2(fd, 1)  # left so: the next call must not truncate or write into this file
    os.close(fd)


@world_sizes(1)
def test_a_call_that_moved_its_stdout_leaves_the_next_calls_output_alone(dist, tmp_path, capsys):
    own = tmp_path / "own.txt"
    dist.run(_point_stdout_at, str(own))
    dist.run(_say, "after-the-move")
    assert "[rank 0] after-the-move" in capsys.readouterr().out
    assert own.read_text() == "the call's own file\n"


def _environment():
    return dict(os.environ), list(sys.path)


def _change_environment():
    os.environ["WARM_CALL_ADDED"] = "1"
    os.environ["PATH"] = "/changed"
    os.environ.pop("HOME", None)
    sys.path.insert(0, "/warm-call-added")
    sys.path.pop()


@world_sizes(2)
def test_environment_and_sys_path_are_the_test_processs_after_any_call(dist):
    before = dist.run(_environment)
    dist.run(_change_environment)
    assert dist.run(_environment) == before
    assert before[0][0]["PATH"] != "/changed" and before[0][1] == sys.path


def _draw():
    import torch

    return torch.rand(2).tolist(), random.random()


@world_sizes(2)
def test_the_same_seed_draws_the_same_in_every_call(dist):
    first = dist.run(_draw)
    assert dist.run(_draw) == first
    dist.seed += 1
    other = dist.run(_draw)
    assert other != first
    dist.seed -= 1
    assert dist.run(_draw) == first


class _Cycle:
    def __init__(self):
        self.me = self  # a reference cycle: only a collection frees it


_LEFT = []  # weak references to what a call dropped


def _leave_garbage():
    import weakref

    for _ in range(3):
        _LEFT.append(weakref.ref(_Cycle()))
    return sum(ref() is not None for ref in _LEFT)


def _count_garbage():
    return sum(ref() is not None for ref in _LEFT)


@world_sizes(2)
def test_garbage_of_a_call_is_collected_before_the_next(dist):
    assert dist.run(_leave_garbage) == [3, 3]
    assert dist.run(_count_garbage) == [0, 0], "a call's garbage outlived it (or was frozen with the heap)"


def _progress_bar():
    import threading

    from tqdm import tqdm

    for _ in tqdm(range(3), mininterval=0):  # the first bar in a process starts tqdm's monitor thread
        pass
    return [t.name for t in threading.enumerate()]


@world_sizes(2)
def test_tqdm_monitor_is_not_reported_as_a_leftover_thread(dist):
    """tqdm keeps one silent monitor thread per process for every later bar: not the call's leftover."""
    import warnings

    from pytest_mgpu.launch.errors import RankLeftoverWarning

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        names = dist.run(_progress_bar)
    assert "tqdm_monitor" in names[0], names
    assert not [w for w in seen if issubclass(w.category, RankLeftoverWarning)], [str(w.message) for w in seen]
