"""FSDP (fully_shard, and FSDP1 where this torch has it) trains like one device; full state dicts
round-trip; each rank holds less model state than under DDP (seed 003: sharded parameters,
gradients and optimizer state)."""
import functools

import pytest
import torch
import torch.distributed as tdist
from torch import nn

from pytest_mgpu import rank_device, world_sizes
from suites import models as M

SIZES = world_sizes(1, 2, 4)
CNN_GN = functools.partial(M.small_cnn, norm="group")


@SIZES
def test_fully_shard_mlp_trains_like_one_device(dist):
    report = dist.assert_parity("fsdp", M.mlp, M.mnist_batch, steps=3)
    print(report.format())


@SIZES
def test_fully_shard_cnn_per_child_trains_like_one_device(dist):
    # every child with parameters is its own FSDP unit, then the root
    batch = functools.partial(M.image_batch, batch=8, size=16)
    report = dist.assert_parity("fsdp", CNN_GN, batch, steps=2, shard_modules="children")
    print(report.format())


@world_sizes(2)
def test_fully_shard_resnet18_groupnorm_trains_like_one_device(dist):
    batch = functools.partial(M.image_batch, batch=8, size=32 if dist.emulated else 64)
    report = dist.assert_parity("fsdp", functools.partial(M.resnet, 18, norm="group"), batch, steps=2)
    print(report.format())


@SIZES
def test_fsdp1_trains_like_one_device(dist):
    report = dist.assert_parity("fsdp", M.mlp, M.mnist_batch, steps=2, fsdp_version=1)
    print(report.format())


@SIZES
def test_full_state_dict_round_trip(dist):
    if dist.plan.shared_gpus:
        pytest.skip("get_model_state_dict(full_state_dict=True) and full_tensor() wait on DTensor's functional "
                    "collectives, which kill gloo ranks carrying CUDA tensors (SIGSEGV): not under "
                    "--mgpu-fallback=share")
    out = dist.run(_full_state_dict_round_trip)
    full = out[0]["full"]
    assert set(full) == set(M.mlp(hidden=64).state_dict()), "full state dict keys are the plain model's"
    M.mlp(hidden=64).load_state_dict(full)  # loads into the unwrapped model, strict
    for o in out:
        assert o["matches_shards"], "the full state dict differs from the gathered shards"
        assert o["reloaded_equal"], "loading the full state dict into a fresh FSDP model changed it"
        assert o["fresh_differed"], "the fresh model already had these weights: the test proves nothing"


def _full_state_dict_round_trip():
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    def sharded(seed):
        torch.manual_seed(seed)
        model = M.mlp(hidden=64).to(rank_device())
        for child in (model.fc1, model.fc2):
            fully_shard(child)
        return fully_shard(model)

    model = sharded(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = M.mnist_batch(tdist.get_rank(), batch=4)
    nn.functional.cross_entropy(model(x.to(rank_device())), y.to(rank_device())).backward()
    opt.step()
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=opts)  # on rank 0 only, with cpu_offload
    gathered = {n: p.full_tensor().cpu() for n, p in model.named_parameters()}
    out = {"full": full if tdist.get_rank() == 0 else {}}
    full0 = [full]
    tdist.broadcast_object_list(full0, src=0)
    full0 = full0[0]
    out["matches_shards"] = all(torch.equal(full0[n], t) for n, t in gathered.items())
    fresh = sharded(1)
    before = {n: p.full_tensor().cpu() for n, p in fresh.named_parameters()}
    out["fresh_differed"] = any(not torch.equal(before[n], full0[n]) for n in before)
    # a copy: set_model_state_dict turns the dict's tensors into shards in place
    given = {k: v.clone() for k, v in full0.items()} if tdist.get_rank() == 0 else {}
    set_model_state_dict(fresh, given,
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    after = {n: p.full_tensor().cpu() for n, p in fresh.named_parameters()}
    out["reloaded_equal"] = all(torch.equal(after[n], full0[n]) for n in after)
    return out


@SIZES
def test_model_state_per_rank_below_ddp(dist):
    out = dist.run(_state_bytes)
    for rank, o in enumerate(out):
        print(f"rank {rank}: ddp {o['ddp']} B, fsdp {o['fsdp']} B, cuda peak {o.get('peak')}")
        if dist.world_size == 1:
            assert o["fsdp"] <= o["ddp"]
        else:
            # parameters, gradients and momentum are sharded: about 1/W of DDP's, plus padding
            assert o["fsdp"] < o["ddp"] / dist.world_size * 1.1, o
            if "peak" in o:
                assert o["peak"]["fsdp"] < o["peak"]["ddp"], o
    assert out[0]["ddp"] > 0


def _state_bytes():
    """Bytes of parameters, gradients and momentum on this rank after one training step, under
    DDP and under fully_shard; on CUDA also each run's peak allocated memory."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = rank_device()
    x, y = M.mnist_batch(tdist.get_rank(), batch=8)
    x, y = x.to(dev), y.to(dev)
    out, peak = {}, {}
    for kind in ("ddp", "fsdp"):
        torch.manual_seed(0)
        model = M.mlp(hidden=1024).to(dev)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        if kind == "ddp":
            wrapped = DDP(model, device_ids=[dev] if dev.type == "cuda" else None)
        else:
            fully_shard(model.fc1)
            fully_shard(model.fc2)
            wrapped = fully_shard(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
        nn.functional.cross_entropy(wrapped(x), y).backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            peak[kind] = torch.cuda.max_memory_allocated(dev)
        out[kind] = M.model_state_bytes(model, opt)
        del wrapped, model, opt
    if peak:
        out["peak"] = peak
    return out
