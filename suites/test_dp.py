"""nn.DataParallel (seeds 000, 002, 003): one process scatters the batch over its GPUs, replicates
the model, gathers the outputs and reduces the gradients onto the first GPU.

DataParallel needs CUDA devices: on CPU it silently degrades to calling the module, so the parity
and scatter tests skip there with the reason; the checkpoint prefix test is about state_dict keys
and runs everywhere.
"""
import functools

import pytest
import torch
from torch import nn

from pytest_mgpu import rank_context, world_sizes
from suites import models as M

SIZES = world_sizes(1, 2, 4)


@SIZES
def test_mlp_trains_like_one_device(dist):
    report = dist.assert_parity("dp", M.mlp, functools.partial(M.mnist_batch, batch=30), steps=3)
    print(report.format())


@SIZES
def test_resnet18_eval_batchnorm_trains_like_one_device(dist):
    # BatchNorm in eval mode uses running statistics, so replicas on batch chunks agree
    model = functools.partial(M.resnet, 18, eval_mode=True)
    report = dist.assert_parity("dp", model, functools.partial(M.image_batch, batch=16, size=64), steps=2)
    print(report.format())


class _SizeRecorder(nn.Module):
    """Records the batch size each replica sees in forward (seed 002: 30 -> 15 + 15 on 2 GPUs)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 2)
        self.seen = []

    def forward(self, x):
        self.seen.append(int(x.shape[0]))  # replicas share this list object
        return self.fc(x)


def _scatter_sizes(batch):
    ids = list(rank_context().devices)
    model = _SizeRecorder().cuda(ids[0])
    out = nn.DataParallel(model, device_ids=ids)(torch.randn(batch, 5, device=ids[0]))
    return sorted(model.seen), list(out.shape), str(out.device)


@SIZES
def test_scatter_splits_the_batch_over_gpus(dist):
    if dist.device_type != "cuda":
        pytest.skip("nn.DataParallel scatters only over CUDA devices; this test runs on emulated CPU ranks")
    seen, shape, device = dist.run_single(_scatter_sizes, 30)
    chunks = sorted(len(c) for c in torch.arange(30).chunk(dist.world_size))
    assert seen == chunks, f"replicas saw {seen}, expected torch.chunk sizes {chunks}"
    assert shape == [30, 2] and device == "cuda:0", "outputs are gathered whole onto the first GPU"


def _state_dict_prefix():
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    ids = list(rank_context().devices) if rank_context().device_type == "cuda" else None
    torch.manual_seed(3)
    model = M.mlp(hidden=16)
    if ids:
        model = model.cuda(ids[0])
    dp = nn.DataParallel(model, device_ids=ids)
    wrapped = dp.state_dict()
    plain = M.mlp(hidden=16)
    try:
        plain.load_state_dict(wrapped)
        strict_fails = False
    except RuntimeError:
        strict_fails = True
    consume_prefix_in_state_dict_if_present(wrapped, "module.")
    plain.load_state_dict(wrapped)
    from_module = M.mlp(hidden=16)
    from_module.load_state_dict(dp.module.state_dict())
    same = all(torch.equal(a.cpu(), b) for a, b in zip(model.state_dict().values(), plain.state_dict().values()))
    same_module = all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(),
                                                        from_module.state_dict().values()))
    return sorted(dp.state_dict()), strict_fails, same and same_module


@SIZES
def test_checkpoint_module_prefix_is_handled(dist):
    keys, strict_fails, same = dist.run_single(_state_dict_prefix)
    assert keys and all(k.startswith("module.") for k in keys), keys
    assert strict_fails, "a DataParallel state_dict must not load into the plain model as is"
    assert same, "after removing 'module.' (or saving model.module) the plain model gets the same weights"
