"""ResNet50 on one device vs model parallel vs pipelined over split sizes (seed 004).

The reference finds model parallel ~7% slower than one GPU (one half idles while the other works)
and pipelining up to ~50% faster, best at split size 20 of a 120 batch. All rows form the group
"<arch>-pipeline"; the report adds the split-size curve when plots are asked for. On emulated
CPU ranks both halves share the CPU, so the curve shows the cost of micro-batching, not its gain,
and the model is ResNet18 (``timing_models.PIPELINE_ARCH``: the same cut, a third of the time).
"""
import pytest

from suites import timing_models as tm

S = tm.PIPELINE
BATCH = S.batches[0]
ARCH = tm.PIPELINE_ARCH
GROUP = f"{ARCH}-pipeline"


def _skip_if_needed(dist):
    if reason := tm.scale_skip_reason(S, dist.emulated):
        pytest.skip(reason)


@pytest.mark.gpu1
def test_whole_model(dist):
    _skip_if_needed(dist)
    m = dist.benchmark(tm.resnet_whole_step, BATCH, S.image, 1000, ARCH, strategy="single", group=GROUP,
                       global_batch=BATCH, **S.bench_kwargs())
    assert len(m.samples) >= 5


@pytest.mark.gpu2
def test_model_parallel(dist):
    _skip_if_needed(dist)
    m = dist.benchmark(tm.resnet_split_step, BATCH, S.image, None, 1000, ARCH, strategy="model_parallel", group=GROUP,
                       global_batch=BATCH, single_process=True, **S.bench_kwargs())
    assert m.task.processes == 1 and len(m.samples) >= 5


@pytest.mark.gpu2
@pytest.mark.parametrize("split_size", tm.SPLIT_SIZES)
def test_pipelined(dist, split_size):
    _skip_if_needed(dist)
    if split_size > BATCH:
        pytest.skip(f"split size {split_size} > batch {BATCH} at {S.name} scale: one micro-batch, the same "
                    "step as test_model_parallel")
    m = dist.benchmark(tm.resnet_split_step, BATCH, S.image, split_size, 1000, ARCH, strategy="pipeline", group=GROUP,
                       params={"split_size": split_size}, global_batch=BATCH, single_process=True,
                       **S.bench_kwargs())
    assert m.task.processes == 1 and len(m.samples) >= 5
