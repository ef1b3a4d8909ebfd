"""The rules behind the verdicts, on synthetic records: which collective the ranks first disagree on,
what an unfinished rank was doing, and which setting a slow call is told to raise. The same rules run on
real ranks in test_verdicts.py."""
import pytest

from pytest_mgpu.launch.desync import Trace, first_disagreement
from pytest_mgpu.launch.errors import RankProblem, raise_limit, ranks_words, timeout_hint
from pytest_mgpu.launch.flight import RECORDER_ENV, Collective, Evidence, recorder_env
from pytest_mgpu.launch.unfinished import ADVANCING, classify


def rec(*ops, group=0, name="", last_sizes=((4,),), pending_last=True, backend="gloo", age=0.0):
    """A rank's record: collectives #1.. with these names (of 4 numbers; the last of ``last_sizes``),
    the last one unfinished."""
    n = len(ops)
    return Trace([Collective(group, name, i + 1, op, last_sizes if i == n - 1 else ((4,),), ("Float",),
                             done=not (pending_last and i == n - 1), backend=backend, age_s=age)
                  for i, op in enumerate(ops)])


AR3 = ("all_reduce",) * 3


def test_another_collective_is_named_with_the_minority_first():
    traces = {r: rec(*AR3, "broadcast" if r == 1 else "all_gather") for r in range(4)}
    assert first_disagreement(traces) == "collective #4: rank 1 entered broadcast, ranks 0, 2, 3 entered all_gather"


def test_a_collective_never_reached_names_the_last_one_the_rank_entered():
    traces = {r: rec(*("all_reduce",) * 7) for r in range(3)}
    traces[3] = Trace(last={0: 6})  # it returned: only its count came back
    assert first_disagreement(traces) == (
        "rank 3 never reached collective #7 (all_reduce) that ranks 0-2 entered; its last was #6")


def test_a_rank_that_entered_none():
    traces = {0: Trace([]), 1: rec("barrier"), 2: rec("barrier")}
    assert first_disagreement(traces) == (
        "rank 0 never reached collective #1 (barrier) that ranks 1, 2 entered; it entered none in this call")


def test_other_sizes_of_the_same_collective():
    traces = {r: rec(*AR3, "all_reduce", last_sizes=((3,),) if r == 2 else ((4,),)) for r in range(4)}
    assert first_disagreement(traces) == (
        "collective #4: rank 2 entered all_reduce with sizes [[3]], ranks 0, 1, 3 entered all_reduce with sizes [[4]]")


def test_the_first_disagreement_wins_and_agreement_says_nothing():
    traces = {0: rec("broadcast", "all_gather"), 1: rec("all_reduce", "barrier")}
    assert first_disagreement(traces).startswith("collective #1: ")
    assert first_disagreement({r: rec(*AR3) for r in range(4)}) == ""


def test_slow_ranks_are_behind_not_desynchronized():
    traces = {r: rec(*("all_reduce",) * 5) for r in range(3)}
    traces[3] = rec(*("all_reduce",) * 2, pending_last=False)
    assert first_disagreement(traces, behind={3}) == ""
    assert first_disagreement(traces).startswith("rank 3 never reached collective #3")


def test_a_subgroup_is_named_and_ranks_without_records_are_left_out():
    traces = {0: rec("all_reduce", group=5, name="1", pending_last=False),
              1: rec("all_reduce", "broadcast", group=5, name="1"),
              2: rec("all_reduce", "all_gather", group=5, name="1"),
              3: Trace()}  # it died: nothing recorded
    assert first_disagreement(traces) == (
        "collective #2 of group 1: rank 1 entered broadcast, rank 2 entered all_gather")


def test_ranks_words():
    assert [ranks_words(x) for x in ([3], [0, 2, 3], [0, 1, 2], [0, 1, 2, 4, 5, 6, 7])] == [
        "rank 3", "ranks 0, 2, 3", "ranks 0-2", "ranks 0-2, 4-7"]


@pytest.mark.parametrize("cpu, stack, kind", [
    (1.2, 'File "user.py", line 3 in step', "computing"),
    (0.0, 'File "user.py", line 3 in step', "blocked"),
    # waiting in a collective decides, whatever the CPU (a busy peer thread, an NCCL spin)
    (1.2, 'File "/x/torch/distributed/distributed_c10d.py", line 9 in barrier\n  File "user.py"', "blocked"),
])
def test_classify_by_cpu_and_stack(cpu, stack, kind):
    assert classify(True, cpu, 2.0, stack, Evidence("running")).kind == kind


def test_classify_line_sits_at_advancing_fraction_of_a_core():
    assert classify(True, ADVANCING * 2.0, 2.0, "", None).kind == "computing"
    assert classify(True, ADVANCING * 2.0 * 0.9, 2.0, "", None).kind == "blocked"


def test_classify_starting_and_recorded_collective():
    assert classify(False, 1.0, 2.0, "", None).kind == "starting"  # not joined
    assert classify(True, 1.0, 2.0, "", Evidence("starting")).kind == "starting"  # importing
    waiting = classify(True, 0.0, 2.0, "", Evidence("running", rec("all_reduce").collectives))
    assert waiting.kind == "blocked" and waiting.in_collective and waiting.waiting_in.seq == 1
    # NCCL: a collective unfinished for the whole window is blocked even while the host thread spins
    nccl = rec("all_reduce", backend="nccl", age=5.0).collectives
    assert classify(True, 1.9, 2.0, "", Evidence("running", nccl)).kind == "blocked"
    assert classify(True, 1.9, 2.0, "", Evidence("running", rec("all_reduce").collectives)).kind == "computing"


@pytest.mark.parametrize("source, names", [
    ("dist.run(timeout=2.5)", "raise the limit where it was set: dist.run(timeout=2.5) in the test"),
    ("@pytest.mark.mgpu_timeout(2)", "raise the limit where it was set: @pytest.mark.mgpu_timeout(2) on the test"),
    ("--mgpu-timeout=5", "raise the limit where it was set: --mgpu-timeout=5 (--mgpu-timeout=S or ini mgpu_timeout"),
    ("the default --mgpu-timeout of 300s", "raise the limit where it was set: the default --mgpu-timeout of 300s"),
])
def test_the_setting_that_gave_the_limit_is_named(source, names):
    assert raise_limit(1.0, source).startswith(names)


def test_the_collective_hint_only_for_blocked_causes():
    computing = [RankProblem(0, "computing", ""), RankProblem(1, "hung", "", waiting=True, secondary=True)]
    hint = timeout_hint(computing, 5, "dist.run(timeout=5)")
    assert "still computing" in hint and "disagree" not in hint and "To wait longer" in hint
    hung = [RankProblem(0, "hung", ""), RankProblem(1, "hung", "", waiting=True, secondary=True)]
    assert "disagree" in timeout_hint(hung, 5, "dist.run(timeout=5)")
    cut = timeout_hint(computing, 5, "dist.run(timeout=5)", "pytest-timeout's limit of 8s (--timeout)")
    assert "raise pytest-timeout's limit (--timeout, or @pytest.mark.timeout)" in cut


def test_the_recorder_is_on_unless_the_user_set_it():
    assert recorder_env({}) == {RECORDER_ENV: "1000"}
    assert recorder_env({RECORDER_ENV: "0"}) == {}
    assert recorder_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "20"}) == {}


def test_a_torchrun_rank_is_judged_from_what_it_said_of_itself():
    """In a launched job the lost rank's monitor thread posts its phase, recorder and CPU time
    (launch/lost.py); the reporting rank uses the words spawned ranks get."""
    from types import SimpleNamespace

    from pytest_mgpu.launch.base import LaunchSpec
    from pytest_mgpu.launch.control import WorldBroken
    from pytest_mgpu.launch.external import ExternalLauncher

    stack = 'File "user.py", line 3 in step'
    launcher = ExternalLauncher(SimpleNamespace(rank=1))
    spec = LaunchSpec(nprocs=2, timeout_s=3, timeout_source="dist.run(timeout=3)")
    busy = WorldBroken("rank(s) 0 did not arrive", lost=(0,), stacks={0: stack},
                       evidence={0: (Evidence("running"), 1.5, 2.0)})
    text = launcher._failure(spec, busy, started=True).format()
    assert "rank 0 is still computing after 3s (the limit set by dist.run(timeout=3)): it used 1.50s of CPU" in text
    assert "raise the limit where it was set: dist.run(timeout=3) in the test" in text
    idle = WorldBroken("rank(s) 0 did not arrive", lost=(0,), stacks={0: stack},
                       evidence={0: (Evidence("running", rec("barrier").collectives), 0.0, 2.0)})
    text = launcher._failure(spec, idle, started=True).format()
    assert "rank 0 did not finish within 3s (hung; the limit set by dist.run(timeout=3)): blocked in collective #1 " \
           "(barrier), 0.00s of CPU in the last 2.0s" in text


def test_a_scatter_whose_list_is_on_its_root_only_is_not_a_disagreement():
    # DTensor's distribute_tensor scatters from each group's root: the others pass no tensor list
    traces = {r: rec("scatter", last_sizes=((2, 128, 64),) if r in (0, 2) else ()) for r in range(4)}
    assert first_disagreement(traces) == ""
    traces[2] = rec("scatter", last_sizes=((2, 128, 32),))  # two roots with other sizes still disagree
    assert first_disagreement(traces) == (
        "collective #1: rank 0 entered scatter with sizes [[2,128,64]], rank 2 entered scatter with sizes [[2,128,32]]")
