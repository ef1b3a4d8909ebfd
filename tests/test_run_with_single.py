"""``dist.run_with_single``: the ranks' call and the one process's call at once on warm CPU ranks
(``assert_same_training`` runs its reference so), the ranks' failure first, nothing left waiting."""
import os
import time

import pytest

from pytest_mgpu import RankFailure

WAIT_S = 20.0  # a call waiting for the other's file longer than this ran alone: the two were not at once


def _meet(folder: str, mine: str, theirs: str) -> int:
    """Write ``mine``, then wait for ``theirs``: returns only where the other call runs at the same time."""
    open(os.path.join(folder, mine), "w").close()
    end = time.monotonic() + WAIT_S
    while not os.path.exists(os.path.join(folder, theirs)):
        if time.monotonic() > end:
            raise TimeoutError(f"{theirs} never appeared: the other call did not run at the same time")
        time.sleep(0.01)
    return os.getpid()


def _rank_meets(folder: str) -> int:
    from pytest_mgpu import rank_context

    return _meet(folder, f"rank{rank_context().rank}", "single")


def _raises(folder: str) -> None:
    raise ValueError("the ranks' own error")


def _raises_once_single_runs(folder: str) -> None:
    _meet(folder, "ranks", "single")
    _raises(folder)


def _blocks(folder: str) -> None:
    """Writes its process id, then waits for a file nobody writes (a bounded wait: its call is not the one
    under test)."""
    with open(os.path.join(folder, "single.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(folder, "single.tmp"), os.path.join(folder, "single"))
    _meet(folder, "blocked", "never")


@pytest.mark.gpu2
def test_both_calls_run_at_once_and_return_their_values(dist, tmp_path):
    ranks, single = dist.run_with_single(_rank_meets, (str(tmp_path),), _meet,
                                         (str(tmp_path), "single", "rank1"), timeout=60)
    assert len(ranks) == 2 and single not in ranks
    assert [c.world_size for c in dist.calls[-2:]] == [2, 1]  # both recorded, the ranks first


@pytest.mark.gpu2
def test_the_ranks_failure_is_raised_and_the_waiting_call_is_ended(dist, tmp_path):
    with pytest.raises(RankFailure, match="the ranks' own error"):  # raised once the single call runs
        dist.run_with_single(_raises_once_single_runs, (str(tmp_path),), _blocks, (str(tmp_path),), timeout=60)
    blocked = int((tmp_path / "single").read_text())
    assert _ended(blocked), "its process was ended (killed), not waited for: it would block for 60 s"
    ranks, single = dist.run_with_single(os.getpid, (), os.getpid, ())  # and replaced
    assert single not in ranks and single != blocked


def _ended(pid: int, within: float = 10.0) -> bool:
    """The process is gone or a zombie (dead, its exit not yet collected by its parent, the forkserver)
    within ``within`` seconds: a SIGKILL is delivered at once, and the exit is then told apart."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.gpu1
def test_one_rank_is_the_one_process_each_call_gets_its_own_value(dist):
    ranks, single = dist.run_with_single(os.getpid, (), os.getcwd, ())
    assert isinstance(ranks[0], int) and single == os.getcwd()


@pytest.mark.gpu2
def test_the_single_call_s_failure_names_its_one_process(dist, tmp_path):
    with pytest.raises(RankFailure, match=r"(?s)1 rank\(s\).*the ranks' own error"):
        dist.run_with_single(os.getpid, (), _raises, (str(tmp_path),))
