"""dist.benchmark in real ranks: what is called how often, counts agreed between ranks, labels."""

BODY = """
import os, pytest, torch, pytest_mgpu
from pytest_mgpu import rank_context

def log(path, what):
    with open(os.path.join(path, f"rank{rank_context().rank}.log"), "a") as f:
        f.write(what + "\\n")

def factory(path, n):
    log(path, "setup")
    x = torch.randn(n, n)
    def step():
        log(path, "step")
        x @ x
    return step

def plain_step(path, n):
    log(path, "call")
    torch.randn(n, n) @ torch.randn(n, n)

def failing_factory():
    def step():
        raise RuntimeError(f"step broke on rank {rank_context().rank}")
    return step

def counts(path, rank):
    text = open(os.path.join(path, f"rank{rank}.log")).read().split()
    return {w: text.count(w) for w in set(text)}
"""


def test_benchmark_calls_counts_and_labels(pytester, tmp_path):
    """One inner session (each costs a rank pool's start), four inner tests."""
    pytester.makepyfile(BODY + f"PATH = {str(tmp_path)!r}\n" + """
@pytest.mark.gpu2
def test_factory_runs_once_and_its_step_every_iteration(dist):
    path = os.path.join(PATH, "factory")
    os.makedirs(path)
    m = dist.benchmark(factory, path, 32, warmup=2, repeat=6, batch_size=64)
    assert len(m.samples) == 6 and [len(s) for s in m.rank_samples] == [6, 6]
    # each iteration's time is its slowest rank's
    assert m.samples == [max(a, b) for a, b in zip(*m.rank_samples)]
    assert m.warmup == 2 and m.throughput == pytest.approx(64 / m.median)
    assert m.task.processes == 2 and m.task.world_size == 2 and m.task.emulated
    assert len(m.peak_mem_bytes) == 2 and all(b is not None for b in m.peak_mem_bytes)
    for r in (0, 1):
        # setup once; 2 untimed iterations under the profiler (the CPU memory peak), 2 warmup, 6 timed
        launches = 1 + m.remeasured  # an unstable measurement is launched once more
        assert counts(path, r) == {"setup": launches, "step": 10 * launches}
    assert dist.measurements == [m]

@pytest.mark.gpu1
def test_a_function_that_returns_no_step_is_the_step(dist):
    path = os.path.join(PATH, "plain")
    os.makedirs(path)
    m = dist.benchmark(plain_step, path, 16, warmup=1, repeat=5)
    assert len(m.samples) == 5
    assert counts(path, 0) == {"call": (1 + 2 + 1 + 5) * (1 + m.remeasured)}

@pytest.mark.gpu2
def test_calibrated_counts_agree_between_ranks(dist):
    path = os.path.join(PATH, "calibrated")
    os.makedirs(path)
    m = dist.benchmark(factory, path, 16, min_run_time=0.05)
    a, b = (counts(path, r)["step"] for r in (0, 1))
    assert a == b  # ranks that disagreed on the number of barriers would have hung
    assert 5 <= len(m.samples) <= 500 and m.warmup >= 2
    assert m.remeasured or a == 2 + m.warmup + len(m.samples)

@pytest.mark.gpu2
def test_single_process_labels_and_unique_names(dist):
    path = os.path.join(PATH, "single")
    os.makedirs(path)
    a = dist.benchmark(factory, path, 8, warmup=0, repeat=5, single_process=True,
                       strategy="pipeline", group="g", params={"split_size": 4})
    b = dist.benchmark(factory, path, 8, warmup=0, repeat=5, single_process=True,
                       strategy="pipeline", group="g", params={"split_size": 4})
    c = dist.benchmark(factory, path, 8, warmup=0, repeat=5)
    assert a.task.processes == 1 and len(a.rank_samples) == 1 and a.task.world_size == 2
    assert (a.task.name, b.task.name, c.task.name) == ("pipeline", "pipeline#2", "factory")
    assert a.task.key.endswith("test_single_process_labels_and_unique_names::pipeline")
    assert a.task.params == {"split_size": 4}
    assert c.task.group == "test_single_process_labels_and_unique_names" and c.task.strategy == "factory"
    assert "pipeline" in a.format() and "median" in a.format()
""")
    result = pytester.runpytest("--mgpu-fallback=cpu")
    result.assert_outcomes(passed=4)


def test_bad_arguments_and_a_failing_step(pytester):
    pytester.makepyfile(BODY + """
@pytest.mark.gpu2
def test_repeat_zero(dist):
    with pytest.raises(ValueError, match="repeat must be an integer >= 1"):
        dist.benchmark(failing_factory, repeat=0)

@pytest.mark.gpu2
def test_lambda(dist):  # a closure travels by value: it is benchmarked like a module-level step
    m = dist.benchmark(lambda: None, warmup=0, repeat=3)
    assert len(m.samples) == 3

@pytest.mark.gpu2
def test_failing_step(dist):
    dist.benchmark(failing_factory, warmup=0, repeat=5)
""")
    result = pytester.runpytest("--mgpu-fallback=cpu")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*rank 1*RuntimeError: step broke on rank 1*"])


def test_cpu_peak_memory_is_the_same_every_run(pytester, no_gpus):
    """Peak memory on CPU ranks comes from the torch profiler's allocation events, exact and the same
    for the same step in every run (issue 18: the sampled C heap read 2 MiB, then 27 MiB). The step
    holds a 1 MiB tensor and makes a 1 MiB product: the peak covers both, and no thread is left."""
    pytester.makepyfile("""
import warnings, pytest, torch, pytest_mgpu
from pytest_mgpu.launch.errors import RankLeftoverWarning

def square(n):
    x = torch.randn(n, n)
    def step():
        x @ x
    return step

@pytest.mark.gpu1
def test_twice(dist):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RankLeftoverWarning)
        a = dist.benchmark(square, 512, warmup=1, repeat=5)
        b = dist.benchmark(square, 512, warmup=1, repeat=5)
    assert a.peak_mem_bytes == b.peak_mem_bytes and a.peak_mem_bytes[0] >= 2 * 512 * 512 * 4
    assert "torch profiler" in a.mem_source
""")
    result = pytester.runpytest("--mgpu-fallback=cpu")
    result.assert_outcomes(passed=1)
