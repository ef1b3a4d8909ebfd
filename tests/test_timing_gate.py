"""The gate's statistics: Mann-Whitney U (against scipy when installed) and the regression rule."""
import random

import pytest

from pytest_mgpu.timing import gate
from pytest_mgpu.timing.gate import FASTER, NEW, SAME, SLOWER, UNDECIDABLE, judge, mann_whitney, min_p


def _samples(rng, n, centre, spread=0.02, ties=False):
    xs = [centre * (1 + rng.gauss(0, spread)) for _ in range(n)]
    return [round(x, 2) for x in xs] if ties else xs


@pytest.mark.parametrize("seed", range(12))
def test_mann_whitney_matches_scipy_asymptotic(seed):
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(seed)
    n1, n2 = rng.randint(3, 40), rng.randint(3, 40)
    ties = seed % 2 == 0  # rounded samples: many ties, exercising the tie correction
    x = _samples(rng, n1, 1.0 + rng.random() * 0.1, 0.05, ties)
    y = _samples(rng, n2, 1.0, 0.05, ties)
    ours = mann_whitney(x, y)
    for alt, p in (("greater", ours.p_greater), ("less", ours.p_less)):
        ref = stats.mannwhitneyu(x, y, alternative=alt, method="asymptotic", use_continuity=True)
        assert ours.u == pytest.approx(float(ref.statistic))
        assert p == pytest.approx(float(ref.pvalue), rel=1e-9, abs=1e-12)


def test_mann_whitney_all_tied_gives_no_evidence():
    r = mann_whitney([1.0] * 6, [1.0] * 7)
    assert r.p_greater == r.p_less == 1.0


def test_mann_whitney_direction():
    x, y = [2.0, 2.1, 2.2, 2.3, 2.4], [1.0, 1.1, 1.2, 1.3, 1.4]
    r = mann_whitney(x, y)
    assert r.p_greater < 0.01 < r.p_less
    assert r.u == 25  # every x above every y


def test_five_samples_a_side_can_reach_significance_and_four_cannot():
    # why measure.MIN_REPEAT is 5: below it no difference can pass the gate at alpha 0.01
    assert min_p(5, 5) < gate.ALPHA < min_p(4, 4)
    assert min_p(20, 20) < min_p(10, 10) < min_p(5, 5)


def test_no_baseline_is_new_and_never_a_regression():
    v = judge([1.0, 1.1, 1.2], None)
    assert v.status == NEW and not v.regression and v.ratio is None
    assert "--mgpu-save-timing" in v.format()


def test_significant_and_large_slowdown_is_a_regression_with_a_clear_message():
    rng = random.Random(1)
    base = _samples(rng, 10, 0.100)
    new = _samples(rng, 10, 0.130)
    v = judge(new, base, threshold=0.10, baseline_source="baselines/x.json")
    assert v.status == SLOWER and v.regression
    assert 1.2 < v.ratio < 1.4 and v.p_value < gate.ALPHA
    msg = v.format()
    for part in ("slower than its baseline", "vs baseline 100.", "x1.", "confidence >99.99%", "Mann-Whitney",
                 "threshold +10%", "baselines/x.json", "--mgpu-save-timing"):
        assert part in msg, (part, msg)


def test_significant_but_small_slowdown_passes():
    rng = random.Random(2)
    base = _samples(rng, 30, 0.100, spread=0.005)
    new = _samples(rng, 30, 0.105, spread=0.005)
    v = judge(new, base, threshold=0.10)
    assert v.p_value < gate.ALPHA  # a real shift ...
    assert v.status == SAME  # ... under the effect-size threshold


def test_large_but_insignificant_difference_passes():
    # medians 30% apart, but the samples overlap completely
    base = [0.10, 0.20, 0.30, 0.40, 0.50, 0.60, 0.70]
    new = [x * 1.3 for x in base]
    v = judge(new, base, threshold=0.10)
    assert v.ratio > 1.1 and v.p_value > gate.ALPHA and v.status == SAME


def test_faster_is_reported_not_failed():
    rng = random.Random(3)
    v = judge(_samples(rng, 10, 0.07), _samples(rng, 10, 0.10))
    assert v.status == FASTER and not v.regression


def test_too_few_samples_say_so():
    v = judge([0.2, 0.21, 0.22], [0.1, 0.11, 0.12])
    assert v.status == UNDECIDABLE and not v.regression
    assert "at least 5" in v.format()


def test_verdict_round_trips_through_plain_data():
    v = judge([0.2] * 5 + [0.21] * 5, [0.1] * 5 + [0.11] * 5)
    assert gate.Verdict.from_dict(v.to_dict()) == v
