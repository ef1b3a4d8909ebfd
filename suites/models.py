"""Small real models and synthetic batches for the equivalence suites.

Every factory is a module-level function (or a functools.partial of one), so the parity engine can
send it to the ranks. torchvision is imported inside the factories that need it: a rank that only
trains the MLP does not pay its ~1.6 s import.
"""
from __future__ import annotations

import functools
from collections import OrderedDict

import torch
from torch import nn

NUM_CLASSES = 10


class MLP(nn.Module):
    """The seed-001 MNIST MLP (784 -> 512 -> 10), unchanged."""

    def __init__(self, hidden: int = 512):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, hidden)
        self.fc2 = nn.Linear(hidden, NUM_CLASSES)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = x.view(-1, 28 * 28)
        return self.fc2(self.relu(self.fc1(x)))


def mlp(hidden: int = 512, dropout: float = 0.0) -> nn.Module:
    model = MLP(hidden)
    if dropout:
        model.relu = nn.Sequential(nn.ReLU(), nn.Dropout(dropout))
    return model


def small_cnn(norm: str = "batch", eval_mode: bool = False) -> nn.Sequential:
    """A small CNN as a named nn.Sequential (so pipeline stages can be cut by slicing).

    ``norm``: "batch" (BatchNorm2d: statistics of whatever batch it sees), "group" (GroupNorm: per
    sample, so sharding and micro-batching do not change it) or "none".
    """

    def norm_layer(c: int) -> nn.Module:
        return {"batch": lambda: nn.BatchNorm2d(c), "group": lambda: nn.GroupNorm(4, c),
                "none": nn.Identity}[norm]()

    model = nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(3, 8, 3, padding=1),
        norm1=norm_layer(8),
        relu1=nn.ReLU(),
        conv2=nn.Conv2d(8, 16, 3, padding=1, stride=2),
        norm2=norm_layer(16),
        relu2=nn.ReLU(),
        pool=nn.AdaptiveAvgPool2d(2),
        flatten=nn.Flatten(),
        fc=nn.Linear(16 * 4, NUM_CLASSES),
    ))
    return model.eval() if eval_mode else model


def _group_norm(channels: int) -> nn.Module:
    return nn.GroupNorm(min(8, channels), channels)


def resnet(depth: int = 18, norm: str = "batch", eval_mode: bool = False) -> nn.Module:
    """torchvision ResNet18/50 with 10 classes; ``norm="group"`` swaps BatchNorm for GroupNorm."""
    import torchvision

    kwargs = {"num_classes": NUM_CLASSES}
    if norm == "group":
        kwargs["norm_layer"] = _group_norm
    model = getattr(torchvision.models, f"resnet{depth}")(weights=None, **kwargs)
    return model.eval() if eval_mode else model


def resnet_sequential(depth: int = 18, norm: str = "batch", eval_mode: bool = False) -> nn.Sequential:
    """The same ResNet as an nn.Sequential of its top-level modules (conv1 ... layer4, avgpool, fc),
    as the seed's ModelParallelResNet50 regroups it; parameter names are unchanged."""
    net = resnet(depth, norm, eval_mode)
    parts = OrderedDict((n, getattr(net, n)) for n in
                        ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool"))
    parts["flatten"] = nn.Flatten(1)
    parts["fc"] = net.fc
    model = nn.Sequential(parts)
    return model.eval() if eval_mode else model


def mobilenet_v2(norm: str = "batch", eval_mode: bool = False, dropout: float = 0.2) -> nn.Module:
    import torchvision

    kwargs = {"num_classes": NUM_CLASSES}
    if norm == "group":
        kwargs["norm_layer"] = _group_norm
    model = torchvision.models.mobilenet_v2(weights=None, dropout=dropout, **kwargs)
    return model.eval() if eval_mode else model


# -- synthetic data ------------------------------------------------------------------------------


def image_batch(step: int, batch: int = 8, size: int = 32, channels: int = 3, seed: int = 0):
    """A deterministic global batch for ``step``: the same in every rank and in the reference."""
    g = torch.Generator().manual_seed(10_000 * seed + step)
    x = torch.randn(batch, channels, size, size, generator=g)
    y = torch.randint(0, NUM_CLASSES, (batch,), generator=g)
    return x, y


mnist_batch = functools.partial(image_batch, channels=1, size=28)


def sum_loss(outputs, targets):
    """Cross entropy summed over the batch: wrong under DDP's gradient averaging."""
    return nn.functional.cross_entropy(outputs, targets, reduction="sum")


def mse_onehot(outputs, targets):
    """The seed-004 loss: MSE against one-hot labels."""
    onehot = torch.zeros_like(outputs).scatter_(1, targets.view(-1, 1), 1.0)
    return nn.functional.mse_loss(outputs, onehot)


def model_state_bytes(model: nn.Module, optimizer=None) -> int:
    """Bytes of this rank's parameters, gradients and optimizer state, counting only the local
    shard of sharded (DTensor) tensors: what FSDP promises to divide by the world size."""
    from torch.distributed.tensor import DTensor

    def nbytes(t) -> int:
        if t is None:
            return 0
        if isinstance(t, DTensor):
            t = t.to_local()
        return t.numel() * t.element_size()

    total = sum(nbytes(p) + nbytes(p.grad) for p in model.parameters())
    if optimizer is not None:
        for state in optimizer.state.values():
            total += sum(nbytes(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total


def as_double(model_fn) -> nn.Module:
    """``model_fn()`` in float64 (use with functools.partial)."""
    return model_fn().double()


def double_batch(batch_fn, step: int):
    x, y = batch_fn(step)
    return x.double(), y


class TinyTransformer(nn.Module):
    """A small Transformer encoder classifier (no dropout): LayerNorm, attention softmax and GELU,
    the roundoff paths that convolutions do not have."""

    def __init__(self, d_model: int = 32, heads: int = 4, layers: int = 2):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=2 * d_model, dropout=0.0,
                                           activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, NUM_CLASSES)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


def transformer(d_model: int = 32, heads: int = 4, layers: int = 2) -> nn.Module:
    return TinyTransformer(d_model, heads, layers)


def sequence_batch(step: int, batch: int = 8, length: int = 12, d_model: int = 32, seed: int = 0):
    """A deterministic batch of embedded token sequences and labels."""
    g = torch.Generator().manual_seed(10_000 * seed + step)
    return torch.randn(batch, length, d_model, generator=g), torch.randint(0, NUM_CLASSES, (batch,), generator=g)
