"""Ranks that clip by hand (no clip_grad_norm_ call: a total norm all-reduced, then a scale where it is over
the limit, as Megatron does) against a reference that calls clip_grad_norm_: a gradient that differs before
the clip (the head's gradient halved) leaves the ranks' norm under the limit, so they do not scale. That
the reference clipped and the ranks made no call is then a consequence, not the cause."""
from __future__ import annotations

from functools import partial as P

import pytest
import torch
import torch.distributed as tdist
from torch import nn

from pytest_mgpu import ParityError, world_sizes

MAX_NORM = 1.2  # between the halved run's total norm at step 0 and the right one's


def batch(step: int):
    g = torch.Generator().manual_seed(70 + step)
    return torch.randn(16, 6, generator=g), 2 * torch.randn(16, 2, generator=g)


def clipped(world_size: int, bug: str = "", steps: int = 3, reference: bool = False) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(step)
        if not reference:
            x, y = x.chunk(world_size)[tdist.get_rank()], y.chunk(world_size)[tdist.get_rank()]
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        if reference:
            torch.nn.utils.clip_grad_norm_(net.parameters(), MAX_NORM)
        else:
            for name, p in net.named_parameters():
                tdist.all_reduce(p.grad)
                p.grad /= world_size * (2 if bug == "head_halved" and name.startswith("2.") else 1)
            total = torch.stack([p.grad.norm() for p in net.parameters()]).norm()
            scale = MAX_NORM / (float(total) + 1e-6)
            if scale < 1:
                for p in net.parameters():
                    p.grad.mul_(scale)
        opt.step()


@world_sizes(2)
def test_a_clip_by_hand_is_not_said_missing_when_the_gradients_differ_before_it(dist):
    assert dist.assert_same_training(clipped, P(clipped, reference=True), dist.world_size, steps=3,
                                     record="optimizer").passed
    with pytest.raises(ParityError) as info:
        dist.assert_same_training(P(clipped, bug="head_halved"), P(clipped, reference=True), dist.world_size,
                                  steps=3, record="optimizer")
    line = str(info.value).splitlines()[1]
    print(line)
    assert "no clipping call was seen" not in line and "clipped by hand" not in line, line
