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
    h = _history(rule.MIN_HISTORY, sd=0.02)
    assert judge_history(math.log(1.5), h).status == Status.SLOWER
    assert judge_history(0.0, h).status == Status.SAME
    assert judge_history(math.log(0.6), h).status == Status.FASTER


def test_both_halves_of_the_rule_are_needed():
    tight = _history(20, sd=0.002)
    # far outside a tight interval but under the 10% effect size: same
    v = judge_history(math.log(1.05), tight)
    assert v.x > v.bound and v.status == Status.SAME
    # over the effect size but inside a wide interval: same
    wide = _history(20, sd=0.30)
    v = judge_history(math.log(1.3), wide)
    assert v.x < v.bound and v.status == Status.SAME
    # both: slower, with a small p and the ratio against the centre
    v = judge_history(math.log(1.4), _history(20, sd=0.03))
    assert v.status == Status.SLOWER and v.p_value < rule.ALPHA and v.ratio == pytest.approx(1.4, rel=0.05)


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
