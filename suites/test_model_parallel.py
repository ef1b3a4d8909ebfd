"""Model parallel (seed 004's ModelParallelResNet50): the model cut into consecutive stages on
consecutive devices of one process. No sums are split, so it must equal the unsplit model bitwise,
in train mode too (each BatchNorm still sees the whole batch).

On emulated CPU ranks all stages share the CPU: the cut, the device hops and the hooks still run.
"""
import functools

import torch

from pytest_mgpu import rank_context, world_sizes
from pytest_mgpu.parity.runners.staged import auto_split_points, place_stages
from suites import models as M

SIZES = world_sizes(1, 2, 4)


def _batch(dist, batch=8):
    return functools.partial(M.image_batch, batch=batch, size=32 if dist.emulated else 64)


@SIZES
def test_resnet18_in_world_size_stages_is_bitwise_equal(dist):
    # cut into world_size stages of about equal parameter count; BatchNorm in train mode
    report = dist.assert_parity("model_parallel", functools.partial(M.resnet, 18), _batch(dist),
                                steps=2, deterministic=True)
    print(report.format())
    assert report.bitwise
    assert len(report.facts.stages) == min(dist.world_size, 10)


@world_sizes(2)
def test_seed_resnet50_cut_before_layer3(dist):
    # seed 004: conv1 .. layer2 on the first device, layer3 .. fc on the second; the seed's loss
    report = dist.assert_parity("model_parallel", functools.partial(M.resnet, 50), _batch(dist, 4),
                                loss_fn=M.mse_onehot, steps=1, deterministic=True, split_points=["layer3"])
    print(report.format())
    assert report.facts.stages == [["conv1", "bn1", "relu", "maxpool", "layer1", "layer2"],
                                   ["layer3", "layer4", "avgpool", "fc"]]


@SIZES
def test_eval_mode_outputs_equal_the_unsplit_model(dist):
    report = dist.assert_parity("model_parallel", functools.partial(M.resnet, 18, eval_mode=True),
                                _batch(dist), steps=1, deterministic=True)
    assert report.max_abs("output") == 0.0


def _stage_devices(world_size):
    ctx = rank_context()
    if ctx.device_type == "cuda":
        devices = list(ctx.devices)
    else:
        devices = [torch.device("cpu")] * world_size  # emulated: every stage on the CPU
    model = M.resnet(18)
    stages = place_stages(model, auto_split_points(model, len(devices)), devices)
    where = {}
    for name, child in model.named_children():
        devs = {str(p.device) for p in child.parameters()} | {str(b.device) for b in child.buffers()}
        where[name] = sorted(devs)
    out = model(torch.randn(2, 3, 32, 32, device=devices[0]))
    return stages, where, str(out.device)


@SIZES
def test_stages_sit_on_consecutive_devices(dist):
    stages, where, out_device = dist.run_single(_stage_devices, dist.world_size)
    assert len(stages) == dist.world_size
    assert [n for s in stages for n in s] == list(where), "stages are consecutive runs of the children"
    gpus = dist.plan.shared_gpus or dist.world_size  # --mgpu-fallback=share: the stages take turns on fewer
    devices = [f"cuda:{i % gpus}" for i in range(dist.world_size)] if dist.device_type == "cuda" else ["cpu"]
    for stage, names in enumerate(stages):
        assert names, f"stage {stage} is empty"
        for name in names:
            if where[name]:
                assert where[name] == [devices[stage % len(devices)]], (name, where[name])
    assert out_device == devices[(len(stages) - 1) % len(devices)], "the output leaves the last stage"
