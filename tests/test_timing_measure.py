"""dist.benchmark in real ranks: what is called how often, counts agreed between ranks, labels."""
import pytest

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
        if rank_context().rank == 1:
            raise RuntimeError("step broke on rank 1")
    return step

def counts(path, rank):
    text = open(os.path.join(path, f"rank{rank}.log")).read().split()
    return {w: text.count(w) for w in set(text)}
"""


def test_factory_runs_once_and_its_step_every_iteration(pytester, tmp_path):
    pytester.makepyfile(BODY + f"""
@pytest.mark.gpu2
def test_it(dist):
    m = dist.benchmark(factory, {str(tmp_path)!r}, 32, warmup=2, repeat=6, batch_size=64)
    assert len(m.samples) == 6 and [len(s) for s in m.rank_samples] == [6, 6]
    # each iteration's time is its slowest rank's
    assert m.samples == [max(a, b) for a, b in zip(*m.rank_samples)]
    assert m.warmup == 2 and m.throughput == pytest.approx(64 / m.median)
    assert m.task.processes == 2 and m.task.world_size == 2 and m.task.emulated
    assert len(m.peak_mem_bytes) == 2 and all(b is not None for b in m.peak_mem_bytes)
    for r in (0, 1):
        # setup once; 2 warmup + 6 timed + 1 untimed iteration for the CPU memory peak
        assert counts({str(tmp_path)!r}, r) == {{"setup": 1, "step": 9}}
    assert dist.measurements == [m]
""")
    pytester.runpytest("--mgpu-fallback=cpu").assert_outcomes(passed=1)


def test_a_function_that_returns_no_step_is_the_step(pytester, tmp_path):
    pytester.makepyfile(BODY + f"""
@pytest.mark.gpu1
def test_it(dist):
    m = dist.benchmark(plain_step, {str(tmp_path)!r}, 16, warmup=1, repeat=5)
    assert len(m.samples) == 5
    assert counts({str(tmp_path)!r}, 0) == {{"call": 1 + 1 + 5 + 1}}
""")
    pytester.runpytest("--mgpu-fallback=cpu").assert_outcomes(passed=1)


def test_calibrated_counts_agree_between_ranks(pytester, tmp_path):
    pytester.makepyfile(BODY + f"""
@pytest.mark.gpu2
def test_it(dist):
    m = dist.benchmark(factory, {str(tmp_path)!r}, 16, min_run_time=0.05)
    a, b = (counts({str(tmp_path)!r}, r)["step"] for r in (0, 1))
    assert a == b  # ranks that disagreed on the number of barriers would have hung
    assert 5 <= len(m.samples) <= 500 and m.warmup >= 2
    assert a == m.warmup + len(m.samples) + 1
""")
    pytester.runpytest("--mgpu-fallback=cpu").assert_outcomes(passed=1)


def test_single_process_labels_and_unique_names(pytester, tmp_path):
    pytester.makepyfile(BODY + f"""
@pytest.mark.gpu2
def test_it(dist):
    a = dist.benchmark(factory, {str(tmp_path)!r}, 8, warmup=0, repeat=5, single_process=True,
                       strategy="pipeline", group="g", params={{"split_size": 4}})
    b = dist.benchmark(factory, {str(tmp_path)!r}, 8, warmup=0, repeat=5, single_process=True,
                       strategy="pipeline", group="g", params={{"split_size": 4}})
    c = dist.benchmark(factory, {str(tmp_path)!r}, 8, warmup=0, repeat=5)
    assert a.task.processes == 1 and len(a.rank_samples) == 1 and a.task.world_size == 2
    assert (a.task.name, b.task.name, c.task.name) == ("pipeline", "pipeline#2", "factory")
    assert a.task.key.endswith("test_it::pipeline") and a.task.params == {{"split_size": 4}}
    assert c.task.group == "test_it" and c.task.strategy == "factory"
    assert "pipeline" in a.format() and "median" in a.format()
""")
    pytester.runpytest("--mgpu-fallback=cpu").assert_outcomes(passed=1)


def test_bad_arguments_and_a_failing_step(pytester):
    pytester.makepyfile(BODY + """
@pytest.mark.gpu2
def test_repeat_zero(dist):
    with pytest.raises(ValueError, match="repeat must be an integer >= 1"):
        dist.benchmark(failing_factory, repeat=0)

@pytest.mark.gpu2
def test_lambda(dist):
    dist.benchmark(lambda: None)

@pytest.mark.gpu2
def test_failing_step(dist):
    dist.benchmark(failing_factory, warmup=0, repeat=5)
""")
    result = pytester.runpytest("--mgpu-fallback=cpu")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*cannot send*lambda*", "*rank 1*RuntimeError: step broke on rank 1*"])
