"""The gate's rule on synthetic launch histories, and its Student t (checked against scipy)."""
import math
import random

import pytest

from pytest_mgpu.timing import rule, stats
from pytest_mgpu.timing.rule import Status, confirm, judge_history


def _history(n, sd=0.05, center=0.0, seed=1):
    rng = random.Random(seed)
    return [rng.gauss(center, sd) for _ in range(n)]


def test_zero_launches_is_new_and_never_fails():
    v = judge_history(0.9, [])
    assert v.status == Status.NEW and not v.flagged and v.ratio is None


@pytest.mark.parametrize("n", [1, 2, rule.MIN_HISTORY - 1])
def test_short_history_only_learns(n):
    v = judge_history(math.log(3.0), _history(n))  # 3x slower: still not a failure
    assert v.status == Status.LEARNING and v.n_history == n and not v.flagged
    assert v.ratio == pytest.approx(3.0 * math.exp(-v.center))


def test_minimum_history_decides():
    h = _history(rule.MIN_HISTORY, sd=0.01)  # tight enough for 5 launches to see +10%
    assert judge_history(math.log(1.5), h).status == Status.SLOWER
    assert judge_history(0.0, h).status == Status.SAME
    assert judge_history(math.log(0.6), h).status == Status.FASTER


def test_both_halves_of_the_rule_are_needed():
    tight = _history(20, sd=0.002)
    # far outside a tight interval but under the 10% effect size: same
    v = judge_history(math.log(1.05), tight)
    assert v.x > v.bound and v.status == Status.SAME
    # over the effect size but inside a wide interval: not flagged, and not "same" either (noisy)
    wide = _history(20, sd=0.30)
    v = judge_history(math.log(1.3), wide)
    assert v.x < v.bound and v.status == Status.NOISY
    # both: slower, with a small p and the ratio against the centre
    v = judge_history(math.log(1.4), _history(20, sd=0.03))
    assert v.status == Status.SLOWER and v.p_value < rule.ALPHA and v.ratio == pytest.approx(1.4, rel=0.05)


def _flip(n, seed=3, ref=0.004):
    """x of launches whose step flips between 5 and 10 ms against a steady reference (a second
    process sharing the 2 cores)."""
    rng = random.Random(seed)
    steps = [0.005, 0.010] + [rng.choice((0.005, 0.010)) for _ in range(n - 2)]
    return [math.log(s / ref) for s in steps]


@pytest.mark.parametrize("change", [1.417, 1.959, 1.0])
def test_a_history_too_wide_for_the_threshold_is_noisy_never_same(change):
    """The launches of the report that said "+95.9% (n=5) same": the history's interval is wider
    than +100%, so neither a real +41.7% nor +95.9% nor no change at all could have been seen."""
    h = _flip(5)
    center = sum(h) / len(h)
    v = judge_history(center + math.log(change), h)
    assert v.status == Status.NOISY and not v.flagged, v
    assert v.detectable > 1.0 and v.detectable == pytest.approx(math.expm1(v.bound - v.center))
    assert v.detectable == pytest.approx(rule.detectable_change(v.spread, 5))


def test_a_tight_history_still_says_same():
    v = judge_history(math.log(1.04), _history(20, sd=0.01))
    assert v.status == Status.SAME and v.detectable == rule.DEFAULT_THRESHOLD  # it could see +10%


def test_a_slowdown_beyond_the_detectable_change_is_still_slower():
    h = _history(20, sd=0.10)
    v = judge_history(0.0, h)
    assert v.status == Status.NOISY and 0.2 < v.detectable < 0.6  # +10% is out of its sight ...
    big = judge_history(v.center + math.log1p(v.detectable) * 1.2, h)
    assert big.status == Status.SLOWER and big.detectable == v.detectable  # ... a change beyond it is not


def test_noisy_is_exactly_where_the_interval_is_wider_than_the_threshold():
    """Everywhere (n, spread, x, threshold): an unflagged launch is "same" only where the history can
    see a change of the threshold, and "noisy" only where it cannot."""
    rng = random.Random(11)
    for _ in range(3000):
        n = rng.randint(rule.MIN_HISTORY, 30)
        h = _history(n, sd=rng.choice((0.002, 0.01, 0.02, 0.03, 0.06, 0.2, 0.5)), seed=rng.randrange(10**6))
        thr = rng.choice((0.05, 0.10, 0.25))
        v = judge_history(rng.gauss(0.0, 0.4), h, threshold=thr)
        blind = math.expm1(v.bound - v.center) > thr
        if v.status in (Status.SAME, Status.NOISY):
            assert (v.status == Status.NOISY) == blind, (n, v)
        assert v.detectable == pytest.approx(max(math.expm1(v.bound - v.center), thr))


def test_unchanged_launches_of_a_wide_history_are_noisy_never_same_and_rarely_slower():
    rng = random.Random(5)
    seen = {s: 0 for s in Status}
    for _ in range(2000):
        h = [rng.gauss(0, 0.3) for _ in range(rng.randint(5, 30))]
        seen[judge_history(rng.gauss(0, 0.3), h).status] += 1
    assert seen[Status.SAME] == 0 and seen[Status.NOISY] > 1900
    assert seen[Status.SLOWER] <= 2000 * rule.ALPHA * 1.5 + 2  # one stage: at most alpha, as everywhere


def test_identical_launches_use_the_spread_floor():
    v = judge_history(math.log(1.03), [0.0] * 10)
    assert v.spread == rule.SD_FLOOR and v.status == Status.SAME  # not "infinitely significant"


def test_threshold_is_the_effect_size():
    h = _history(20, sd=0.01)
    x = math.log(1.15)
    assert judge_history(x, h, threshold=0.10).status == Status.SLOWER
    assert judge_history(x, h, threshold=0.20).status == Status.SAME


def test_confirmation_needs_both_launches():
    h = _history(20, sd=0.02)
    first = judge_history(math.log(1.5), h)
    assert confirm(first, judge_history(math.log(1.45), h)).status == Status.SLOWER
    undone = confirm(first, judge_history(0.01, h))
    assert undone.status == Status.UNCONFIRMED and not undone.flagged and undone.x_again == 0.01
    same = judge_history(0.0, h)
    assert confirm(same, first) is same  # only a flagged launch is re-judged


def test_a_flagged_launch_the_re_measurement_undoes_is_noisy_where_the_history_is_wide():
    h = _history(20, sd=0.10)  # sees +38% and more, not +10%
    first = judge_history(math.log(2.0), h)
    assert first.flagged and confirm(first, judge_history(math.log(1.9), h)).status == Status.SLOWER
    undone = confirm(first, judge_history(0.0, h))
    assert undone.status == Status.NOISY and not undone.flagged and undone.x_again == 0.0


def test_verdict_round_trips_as_plain_data():
    v = confirm(judge_history(0.5, _history(8)), judge_history(0.6, _history(8)))
    assert rule.HistoryVerdict.from_dict(v.to_dict()) == v and v.to_dict()["status"] == "slower"


def test_false_alarm_rate_of_the_rule_on_simulated_launches():
    """Unchanged launches with a between-launch spread: the rule's false alarms stay under ALPHA
    (the t interval is exact for normal x; the effect size only removes alarms)."""
    rng = random.Random(7)
    alarms = trials = 0
    for _ in range(4000):
        h = [rng.gauss(0, 0.08) for _ in range(10)]
        alarms += judge_history(rng.gauss(0, 0.08), h).flagged
        trials += 1
    assert alarms / trials <= rule.ALPHA * 1.5 + 0.001


def test_alpha_controls_the_suite_run():
    assert rule.ALPHA * rule.SUITE_SIZE == pytest.approx(rule.SUITE_ALPHA)


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 19, 29, 200])
def test_t_distribution_against_scipy(df):
    sst = pytest.importorskip("scipy.stats")
    for p in (0.6, 0.9, 0.99, 1 - rule.ALPHA, 0.9999, 0.05):
        assert stats.t_quantile(p, df) == pytest.approx(sst.t.ppf(p, df), rel=1e-7, abs=1e-9)
    for t in (-4.0, -0.3, 0.0, 0.7, 2.5, 9.0):
        assert stats.t_sf(t, df) == pytest.approx(sst.t.sf(t, df), rel=1e-7, abs=1e-12)


def test_t_quantile_known_values_without_scipy():
    assert stats.t_quantile(0.975, 1) == pytest.approx(12.7062, rel=1e-4)
    assert stats.t_quantile(0.99, 10) == pytest.approx(2.7638, rel=1e-4)
    assert stats.t_quantile(0.5, 5) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError):
        stats.t_quantile(1.0, 3)
