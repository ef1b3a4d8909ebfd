"""FSDP vs DDP: step time and peak memory per rank, ResNet with Adam (seed 003).

FSDP shards parameters, gradients and optimizer state over the ranks and gathers parameters
around each block's forward and backward; DDP keeps a full replica of all three in every rank.
Both measurements are rows of the group "<arch>-adam-b<batch>" in the report (time and memory bars
side by side with --mgpu-plot). Memory is CUDA's max_memory_allocated on GPUs and, on CPU, the peak of
tensor memory from setup through two steps (the torch profiler's allocation events).
"""
import pytest

import pytest_mgpu
from suites import timing_models as tm

S = tm.FSDP
BATCH = S.batches[0]


@pytest_mgpu.world_sizes(*S.world_sizes)
def test_fsdp_vs_ddp(dist):
    if reason := tm.scale_skip_reason(S, dist.emulated):
        pytest.skip(reason)
    arch = tm.FSDP_ARCH
    common = dict(group=f"{arch}-adam-b{BATCH}", global_batch=BATCH, **S.bench_kwargs())
    ddp = dist.benchmark(tm.ddp_step, arch, BATCH, S.image, "adam", strategy="ddp", **common)
    fsdp = dist.benchmark(tm.fsdp_step, arch, BATCH, S.image, "adam", strategy="fsdp", **common)
    # What FSDP is for: every rank holds a shard of the weights, gradients and Adam moments
    # (for ResNet50 4 x 100 MB in each DDP replica, plus DDP's gradient buckets) instead of all.
    assert max(fsdp.peak_mem_bytes) < max(ddp.peak_mem_bytes), (
        f"FSDP's peak memory per rank {fsdp.peak_mem_bytes} is not below DDP's {ddp.peak_mem_bytes}")
