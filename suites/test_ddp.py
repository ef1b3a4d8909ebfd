"""DistributedDataParallel trains like one device, and the behaviours the seeds describe hold:
rank-0 weight broadcast, DistributedSampler sharding, no_sync accumulation, BatchNorm vs
SyncBatchNorm, uneven inputs with Join, rank-0 checkpoints of model.module.
"""
import functools

import pytest
import torch
import torch.distributed as tdist
from torch import nn

from pytest_mgpu import rank_context, rank_device, world_sizes
from pytest_mgpu.parity import ParityError
from suites import models as M

SIZES = world_sizes(1, 2, 4)
CNN_BN = functools.partial(M.small_cnn, norm="batch")


def _scale(dist):
    """Input size: small on emulated CPU ranks, larger on GPUs."""
    return 32 if dist.emulated else 64


# -- parity ---------------------------------------------------------------------------------------
@SIZES
def test_mlp_trains_like_one_device(dist):
    report = dist.assert_parity("ddp", M.mlp, M.mnist_batch, steps=3)
    print(report.format())


@SIZES
def test_resnet18_groupnorm_trains_like_one_device(dist):
    batch = functools.partial(M.image_batch, batch=8, size=_scale(dist))
    report = dist.assert_parity("ddp", functools.partial(M.resnet, 18, norm="group"), batch, steps=2)
    print(report.format())


@world_sizes(2)
def test_mobilenet_v2_groupnorm_trains_like_one_device(dist):
    batch = functools.partial(M.image_batch, batch=8, size=_scale(dist))
    report = dist.assert_parity("ddp", functools.partial(M.mobilenet_v2, norm="group", dropout=0.0), batch, steps=2)
    print(report.format())


@world_sizes(2)
def test_float64_is_judged_with_a_tighter_tolerance(dist):
    model = functools.partial(M.as_double, M.mlp)
    report = dist.assert_parity("ddp", model, functools.partial(M.double_batch, M.mnist_batch), steps=2)
    assert report.facts.dtype == "float64" and "float64 already" in report.facts.shadow_note
    # no shadow above float64; the twin (float64, the shards' order) measures the line
    assert report.tolerance.rule == "measured" and report.tolerance.rel_line(0, "grad") < 1e-9
    assert report.rel("grad") < 1e-12


@world_sizes(2, 4)
def test_sum_loss_under_ddp_averaging_is_off_by_the_world_size(dist):
    with pytest.raises(ParityError) as failure:
        dist.assert_parity("ddp", M.mlp, M.mnist_batch, loss_fn=M.sum_loss, steps=1)
    print(failure.value)
    w = dist.world_size
    assert f"gradients are {1 / w:.3g}x the reference's; 1/{w}" in str(failure.value)


@SIZES
def test_gradient_accumulation_with_no_sync_equals_one_large_batch(dist):
    # each rank's shard in 2 micro-batches, the first under no_sync(): one all-reduce per step
    report = dist.assert_parity("ddp", M.mlp, functools.partial(M.mnist_batch, batch=16), accumulate=2)
    print(report.format())
    first, synced = zip(*dist.run(_no_sync_grads))
    if dist.world_size > 1:
        assert any(not torch.equal(first[0], g) for g in first[1:]), "no_sync() still all-reduced"
    for g in synced:
        assert torch.allclose(g, synced[0], rtol=0, atol=1e-6), "the synced backward left ranks apart"


def _no_sync_grads():
    """A gradient after a no_sync() backward (local) and after the following synced backward."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = tdist.get_rank()
    ddp = DDP(M.mlp(hidden=32).to(rank_device()))
    x, y = M.mnist_batch(rank, batch=4)  # a different shard on every rank
    x, y = x.to(rank_device()), y.to(rank_device())
    with ddp.no_sync():
        nn.functional.cross_entropy(ddp(x), y).backward()
    local = ddp.module.fc2.weight.grad.clone()
    nn.functional.cross_entropy(ddp(x), y).backward()
    return local, ddp.module.fc2.weight.grad.clone()


# -- BatchNorm ------------------------------------------------------------------------------------
@SIZES
def test_batchnorm_without_syncbn_diverges_and_is_named(dist):
    batch = functools.partial(M.image_batch, batch=8, size=16)
    if dist.world_size == 1:  # one rank normalizes the whole batch: nothing to diverge
        dist.assert_parity("ddp", CNN_BN, batch, steps=2)
        return
    with pytest.raises(ParityError) as failure:
        dist.assert_parity("ddp", CNN_BN, batch, steps=2)
    message = str(failure.value)
    print(message)
    assert failure.value.report.first_divergence == 0
    assert "BatchNorm without SyncBatchNorm" in message and "norm1, norm2" in message
    worst = {e.name for _, e, _ in failure.value.report.failures()}
    assert {"norm1.weight", "norm2.weight"} & worst


@SIZES
def test_syncbatchnorm_restores_parity(dist):
    # SyncBatchNorm trains only on CUDA: the engine skips this on emulated CPU ranks, with the reason
    batch = functools.partial(M.image_batch, batch=8, size=16)
    report = dist.assert_parity("ddp", CNN_BN, batch, steps=2, sync_bn=True)
    print(report.format())


# -- construction and data ------------------------------------------------------------------------
@SIZES
def test_construction_broadcasts_rank0_weights(dist):
    results = dist.run(_weights_before_and_after_ddp)
    before = [b for b, _ in results]
    after = [a for _, a in results]
    if dist.world_size > 1:
        assert not torch.equal(before[0], before[1]), "ranks were meant to start from different weights"
    for a in after:
        assert torch.equal(a, before[0]), "DDP(model) must copy rank 0's weights to every rank"


def _weights_before_and_after_ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(100 + tdist.get_rank())  # seeded differently on purpose
    model = M.mlp(hidden=16).to(rank_device())
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    ddp = DDP(model)
    return before, torch.nn.utils.parameters_to_vector(ddp.module.parameters()).detach()


@SIZES
@pytest.mark.parametrize("size", [12, 10])
def test_distributed_sampler_shards(dist, size):
    shards = dist.run(_sampler_indices, size)
    w = dist.world_size
    per_rank = -(-size // w)
    for epoch in ("e0", "e1", "again"):
        got = [s[epoch] for s in shards]
        assert all(len(g) == per_rank for g in got), "every rank gets the same number of samples"
        flat = [i for g in got for i in g]
        assert set(flat) == set(range(size)), "the shards cover the dataset"
        padding = per_rank * w - size
        assert len(flat) - len(set(flat)) == padding, "only the padding repeats samples"
        if padding == 0:
            assert len(set(flat)) == len(flat), "shards are disjoint when the size divides"
    e0 = [i for s in shards for i in s["e0"]]
    e1 = [i for s in shards for i in s["e1"]]
    assert e0 != e1, "set_epoch(1) must reshuffle"
    assert [s["again"] for s in shards] == [s["e0"] for s in shards], "without set_epoch the order repeats"


def _sampler_indices(size):
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(range(size), shuffle=True, seed=0)
    sampler.set_epoch(0)
    e0 = list(sampler)
    sampler.set_epoch(1)
    e1 = list(sampler)
    fresh = DistributedSampler(range(size), shuffle=True, seed=0)  # never told the epoch
    return {"e0": e0, "e1": e1, "again": list(fresh)}


@SIZES
def test_uneven_inputs_with_join(dist):
    out = dist.run(_train_with_join, timeout=120)
    for vec, err in out:
        assert torch.equal(vec, out[0][0]), "ranks ended with different weights"
        assert err < 1e-5, f"Join training differs from the expected updates by {err:.2e}"


def _train_with_join():
    """Rank r trains on r + 1 batches; Join shadows the all-reduces of ranks that ran out, and DDP
    divides by the initial world size, so step i's gradient is (1/W) * sum of active ranks' grads.
    Every rank recomputes that expectation with a plain model and compares."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = tdist.get_rank(), tdist.get_world_size()
    dev = rank_device()
    seed = rank_context().seed
    torch.manual_seed(seed)
    ddp = DDP(M.mlp(hidden=32).to(dev))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)

    def batch(r, i):
        x, y = M.mnist_batch(100 * r + i, batch=4)
        return x.to(dev), y.to(dev)

    with Join([ddp]):
        for i in range(rank + 1):
            opt.zero_grad()
            x, y = batch(rank, i)
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
    torch.manual_seed(seed)
    ref = M.mlp(hidden=32).to(dev)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for i in range(world):
        ref_opt.zero_grad()
        active = [r for r in range(world) if i < r + 1]
        for r in active:
            x, y = batch(r, i)
            (nn.functional.cross_entropy(ref(x), y) / world).backward()
        ref_opt.step()
    got = torch.nn.utils.parameters_to_vector(ddp.module.parameters()).detach()
    want = torch.nn.utils.parameters_to_vector(ref.parameters()).detach()
    return got, (got - want).abs().max().item()


# -- checkpoints ----------------------------------------------------------------------------------
@SIZES
def test_rank0_checkpoint_of_module_loads_into_plain_model(dist, tmp_path):
    path = str(tmp_path / "checkpoint.pt")
    out = dist.run(_train_and_save, path)
    assert out[0]["wrapper_keys_prefixed"], "DDP's own state_dict keys carry the 'module.' prefix"
    assert out[0]["wrapper_strict_load_fails"]
    saved = torch.load(path, map_location="cpu", weights_only=True)
    plain = M.mlp(hidden=32)
    plain.load_state_dict(saved)  # strict: same keys, no prefix
    for o in out:
        assert o["loaded_equal"], "a rank loaded rank 0's checkpoint and got different weights"
        for name, t in plain.state_dict().items():
            assert torch.equal(t, o["state"][name])


def _train_and_save(path):
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = rank_device()
    ddp = DDP(M.mlp(hidden=32).to(dev))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        x, y = M.mnist_batch(step * tdist.get_world_size() + tdist.get_rank(), batch=4)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x.to(dev)), y.to(dev)).backward()
        opt.step()
    info = {}
    if tdist.get_rank() == 0:
        torch.save(ddp.module.state_dict(), path)  # the seed-001 checkpoint: module, not the wrapper
        info["wrapper_keys_prefixed"] = all(k.startswith("module.") for k in ddp.state_dict())
        try:
            M.mlp(hidden=32).load_state_dict(ddp.state_dict())
            info["wrapper_strict_load_fails"] = False
        except RuntimeError:
            info["wrapper_strict_load_fails"] = True
    tdist.barrier()
    plain = M.mlp(hidden=32)
    plain.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    mine = {k: v.detach().cpu() for k, v in ddp.module.state_dict().items()}
    info["loaded_equal"] = all(torch.equal(v, mine[k]) for k, v in plain.state_dict().items())
    info["state"] = mine
    return info
