"""Seed 004's hand-written ``ModelParallelResNet50`` and ``PipelineParallelResNet50``, as written,
with three adaptations: the hard-coded ``'cuda:0'``/``'cuda:1'`` are the first and last device this
process was given (``rank_context().devices``; cpu on emulated ranks), ``num_classes`` is 10 instead
of 1000, and the constructor passes ``norm_layer`` on to ResNet (GroupNorm or the default BatchNorm).
The reference is torchvision's ``resnet50`` with the same ``norm_layer``; seed 004's loss (MSE on
one-hot labels) and optimizer (SGD) are used as it trains.
"""
import functools

import torch
import torch.nn as nn
from torchvision.models import resnet50
from torchvision.models.resnet import Bottleneck, ResNet

from pytest_mgpu import rank_context

num_classes = 10


def device(i: int) -> torch.device:
    """What seed 004 wrote as f'cuda:{i}': this process's i-th device (the last if it has fewer)."""
    ctx = rank_context()
    if ctx.device_type != "cuda" or not ctx.devices:
        return torch.device("cpu")
    return ctx.devices[min(i, len(ctx.devices) - 1)]


def group_norm(channels: int) -> nn.Module:
    return nn.GroupNorm(min(32, channels), channels)


class ModelParallelResNet50(ResNet):
    def __init__(self, *args, **kwargs):
        super(ModelParallelResNet50, self).__init__(Bottleneck, [3, 4, 6, 3], num_classes=num_classes, *args, **kwargs)

        self.seq1 = nn.Sequential(
            self.conv1,
            self.bn1,
            self.relu,
            self.maxpool,

            self.layer1,
            self.layer2
        ).to(device(0))

        self.seq2 = nn.Sequential(
            self.layer3,
            self.layer4,
            self.avgpool
        ).to(device(1))

        self.fc.to(device(1))

    def forward(self, x):
        x = self.seq2(self.seq1(x).to(device(1)))
        return self.fc(x.view(x.size(0), -1))


class PipelineParallelResNet50(ModelParallelResNet50):
    def __init__(self, split_size=20, *args, **kwargs):
        super(PipelineParallelResNet50, self).__init__(*args, **kwargs)
        self.split_size = split_size

    def forward(self, x):
        splits = iter(x.split(self.split_size, dim=0))
        s_next = next(splits)
        s_prev = self.seq1(s_next).to(device(1))
        ret = []

        for s_next in splits:

            s_prev = self.seq2(s_prev)
            ret.append(self.fc(s_prev.view(s_prev.size(0), -1)))

            s_prev = self.seq1(s_next).to(device(1))

        s_prev = self.seq2(s_prev)
        ret.append(self.fc(s_prev.view(s_prev.size(0), -1)))

        return torch.cat(ret)


def model_parallel(norm: str = "group"):
    return ModelParallelResNet50(norm_layer=group_norm if norm == "group" else None)


def pipeline(split_size: int, norm: str = "group"):
    return PipelineParallelResNet50(split_size, norm_layer=group_norm if norm == "group" else None)


def reference(norm: str = "group"):
    """torchvision's resnet50, what the hand-written classes claim to be."""
    return resnet50(num_classes=num_classes, norm_layer=group_norm if norm == "group" else None)


def mse_onehot(outputs, targets):
    """Seed 004's loss: MSELoss against one-hot labels."""
    return nn.MSELoss()(outputs, torch.zeros_like(outputs).scatter_(1, targets.view(-1, 1), 1))


def sgd(params):
    """Seed 004's optimizer (its lr of 0.001 moves a 32-px ResNet50 too little to show anything in
    two steps: 0.05 and momentum make a wrong gradient show in the second step's weights)."""
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def batch(step: int, batch_size: int = 8, size: int = 16):
    """Seed 004's random inputs and labels, at CPU-friendly size (it used 120 x 128 px; 16 px still
    leaves layer3 a 1x1 map)."""
    g = torch.Generator().manual_seed(step)
    return torch.randn(batch_size, 3, size, size, generator=g), torch.randint(0, num_classes, (batch_size,), generator=g)


PARITY = dict(loss_fn=mse_onehot, optimizer_fn=sgd, steps=2)
# One step (loss, output, gradients, the update) keeps the CPU suites fast: a ResNet50 step here is
# three models (reference, its float64 shadow, the user's) and a comparison of 25M numbers.
ONE_STEP = dict(PARITY, steps=1)
BN = functools.partial(reference, "batch")
