"""Single device vs DataParallel vs DDP step time, MobileNetV2 and ResNet50 over batch sizes (seed 000;
ResNet18 in place of ResNet50 on CPU ranks: ``timing_models.ARCHS``).

Each case is a row of the timing report, grouped by model and batch ("resnet50-b16"), so the report
shows DP's and DDP's speed-up over the one-device row and the scaling efficiency. The batch is the
global batch: DP scatters it over its GPUs, DDP gives each rank an equal share.
"""
import pytest

import pytest_mgpu
from suites import timing_models as tm

S = tm.DP_DDP
CASES = [pytest.param(arch, batch, id=f"{arch}-b{batch}") for arch in tm.ARCHS for batch in S.batches]


def _check(dist, m, processes):
    assert len(m.rank_samples) == processes
    assert all(len(s) == len(m.samples) for s in m.rank_samples)
    assert len(m.samples) >= 5 and m.throughput > 0


@pytest.mark.gpu1
@pytest.mark.parametrize("arch,batch", CASES)
def test_single_device(dist, arch, batch):
    if reason := tm.scale_skip_reason(S, dist.emulated):
        pytest.skip(reason)
    m = dist.benchmark(tm.single_step, arch, batch, S.image, strategy="single", group=f"{arch}-b{batch}",
                       global_batch=batch, **S.bench_kwargs())
    _check(dist, m, 1)


@pytest_mgpu.world_sizes(*S.world_sizes)
@pytest.mark.parametrize("arch,batch", CASES)
def test_data_parallel(dist, arch, batch):
    if dist.device_type != "cuda":
        pytest.skip("nn.DataParallel needs 2+ GPUs: on CPU its device_ids become [] and forward just "
                    "calls the module, so its time would be the single-device time (MEASURED.md)")
    m = dist.benchmark(tm.dp_step, arch, batch, S.image, strategy="dp", group=f"{arch}-b{batch}",
                       global_batch=batch, single_process=True, **S.bench_kwargs())
    _check(dist, m, 1)


@pytest_mgpu.world_sizes(*S.world_sizes)
@pytest.mark.parametrize("arch,batch", CASES)
def test_ddp(dist, arch, batch):
    if reason := tm.scale_skip_reason(S, dist.emulated):
        pytest.skip(reason)
    m = dist.benchmark(tm.ddp_step, arch, batch, S.image, strategy="ddp", group=f"{arch}-b{batch}",
                       global_batch=batch, **S.bench_kwargs())
    _check(dist, m, dist.world_size)
