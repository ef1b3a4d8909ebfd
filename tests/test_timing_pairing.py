"""The revision lane's verdict on synthetic pairs: the interval, the threshold, the "unstable" bound."""
import math
import random

import pytest

from pytest_mgpu.timing import pairing
from pytest_mgpu.timing.pairing import RevisionStatus, band_width, judge_pairs


def _pairs(n, ratio, sd, seed=0, base=0.010, drift=0.5):
    """n pairs whose head/base log ratio is ln(ratio) + N(0, sd); the machine's speed drifts by up
    to 1 +/- drift between pairs (it must cancel: both batches of a pair see the same machine)."""
    rng = random.Random(seed)
    head, bases = [], []
    for _ in range(n):
        machine = base * (1 + rng.uniform(-drift, drift))
        bases.append(machine)
        head.append(machine * ratio * math.exp(rng.gauss(0.0, sd)))
    return head, bases


@pytest.mark.parametrize("ratio,status", [(1.3, RevisionStatus.SLOWER), (0.7, RevisionStatus.FASTER),
                                          (1.0, RevisionStatus.SAME), (1.05, RevisionStatus.SAME)])
def test_clear_pairs_are_judged_by_where_the_interval_lies(ratio, status):
    v = judge_pairs(*_pairs(30, ratio, 0.03), threshold=0.10)
    assert v.status == status, v
    assert v.low <= v.ratio <= v.high and v.low < ratio * 1.05 and v.high > ratio / 1.05
    assert v.pairs == 30 and v.level == pairing.LEVEL


def test_the_machine_drift_between_pairs_cancels():
    """Base batches spread over 0.5x-1.5x (a loaded machine between pairs): the ratio still holds."""
    v = judge_pairs(*_pairs(30, 1.25, 0.03, drift=0.5), threshold=0.10)
    assert v.status == RevisionStatus.SLOWER and v.ratio == pytest.approx(1.25, rel=0.05)


def test_an_interval_wider_than_the_same_band_is_unstable_unless_it_decides():
    """Pairs that disagree (sd 0.4 in log space) cannot tell +10% from -10%: unstable, never same,
    slower or faster; but an interval wholly above +10% decides whatever its width."""
    v = judge_pairs(*_pairs(20, 1.0, 0.4, seed=3), threshold=0.10)
    assert v.status == RevisionStatus.UNSTABLE, v
    assert math.log(v.high) - math.log(v.low) > band_width(0.10) and v.low < 1.1 < v.high
    assert "wider than the same-band" in v.note
    v = judge_pairs(*_pairs(20, 3.5, 0.3, seed=3), threshold=0.10)
    assert v.status == RevisionStatus.SLOWER and math.log(v.high) - math.log(v.low) > band_width(0.10), v


def test_a_same_across_the_edge_is_unsettled_and_more_pairs_settle_it():
    """A +20% change measured in few noisy pairs: "same" with 1.10 inside its interval, so the lane
    takes more pairs; with them the interval clears the edge. An unchanged revision is settled at once."""
    head, base = _pairs(120, 1.20, 0.12, seed=11)
    few = judge_pairs(head[:12], base[:12], threshold=0.10)
    assert few.status == RevisionStatus.SAME and few.low < 1.10 < few.high and not few.settled, few
    more = judge_pairs(head, base, threshold=0.10)
    assert more.status == RevisionStatus.SLOWER and more.settled, more
    same = judge_pairs(*_pairs(12, 1.0, 0.03, seed=11), threshold=0.10)
    assert same.status == RevisionStatus.SAME and same.settled, same
    assert not judge_pairs(*_pairs(20, 1.0, 0.4, seed=3), threshold=0.10).settled  # unstable


def test_too_few_pairs_are_unstable_and_say_how_to_get_more():
    v = judge_pairs(*_pairs(pairing.MIN_PAIRS - 1, 2.0, 0.01), threshold=0.10)
    assert v.status == RevisionStatus.UNSTABLE and v.low is None
    assert f"only {pairing.MIN_PAIRS - 1} pair(s)" in v.note and "min_run_time" in v.note


def test_the_bound_is_the_same_band_and_follows_the_threshold():
    assert band_width(0.10) == pytest.approx(math.log(1.1) - math.log(0.9))
    pairs = _pairs(30, 1.0, 0.12, seed=5)
    loose, strict = judge_pairs(*pairs, threshold=0.30), judge_pairs(*pairs, threshold=0.05)
    assert loose.status == RevisionStatus.SAME and strict.status == RevisionStatus.UNSTABLE


def test_the_same_pairs_give_the_same_verdict_everywhere():
    """The bootstrap is seeded by the data: pytest and compare, judging the same pairs, agree."""
    pairs = _pairs(25, 1.12, 0.05, seed=7)
    assert judge_pairs(*pairs, 0.10) == judge_pairs(*pairs, 0.10)
    v = judge_pairs(*pairs, 0.10)
    assert pairing.RevisionVerdict.from_dict(v.to_dict()) == v


def test_trimmed_mean_ignores_preempted_batches():
    """A loaded machine preempts a few batches (x3): they must not move the ratio."""
    head, base = _pairs(30, 1.0, 0.02, seed=11)
    for i in (2, 9, 17):
        head[i] *= 3.0
    v = judge_pairs(head, base, 0.10)
    assert v.status == RevisionStatus.SAME and v.ratio == pytest.approx(1.0, abs=0.03)


def test_unequal_pairs_are_refused():
    with pytest.raises(ValueError, match="as many head as base"):
        judge_pairs([1.0, 2.0], [1.0], 0.10)


def test_the_lane_budget_is_min_run_time_and_a_block_holds_its_pairs_however_slow():
    from pytest_mgpu.timing.revision import BUDGET_FACTOR, lane_budget
    from pytest_mgpu.timing.revision_rank import Turns, _Referee

    assert lane_budget(0.4) == BUDGET_FACTOR * 0.4

    class Store(dict):
        def set(self, k, v):
            self[k] = v.encode() if isinstance(v, str) else v

    referee = _Referee.__new__(_Referee)
    referee.turns = Turns("h", 0, "p", "head", 1, budget_s=0.0, turn_s=0.02, wait_s=1.0, pairs_goal=5)
    referee.store, referee.deadline = Store(), 0.0  # the deadline has passed
    assert not any(referee.hand_over(t, 0.1) for t in range(9))  # 4 pairs: fewer than the goal, go on
    assert referee.hand_over(9, 0.1)  # the fifth pair ends the block
    assert referee.store["go/10"] == b"stop" and referee.store["go/11"] == b"stop"
    referee.store, referee.deadline = Store(), float("inf")  # the time budget not spent: the goal alone is not enough
    assert not any(referee.hand_over(t, 0.1) for t in range(40))


def _swapped(n_per_block, blocks, ratio, set_bias, sd=0.02, seed=5):
    """Pairs from two sets of ranks that swap roles every block: set 0 is ``set_bias`` slower in log
    than set 1 for its whole life, so the head looks slower in even blocks and faster in odd ones."""
    rng = random.Random(seed)
    head, base, ks = [], [], []
    for k in range(blocks):
        for _ in range(n_per_block[k] if isinstance(n_per_block, list) else n_per_block):
            b = 0.05 * (1 + rng.uniform(-0.3, 0.3))
            sign = 1 if k % 2 == 0 else -1
            head.append(b * ratio * math.exp(sign * set_bias + rng.gauss(0.0, sd)))
            base.append(b)
            ks.append(k)
    return head, base, ks


@pytest.mark.parametrize("ratio", [1.0, 1.3])
def test_a_set_of_ranks_own_speed_cancels_over_swapped_blocks(ratio):
    """A 12% set bias (measured: sets of 2 CPU ranks 0.88-1.12x each other for their whole life) with
    more pairs in one block than the other: the block mean weighs both roles alike, and finds the
    true ratio, where the pooled pairs would lean toward the bigger block."""
    head, base, ks = _swapped([30, 12], 2, ratio, 0.12)
    v = judge_pairs(head, base, 0.10, ks)
    assert v.ratio == pytest.approx(ratio, rel=0.02), v
    pooled = judge_pairs(head, base, 0.10)
    assert pooled.ratio > ratio * 1.05  # what the lane said before the blocks: the set's bias
    assert v.status == (RevisionStatus.SAME if ratio == 1.0 else RevisionStatus.SLOWER)


def test_a_block_with_too_few_pairs_is_unstable_and_blocks_must_match_pairs():
    head, base, ks = _swapped([20, pairing.MIN_BLOCK_PAIRS - 1], 2, 1.0, 0.0)
    v = judge_pairs(head, base, 0.10, ks)
    assert v.status == RevisionStatus.UNSTABLE and "a block of pairs held only" in v.note
    with pytest.raises(ValueError, match="every pair needs its block"):
        judge_pairs(head, base, 0.10, ks[:-1])


def test_compare_rejudges_a_lane_from_its_blocks():
    from pytest_mgpu.timing.compare import rejudge_revision

    head, base, ks = _swapped([30, 12], 2, 1.0, 0.12)
    r = {"pairs_head": head, "pairs_base": base, "pairs_block": ks}
    assert rejudge_revision(r, 0.10)["verdict"] == judge_pairs(head, base, 0.10, ks).to_dict()


def test_compare_keeps_an_unchanged_row_as_pytest_judged_it():
    """REV's own code, stopped after one block: its few pairs are not judged again (they would read
    "unstable"), in compare as in pytest."""
    from pytest_mgpu.timing.compare import rejudge_revision
    from pytest_mgpu.timing.pairing import RevisionStatus, RevisionVerdict

    v = RevisionVerdict(RevisionStatus.UNCHANGED, pairs=5, note="the 2 file(s) ... are the same at main@abc")
    r = {"pairs_head": [1.0] * 5, "pairs_base": [1.1] * 5, "pairs_block": [0] * 5, "verdict": v.to_dict()}
    assert rejudge_revision(r, 0.10)["verdict"] == v.to_dict()
