"""A GradScaler's skipped update in float16: the float64 run that measures the floor finds no overflow,
and must skip where the reference skipped, or every later step is compared one update apart (the floor
then spans a whole update, and bugs pass under it)."""
from __future__ import annotations

from functools import partial as P

import pytest

from pytest_mgpu import ParityError, world_sizes
from tests import scaler_loops as L


@world_sizes(2)
def test_the_correct_loop_passes_at_the_loops_own_roundoff(dist):
    report = dist.assert_same_training(L.fp16_scaled, P(L.fp16_scaled, reference=True), dist.world_size, steps=4,
                                       record="optimizer")
    assert report.passed
    print(report)
    # (step, line) where the line is over 1% of a gradient's norm, else None; compared one update apart, 1.9 norms
    blind = report.blind_below()
    assert blind is None or blind[1] < 0.5, report


@world_sizes(2)
@pytest.mark.parametrize("bug, cause", [
    ("zero_grad_micro", "gradients zeroed between micro-batches (at step 0 every gradient of fn on the ranks was zero "
                        "again before backward pass 2, 4 (the reference's too before pass 3: a step it did not count)"),
    ("clip_scaled", "the gradients still carry the GradScaler's scale (512, with clip_grad_norm_ before scaler.unscale_)"),
])
def test_bugs_after_a_skipped_update_are_caught_and_named(dist, bug, cause):
    """Both passed before, under a line spanning 1.9 gradient norms; the overflowed update's inf output
    gradients are no evidence, and the skipped update's zeroing is the reference's too."""
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(L.fp16_scaled, bug=bug), P(L.fp16_scaled, reference=True), dist.world_size,
                                  steps=4, record="optimizer")
    line = str(info.value).splitlines()[1]
    print(line)
    assert line.startswith("likely cause: " + cause), line
