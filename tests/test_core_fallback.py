"""--mgpu-fallback: skip with a reason that says what to do, or run on emulated gloo CPU ranks."""
import pytest
import torch

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() >= 8, reason="these tests need a machine with fewer GPUs than the test asks for"
)

TEST = """
import pytest, torch.distributed as tdist

def info():
    return tdist.get_backend(), tdist.get_world_size()

@pytest.mark.gpu8
def test_eight(dist):
    assert dist.emulated and dist.backend == "gloo" and dist.device_type == "cpu"
    assert dist.run(info) == [("gloo", 8)] * 8
"""


def test_skip_is_default_and_says_what_to_do(pytester):
    pytester.makepyfile(TEST)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    found = torch.cuda.device_count()
    result.stdout.fnmatch_lines(
        [f"*needs 8 GPU(s), found {found} CUDA device(s); run it on 8 gloo CPU ranks with --mgpu-fallback=cpu*"]
    )


@pytest.mark.parametrize(
    "how",
    [
        ("option", ["--mgpu-fallback=cpu"], {}, ""),
        ("env", [], {"PYTEST_MGPU_FALLBACK": "cpu"}, ""),
        ("ini", [], {}, "[pytest]\nmgpu_fallback = cpu\n"),
    ],
    ids=lambda h: h[0],
)
def test_cpu_fallback_runs_emulated(pytester, monkeypatch, how):
    _, args, env, ini = how
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if ini:
        pytester.makefile(".ini", pytest=ini)
    pytester.makepyfile(TEST)
    result = pytester.runpytest("-v", *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_eight PASSED (emulated on cpu)*", "*1 emulated on CPU ranks (gloo)*"])


def test_option_beats_env(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_MGPU_FALLBACK", "cpu")
    pytester.makepyfile(TEST)
    pytester.runpytest("--mgpu-fallback=skip").assert_outcomes(skipped=1)


def test_bad_fallback_value_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_MGPU_FALLBACK", "gpu")
    pytester.makepyfile(TEST)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*must be one of skip, cpu, share, got 'gpu'*"])


def test_max_cpu_ranks_skips_with_reason(pytester):
    pytester.makepyfile(TEST)
    result = pytester.runpytest("--mgpu-fallback=cpu", "--mgpu-max-cpu-ranks=4", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*emulating 8 CPU ranks exceeds --mgpu-max-cpu-ranks=4*"])


def test_emulated_flag_reaches_junit(pytester):
    pytester.makepyfile(TEST)
    pytester.runpytest("--mgpu-fallback=cpu", "--junitxml=out.xml").assert_outcomes(passed=1)
    xml = (pytester.path / "out.xml").read_text()
    assert 'name="mgpu_emulated" value="True"' in xml
    assert 'name="mgpu_plan" value="8 x cpu (gloo, emulated)"' in xml
