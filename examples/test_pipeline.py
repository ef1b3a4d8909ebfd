"""A hand-split pipeline: two stages on the first and last device the test holds, micro-batches fed
through them in turn, judged against the unsplit model with ``dist.assert_parity(parallel_fn, ...)``.

The pipeline is built in one process that sees all the test's devices
(``rank_context().devices``: ``cuda:0``, ``cuda:1`` on GPUs; cpu twice on emulated ranks). The
reference's initial weights are loaded into it by ``state_dict`` name (names that differ:
``param_map={"yours": "reference's"}``).
"""
import functools

import torch
from torch import nn

from pytest_mgpu import rank_context, world_sizes


def reference():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


class TwoStagePipeline(nn.Sequential):
    """The reference's layers (so the same state_dict names), layers 0-2 on the first device and
    3-4 on the last, the batch fed through in micro-batches of ``split_size`` rows."""

    CUT = 3

    def __init__(self, split_size):
        super().__init__(*reference())
        devices = rank_context().devices
        self.first, self.last = devices[0], devices[-1]
        for i, layer in enumerate(self):
            layer.to(self.first if i < self.CUT else self.last)
        self.split_size = split_size

    def forward(self, x):
        outs = []
        for h in x.to(self.first).split(self.split_size):
            for i, layer in enumerate(self):
                h = layer(h.to(self.last) if i == self.CUT else h)
            outs.append(h)
        return torch.cat(outs)


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 16, generator=g), torch.randint(0, 4, (16,), generator=g)


@world_sizes(2)
def test_pipeline_trains_like_the_unsplit_model(dist):
    report = dist.assert_parity(functools.partial(TwoStagePipeline, 4), reference, batch, steps=2)
    assert report.passed
