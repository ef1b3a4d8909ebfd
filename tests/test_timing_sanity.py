"""Measurement sanity: unstable samples are named, non-finite times refused with their rank."""
import math

import pytest

from pytest_mgpu.timing.inrank import RankTiming
from pytest_mgpu.timing.measure import instability, refuse_non_finite


def test_instability_names_spread_and_drift():
    assert instability([0.1, 0.101, 0.099, 0.1, 0.102, 0.098]) == ""
    # the user report that asked for it: median 2.9 s with an IQR of 1.9 s
    assert "IQR" in instability([0.3, 2.9, 0.3, 3.0, 5.0, 3.1, 0.3, 4.5])
    assert "drifted" in instability([0.4, 0.4, 0.4, 1.0] + [1.0] * 8)  # a slow start, small IQR
    assert instability([0.1, 5.0]) == ""  # too few to tell


def _timing(rank, samples, refs=(0.001, 0.001)):
    return RankTiming(rank, list(samples), [], None, "", list(refs))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_samples_are_refused_naming_the_rank(bad):
    refuse_non_finite([_timing(0, [0.1, 0.1]), _timing(1, [0.1, 0.1])])
    with pytest.raises(ValueError, match=r"rank 1 produced non-finite times"):
        refuse_non_finite([_timing(0, [0.1, 0.1]), _timing(1, [0.1, bad])])
    with pytest.raises(ValueError, match=r"rank 0 produced non-finite times"):
        refuse_non_finite([_timing(0, [0.1, 0.1], refs=(bad, 0.001))])
